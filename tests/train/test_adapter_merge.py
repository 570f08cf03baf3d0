"""Folding a LoRA adapter into its base model (keyshot.train.adapter_merge): the library the recipe and
``keyshot merge-lora`` call; the command module only wires."""

from __future__ import annotations

import inspect

import pytest
import torch

from keyshot.infer.model.checkpoint import CheckpointError, read_meta
from keyshot.train import adapter_merge, merge_lora


def test_the_command_only_wires_the_library():
    defined = sorted(
        name
        for name, f in inspect.getmembers(merge_lora, inspect.isfunction)
        if f.__module__ == merge_lora.__name__
    )
    assert defined == ["add_arguments", "run"]
    assert merge_lora.merge_adapter is adapter_merge.merge_adapter


def test_a_merged_adapter_scores_as_the_adapter_did(tiny_model_dir, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(0)
    model = get_peft_model(
        AutoModelForImageTextToText.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    model.save_pretrained(tmp_path / "adapter")
    with pytest.raises(CheckpointError, match="no keyshot.json .*pass --prompt-variant"):
        adapter_merge.merge_adapter(tmp_path / "adapter", tmp_path / "merged")
    merged = adapter_merge.merge_adapter(
        tmp_path / "adapter", tmp_path / "merged", prompt_variant="online_mind2web"
    )
    assert read_meta(merged).extra["merged_adapter"] == str(tmp_path / "adapter")
    ids = torch.tensor([[11, 12, 13, 14, 15]])
    with torch.no_grad():
        want = model(input_ids=ids).logits
        got = AutoModelForImageTextToText.from_pretrained(merged)(input_ids=ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(CheckpointError, match="no adapter_config.json"):
        adapter_merge.merge_adapter(tmp_path, tmp_path / "x")
