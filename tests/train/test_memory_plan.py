"""Checkpointing only the micro-batches above ``model.unchecked_token_cap`` (keyshot.train.memory_plan), and
the recipe's one training step that applies it (keyshot.train.step): what the plan says before a run, which
layers a step recomputes, the same gradients either way, the optimizer stepped once per accumulation."""

from __future__ import annotations

import pytest
import torch

from keyshot.infer.common.config import ConfigError
from keyshot.train.memory_plan import CheckpointPlan, batch_token_slots, describe_plan
from keyshot.train.step import build_optimizer, train_step
from keyshot.train.train_config import ModelSettings, TrainConfig
from tests.support.tiny_model import load_tiny, prepare_seeded, tiny_settings


def test_the_plan_says_which_micro_batches_are_checkpointed_and_why():
    lengths = [300, 400, 600, 701]
    batches = [[0, 1], [2, 3]]  # padded to 8: 2 × 400 = 800 and 2 × 704 = 1,408 token slots
    assert [batch_token_slots(b, lengths, 8) for b in batches] == [800, 1408]
    capped = ModelSettings(checkpoint_every=2, unchecked_token_cap=1000)
    assert describe_plan(capped, batches, lengths, 8) == (
        "activation checkpointing of decoder layers 0, 2, 4, ... (model.checkpoint_every=2) on the 1 of 2 "
        "micro-batches above model.unchecked_token_cap=1,000 token slots (the largest: 2 rows × 704 = 1,408); "
        "the other 1 run without checkpointing"
    )
    roomy = ModelSettings(unchecked_token_cap=2048)
    assert describe_plan(roomy, batches, lengths, 8).startswith(
        "no activation checkpointing: every micro-batch fits model.unchecked_token_cap=2,048 token slots"
    )
    assert "on every micro-batch" in describe_plan(ModelSettings(), batches, lengths, 8)
    assert describe_plan(ModelSettings(gradient_checkpointing=False), batches, lengths, 8).startswith(
        "no activation checkpointing (model.gradient_checkpointing=false)"
    )


def test_a_cap_needs_checkpointing_to_fall_back_on():
    with pytest.raises(
        ConfigError, match=r"^model.unchecked_token_cap needs model.gradient_checkpointing=true"
    ):
        ModelSettings(gradient_checkpointing=False, unchecked_token_cap=4096)
    with pytest.raises(ConfigError, match=r"^model.unchecked_token_cap must be >= 1"):
        ModelSettings(unchecked_token_cap=0)
    assert CheckpointPlan.for_model(torch.nn.Linear(2, 2), ModelSettings()) is None  # no cap: no plan


def _run(tiny_model_dir, batch, cap: int, accumulation: int = 1):
    """Steps of the recipe's train_step on the tiny model under ``cap``: (per step: result, forward runs of
    each decoder layer, its recompute included), the model and its plan."""
    from accelerate import Accelerator

    settings = tiny_settings(
        tiny_model_dir, gradient_checkpointing=True, checkpoint_every=2, unchecked_token_cap=cap
    )
    model = prepare_seeded(load_tiny(tiny_model_dir), settings).train()
    plan = CheckpointPlan.for_model(model, settings)
    calls = [0] * len(plan.layers)
    for index, layer in enumerate(plan.layers):
        # inside the layer's forward (transformers checkpoints ``forward``, the layer's own hooks stay outside)
        layer.mlp.register_forward_pre_hook(
            lambda *_a, index=index: calls.__setitem__(index, calls[index] + 1)
        )
    accelerator = Accelerator(cpu=True, mixed_precision="no", gradient_accumulation_steps=accumulation)
    prepared, optimizer = accelerator.prepare(model, build_optimizer(model, TrainConfig(model=settings)))
    trainable = [p for p in prepared.parameters() if p.requires_grad]
    steps = []
    for _ in range(accumulation):
        calls[:] = [0] * len(calls)
        result = train_step(
            accelerator, prepared, optimizer, batch, trainable=trainable, max_grad_norm=1.0, memory=plan
        )
        steps.append((result, list(calls)))
    return steps, model, plan


def test_a_micro_batch_above_the_cap_is_checkpointed_and_one_within_is_not(tiny_model_dir, batch):
    slots = batch["input_ids"].numel()
    for cap, recomputed in ((slots, [1, 1]), (slots - 1, [2, 1])):  # layer 0 of 2 checkpointed above the cap
        steps, model, plan = _run(tiny_model_dir, batch, cap, accumulation=2)
        assert [calls for _, calls in steps] == [recomputed, recomputed], cap
        assert [layer.gradient_checkpointing for layer in plan.layers] == [cap < slots, False]
        first, second = (result for result, _ in steps)
        assert not first.optimizer_stepped and first.grad_norm is None  # accumulating: no optimizer step yet
        assert second.optimizer_stepped and second.grad_norm is not None and torch.isfinite(second.loss)


def test_checkpointed_or_not_a_step_makes_the_same_update(tiny_model_dir, batch):
    slots = batch["input_ids"].numel()
    outcomes = []
    for cap in (slots, slots - 1):  # the same micro-batch within the cap, then above it
        steps, model, _ = _run(tiny_model_dir, batch, cap)
        ((result, _),) = steps
        assert result.optimizer_stepped
        weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        outcomes.append((result.loss, weights))
    (loss, weights), (checked_loss, checked_weights) = outcomes
    torch.testing.assert_close(checked_loss, loss, rtol=1e-6, atol=1e-6)
    assert weights.keys() == checked_weights.keys() and weights
    for name in weights:
        torch.testing.assert_close(checked_weights[name], weights[name], rtol=1e-6, atol=1e-6, msg=name)


def test_the_shipped_lora_config_checkpoints_only_the_micro_batches_above_its_cap():
    """configs/train/webjudge7b_lora.yaml: micro-batches of 4 screenshot rows (~1,700 tokens) run without
    checkpointing; 4 rows of 4,096 tokens (data.max_length) checkpoint every second decoder layer."""
    from keyshot.infer.common.config import load_config
    from tests.support import paths

    cfg = load_config(TrainConfig, paths.REPO / "configs/train/webjudge7b_lora.yaml")
    model = cfg.model
    assert (model.gradient_checkpointing, model.checkpoint_every, model.unchecked_token_cap) == (
        True,
        2,
        8192,
    )
    lengths = [1716] * 4 + [cfg.data.max_length] * 4
    line = describe_plan(model, [[0, 1, 2, 3], [4, 5, 6, 7]], lengths, cfg.data.pad_to_multiple_of)
    assert "on the 1 of 2 micro-batches above model.unchecked_token_cap=8,192 token slots" in line
    assert "(the largest: 4 rows × 4,096 = 16,384)" in line
