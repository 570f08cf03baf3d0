"""The tiny Qwen2.5-VL as the training and vision-tower tests set it up: the model loaded in fp32 with sdpa,
prepared for training with seeded LoRA matrices, a labelled two-row batch (the ``batch`` fixture, which
tests/conftest.py offers every module), the tower's inputs for screenshots of given sizes, and a made-up
model's sizes for the FLOPs counter (``FLOPS_ARGS``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from keyshot.train.scorer_model import prepare_for_training
from keyshot.train.train_config import ModelSettings

# a made-up model's sizes for keyshot.train.throughput.FlopsModel
FLOPS_ARGS = dict(
    llm_params=1000,
    llm_layers=2,
    llm_hidden=64,
    vision_params=500,
    vision_layers=2,
    vision_full_layers=1,
    vision_hidden=64,
    window_patches=16,
    merger_params=100,
    merge_unit=4,
    llm_factor=3.0,
    vision_factor=1.0,
    merger_factor=3.0,
)


def load_tiny(tiny_model_dir, dtype=torch.float32, device="cpu"):
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(
        tiny_model_dir, dtype=dtype, attn_implementation="sdpa"
    ).to(device)


def prepare_seeded(model, settings: ModelSettings):
    torch.manual_seed(0)  # LoRA's random A matrices: the same in the model and its reference
    return prepare_for_training(model, settings)


def tiny_settings(tiny_model_dir, **kw) -> ModelSettings:
    kw = {"dtype": "float32", "gradient_checkpointing": False, **kw}
    return ModelSettings(name_or_path=str(tiny_model_dir), attn_implementation="sdpa", **kw)


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    """Two right-padded rows of unequal length, one screenshot each (two sizes), the answer labelled."""
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_model_dir)
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in [(640, 360), (300, 500)]
    ]
    texts = [
        processor.apply_chat_template(
            [
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]},
                {"role": "assistant", "content": answer},
            ],
            tokenize=False,
        )
        for prompt, answer in [
            ("Is the task done?", "Score: 4"),
            ("Rate this page for the goal: buy a red shoe", "3"),
        ]
    ]
    out = processor(text=texts, images=images, padding=True, padding_side="right", return_tensors="pt")
    labels = torch.full_like(out["input_ids"], -100)
    for row, length in enumerate(out["attention_mask"].sum(-1).tolist()):
        labels[row, length - 4 : length] = out["input_ids"][row, length - 4 : length]
    assert out["attention_mask"][0].sum() != out["attention_mask"][1].sum()  # one row is padded
    return {**out, "labels": labels}


def vision_inputs(model_dir, sizes, max_pixels):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)) for w, h in sizes]
    batch = processor.image_processor(images=images, return_tensors="pt", max_pixels=max_pixels)
    return batch["pixel_values"], batch["image_grid_thw"]


def pooled(out):
    return out.pooler_output if hasattr(out, "pooler_output") else out
