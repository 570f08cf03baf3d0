"""Which micro-batches are checkpointed: activation checkpointing only where a micro-batch needs it.

Without checkpointing a step is fastest (on an H200 at the 7B shape a LoRA step took 0.72x the full
fine-tune's, bench/RESULTS-gpu.md), but the activations it keeps grow with the micro-batch's tokens. With
``model.unchecked_token_cap: N`` (and ``model.gradient_checkpointing: true``) a micro-batch of at most N token
slots (its rows × its longest row, padding included: the tensors the step holds) runs without
checkpointing, and a larger one is checkpointed on every ``model.checkpoint_every``-th decoder layer. The
token slots of every micro-batch are known before the model loads: the length plan renders each row at its
planned length (docs/architecture.md, "One renderer") and the batch sampler fixes which rows meet, so
:func:`describe_plan` says before the run what it will do and why, and the step holds no micro-batch above
the cap without checkpointing. Without a cap, the checkpointing set up when the model was prepared is used
for every micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from keyshot.train.speedups import checkpointed_layers, decoder_layers
from keyshot.train.train_config import ModelSettings


def batch_token_slots(rows: Sequence[int], lengths: Sequence[int], pad_to_multiple_of: int | None) -> int:
    """The token slots of a micro-batch of ``rows`` as the collator pads it: rows × the longest, rounded up
    to ``pad_to_multiple_of``."""
    longest = max(lengths[i] for i in rows)
    if pad_to_multiple_of:
        longest = math.ceil(longest / pad_to_multiple_of) * pad_to_multiple_of
    return len(rows) * longest


@dataclass
class CheckpointPlan:
    """Checkpointing per micro-batch: none at or below ``cap`` token slots, every ``every``-th decoder layer
    above it. ``layers`` are the language model's decoder layers (those of the unwrapped model)."""

    layers: list[torch.nn.Module]
    cap: int
    every: int

    @classmethod
    def for_model(cls, model: torch.nn.Module, settings: ModelSettings) -> CheckpointPlan | None:
        """The plan of ``settings`` for a prepared model, or None where no cap is set (the checkpointing set
        up at preparation then holds for every micro-batch)."""
        if settings.unchecked_token_cap is None:
            return None
        return cls(list(decoder_layers(model)), settings.unchecked_token_cap, settings.checkpoint_every)

    def checkpointed(self, token_slots: int) -> bool:
        return token_slots > self.cap

    def layers_checkpointed(self, token_slots: int) -> list[bool]:
        """Per decoder layer, whether a micro-batch of ``token_slots`` checkpoints it."""
        on = self.checkpointed(token_slots)
        return [on and flag for flag in checkpointed_layers(len(self.layers), self.every)]

    def apply(self, batch: dict[str, torch.Tensor]) -> bool:
        """Set the decoder layers' checkpointing for ``batch``; returns whether it is checkpointed."""
        slots = batch["input_ids"].numel()
        for layer, flag in zip(self.layers, self.layers_checkpointed(slots), strict=True):
            layer.gradient_checkpointing = flag
        return self.checkpointed(slots)


def describe_plan(
    settings: ModelSettings,
    batches: Iterable[Sequence[int]],
    lengths: Sequence[int],
    pad_to_multiple_of: int | None,
) -> str:
    """What the run's checkpointing will be and why, in one line, from the planned lengths of the rows and
    the micro-batches the sampler makes of them (one epoch's)."""
    every = settings.checkpoint_every
    layers = (
        "every decoder layer"
        if every == 1
        else f"decoder layers 0, {every}, {2 * every}, ... (model.checkpoint_every={every})"
    )
    if not settings.gradient_checkpointing:
        return "no activation checkpointing (model.gradient_checkpointing=false): activations grow with the micro-batch"
    if settings.unchecked_token_cap is None:
        return f"activation checkpointing of {layers} on every micro-batch (no model.unchecked_token_cap)"
    cap = settings.unchecked_token_cap
    slots = [(batch_token_slots(rows, lengths, pad_to_multiple_of), len(rows)) for rows in batches]
    if not slots:
        return f"no micro-batch planned (model.unchecked_token_cap={cap:,})"
    above = [s for s, _ in slots if s > cap]
    largest, rows = max(slots)
    if not above:
        return (
            f"no activation checkpointing: every micro-batch fits model.unchecked_token_cap={cap:,} token slots "
            f"(the largest: {rows} rows × {largest // rows:,} = {largest:,})"
        )
    return (
        f"activation checkpointing of {layers} on the {len(above)} of {len(slots)} micro-batches above "
        f"model.unchecked_token_cap={cap:,} token slots (the largest: {rows} rows × {largest // rows:,} = "
        f"{largest:,}); the other {len(slots) - len(above)} run without checkpointing"
    )
