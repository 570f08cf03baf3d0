"""The tiny Qwen2.5-VL: processor + chat template + forward/backward + generate, offline."""

from __future__ import annotations

import torch
from PIL import Image

from keyshot.infer.model.tiny_model import TINY_MAX_PIXELS, build_tiny_qwen25vl
from keyshot.infer.protocol.messages import scorer_answer, scorer_example
from keyshot.infer.protocol.prompts import load_prompt_set


def load(model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    return AutoProcessor.from_pretrained(model_dir), AutoModelForImageTextToText.from_pretrained(model_dir)


def test_build_is_deterministic(tmp_path, tiny_model_dir):
    again = build_tiny_qwen25vl(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (tiny_model_dir / name).read_bytes(), name


def test_processor_template_forward_backward_generate(tiny_model_dir):
    processor, model = load(tiny_model_dir)
    assert type(model).__name__ == "Qwen2_5_VLForConditionalGeneration"
    prompts = load_prompt_set()
    image = Image.new("RGB", (1280, 720), (200, 30, 30))
    turns = scorer_example(prompts, "Buy an iPad", "1. Buy an iPad", scorer_answer("An order page.", 4))
    text = processor.apply_chat_template(turns, tokenize=False)
    assert text.count("<|image_pad|>") == 1 and text.startswith("<|im_start|>system\n")
    batch = processor(text=[text], images=[image], return_tensors="pt")
    # Pixel bounds in Qwen terms: 1280×720 under max_pixels=64·28² gives a grid of 12×20 patches = 60 tokens.
    grid = batch["image_grid_thw"][0].tolist()
    n_image_tokens = int((batch["input_ids"] == model.config.image_token_id).sum())
    assert n_image_tokens == grid[0] * grid[1] * grid[2] // 4
    assert n_image_tokens * 28 * 28 <= TINY_MAX_PIXELS

    labels = batch["input_ids"].clone()
    out = model(**batch, labels=labels)
    assert torch.isfinite(out.loss) and 5.0 < out.loss.item() < 9.0  # ≈ ln(vocab) for random weights
    out.loss.backward()
    vision_grads = [p.grad for n, p in model.named_parameters() if "visual" in n and p.grad is not None]
    assert vision_grads and all(torch.isfinite(g).all() for g in vision_grads)

    prompt = processor.apply_chat_template(turns[:2], tokenize=False, add_generation_prompt=True)
    inputs = processor(text=[prompt], images=[image], return_tensors="pt")
    generated = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 6 or generated[0, -1] in (
        model.generation_config.eos_token_id
    )


def test_special_tokens_follow_the_bpe_vocabulary(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image_pad|>"])
    assert ids == sorted(ids) and min(ids) >= 1000
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    # The prompts tokenise compactly (the BPE was trained on them): the scorer system prompt is ~2k chars.
    system = load_prompt_set().system("key_screenshot")
    assert len(tok(system).input_ids) < len(system) / 4


def test_building_leaves_the_process_environment_as_it_was(tmp_path, monkeypatch):
    """The save sets DS_ACCELERATOR=cpu for DeepSpeed's import and takes it back: a CUDA run of the same
    process (a test, bench/gpu.py) that built the tiny model still finds its accelerator."""
    import os

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    build_tiny_qwen25vl(tmp_path / "model", seed=1)
    assert "DS_ACCELERATOR" not in os.environ
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    build_tiny_qwen25vl(tmp_path / "again", seed=1)
    assert os.environ["DS_ACCELERATOR"] == "cpu"
