"""No gradient path reaches a frozen vision tower in any training mode (LoRA or full fine-tune, with and
without activation checkpointing), while gradients reach the adapters, the merger and a trained tower; and
non-reentrant checkpointing gives the gradients of an unchecked step (the tiny model, float32)."""

from __future__ import annotations

import pytest
import torch

from keyshot.train.label_loss import label_position_loss
from keyshot.train.scorer_model import INPUT_GRAD_HOOKS, ModelSetupError, load_scorer_model
from keyshot.train.train_config import LoraSettings, ModelSettings
from tests.support.scorer_batch import scorer_batch

MODES = [
    pytest.param(
        lora,
        checkpointing,
        tower,
        id=f"{'lora' if lora else 'full'}-ckpt{int(checkpointing)}-tower{int(tower)}",
    )
    for lora in (False, True)
    for checkpointing in (False, True)
    for tower in (False, True)
    if not (lora and tower)
]


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return scorer_batch(tiny_model_dir)


def _settings(model_dir, lora: bool, checkpointing: bool, tower: bool) -> ModelSettings:
    return ModelSettings(
        name_or_path=str(model_dir),
        dtype="float32",
        attn_implementation="sdpa",
        gradient_checkpointing=checkpointing,
        train_vision_tower=tower,
        lora=LoraSettings(enabled=lora, r=4, alpha=8),
    )


def _visual(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.visual


@pytest.mark.parametrize(("lora", "checkpointing", "tower"), MODES)
def test_no_gradient_path_into_a_frozen_tower(tiny_model_dir, batch, lora, checkpointing, tower):
    model = load_scorer_model(_settings(tiny_model_dir, lora, checkpointing, tower))
    visual = _visual(model)
    left = [
        (name, hook.__name__)
        for name, module in model.named_modules()
        for hook in module._forward_hooks.values()
        if getattr(hook, "__name__", "") in INPUT_GRAD_HOOKS
    ]
    assert left == []  # transformers' and peft's input-gradient hooks (1 or 2 on patch_embed before)
    if not tower:
        assert not visual.patch_embed._forward_hooks
        assert not any(block.gradient_checkpointing for block in visual.blocks)  # nothing to recompute
    outputs: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda _m, _a, out: outputs.append(out)) for b in visual.blocks]
    handles.append(visual.patch_embed.register_forward_hook(lambda _m, _a, out: outputs.append(out)))
    model.train()
    label_position_loss(model, batch).backward()
    for handle in handles:
        handle.remove()
    assert len(outputs) == len(visual.blocks) + 1  # each ran once: no recompute of the tower
    tower_params = [(n, p) for n, p in visual.named_parameters() if not n.startswith("merger.")]
    if tower:
        assert all(out.grad_fn is not None for out in outputs)
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in tower_params)
    else:
        assert all(out.grad_fn is None for out in outputs)
        assert all(p.grad is None for _, p in tower_params)
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if lora:
        assert trained and all("lora_" in n for n in trained)
        lora_b = [p for n, p in trained.items() if "lora_B" in n]  # lora_A's gradient is 0 while B is 0
        assert lora_b and all(p.grad is not None and p.grad.abs().sum() > 0 for p in lora_b)
    else:
        merger = [p for n, p in trained.items() if ".visual.merger." in f".{n}"]
        assert merger and all(p.grad is not None and p.grad.abs().sum() > 0 for p in merger)
        assert all(p.grad is not None for p in trained.values())


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_checkpointing_gives_the_unchecked_gradients(tiny_model_dir, batch, lora):
    """Non-reentrant checkpointing with no input asking for a gradient: the same gradients as without it."""
    grads = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the same LoRA initialisation for both
        model = load_scorer_model(_settings(tiny_model_dir, lora, checkpointing, False))
        with torch.no_grad():  # B = 0 at initialisation would leave A's gradient at 0
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
        model.train()
        label_position_loss(model, batch).backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    unchecked, checked = grads
    assert unchecked.keys() == checked.keys() and all(g is not None for g in checked.values())
    assert any(g.abs().sum() > 0 for n, g in checked.items() if "lora_A" in n or not lora)
    for name, g in checked.items():
        torch.testing.assert_close(g, unchecked[name], rtol=1e-5, atol=1e-6, msg=name)


def test_lora_refuses_to_train_the_tower(tiny_model_dir):
    with pytest.raises(ModelSetupError, match="train_vision_tower"):
        load_scorer_model(_settings(tiny_model_dir, True, False, True))
