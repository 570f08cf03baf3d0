"""LoRA's measured defaults (dropout 0; bf16 activations into float32 adapters under autocast) and the peft
patch behind the second: applied once however often called, and said when peft no longer has what it patches."""

from __future__ import annotations

import pytest
import torch

from keyshot.infer.common.config import load_config
from keyshot.train.scorer_model import keep_input_dtype_under_autocast, load_scorer_model
from keyshot.train.train_config import LoraSettings, ModelSettings, TrainConfig
from tests.support import paths

REPO = paths.REPO


def test_the_measured_defaults_and_the_7b_lora_config():
    assert LoraSettings().dropout == 0.0 and LoraSettings().keep_input_dtype
    lora = load_config(TrainConfig, REPO / "configs/train/webjudge7b_lora.yaml").model.lora
    assert lora.enabled and lora.dropout == 0.0 and lora.keep_input_dtype


def _lora_model(model_dir, dtype: str = "bfloat16", **lora):
    """The tiny model with r=4 adapters (``lora``: more LoraSettings), without checkpointing."""
    settings = ModelSettings(
        name_or_path=str(model_dir),
        dtype=dtype,
        attn_implementation="sdpa",
        gradient_checkpointing=False,
        lora=LoraSettings(enabled=True, r=4, alpha=8, **lora),
    )
    return load_scorer_model(settings)


def _adapter_input_dtypes(model) -> set[torch.dtype]:
    from peft.tuners.lora.layer import Linear as LoraLinear

    seen: list[torch.dtype] = []
    layer = next(m for m in model.modules() if isinstance(m, LoraLinear))
    handle = next(iter(layer.lora_A.values())).register_forward_pre_hook(
        lambda _m, a: seen.append(a[0].dtype)
    )
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.tensor([[5, 6, 7, 8]]))
    handle.remove()
    return set(seen)


def test_the_cast_patch_applies_once_and_can_be_switched_off(tiny_model_dir):
    model = _lora_model(tiny_model_dir)
    layers = [m for m in model.modules() if "_cast_input_dtype" in m.__dict__]
    patched = {id(m): m.__dict__["_cast_input_dtype"] for m in layers}
    assert layers and keep_input_dtype_under_autocast(model) == len(layers)  # again: nothing new
    assert {id(m): m.__dict__["_cast_input_dtype"] for m in layers} == patched
    assert _adapter_input_dtypes(model) == {torch.bfloat16}
    assert _adapter_input_dtypes(_lora_model(tiny_model_dir, keep_input_dtype=False)) == {
        torch.float32
    }  # peft's cast


def test_the_cast_patch_says_when_peft_changed(tiny_model_dir, monkeypatch, caplog):
    from peft.tuners.tuners_utils import BaseTunerLayer

    model = _lora_model(tiny_model_dir, keep_input_dtype=False)
    monkeypatch.setattr(
        BaseTunerLayer, "_cast_input_dtype", lambda self, x, dtype, copy=False: x, raising=True
    )
    with caplog.at_level("WARNING"):
        assert keep_input_dtype_under_autocast(model) == 0
    assert any("_cast_input_dtype" in r.getMessage() for r in caplog.records)
    monkeypatch.delattr(BaseTunerLayer, "_cast_input_dtype")
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert keep_input_dtype_under_autocast(model) == 0
    assert any("nothing patched" in r.getMessage() for r in caplog.records)
    assert keep_input_dtype_under_autocast(torch.nn.Linear(2, 2)) == 0  # no LoRA layer: nothing to say


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_dropout_zero_is_no_module(tiny_model_dir, dropout):
    """peft runs no dropout module at 0 (an identity): the activation is not copied through a mask."""
    model = _lora_model(tiny_model_dir, "float32", dropout=dropout)
    kinds = {
        type(d).__name__
        for m in model.modules()
        if hasattr(m, "lora_dropout")
        for d in m.lora_dropout.values()
    }
    assert kinds == ({"Identity"} if dropout == 0 else {"Dropout"})
