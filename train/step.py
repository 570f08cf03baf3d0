"""The recipe's training step and its optimizer: what ``train/recipe.py`` runs and ``bench/gpu.py`` measures.

One micro-batch under accelerate's gradient accumulation: the memory plan's checkpointing for the batch's
size (:mod:`keyshot.train.memory_plan`), the loss with logits at the labelled positions only
(:func:`keyshot.train.label_loss.label_position_loss`), the backward, and on the last micro-batch of an
accumulation the clipped optimizer step (accelerate skips the optimizer's step and zeroing on the others, so
the optimizer's cost is paid once per ``gradient_accumulation_steps`` micro-batches). A benchmark that
measures the recipe calls :func:`train_step` itself, never a copy of it; ``phase`` lets it time the step's
parts, ``phase("forward")``, ``phase("backward")`` and ``phase("optimizer")`` (the recipe passes none).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from keyshot.train.label_loss import label_position_loss
from keyshot.train.memory_plan import CheckpointPlan
from keyshot.train.scorer_model import parameter_groups
from keyshot.train.train_config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """The recipe's AdamW over :func:`~keyshot.train.scorer_model.parameter_groups` (decay and no-decay, the
    trained tower at ``lr × vision_lr_scale``), with torch's default implementation for the device."""
    return torch.optim.AdamW(
        parameter_groups(model, cfg.optim, cfg.model.vision_lr_scale),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
    )


@dataclass
class StepResult:
    loss: torch.Tensor  # detached, on the model's device
    grad_norm: torch.Tensor | float | None  # the clipped gradients' norm at an optimizer step, else None
    optimizer_stepped: bool  # the last micro-batch of an accumulation


def _no_phase(_name: str):
    return contextlib.nullcontext()


def train_step(
    accelerator: Any,
    model: torch.nn.Module,
    optimizer: Any,
    batch: dict[str, torch.Tensor],
    *,
    trainable: list[torch.nn.Parameter],
    max_grad_norm: float,
    memory: CheckpointPlan | None = None,
    phase: Callable[[str], contextlib.AbstractContextManager] = _no_phase,
) -> StepResult:
    """One micro-batch of the recipe: forward, backward and, on the last of an accumulation, the clipped
    optimizer step. ``model`` and ``optimizer`` are what ``accelerator.prepare`` returned."""
    with accelerator.accumulate(model):
        if memory is not None:
            memory.apply(batch)
        with phase("forward"):
            loss = label_position_loss(model, batch)  # lm_head at the labelled positions only
        with phase("backward"):
            accelerator.backward(loss)
        stepped = accelerator.sync_gradients
        with phase("optimizer"):
            grad_norm = accelerator.clip_grad_norm_(trainable, max_grad_norm) if stepped else None
            optimizer.step()
            optimizer.zero_grad()
    return StepResult(loss.detach(), grad_norm, stepped)
