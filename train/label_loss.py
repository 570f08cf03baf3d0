"""The scorer's training loss with logits only where the loss is: the labelled positions.

A scorer row labels only its answer (a few dozen tokens of up to 4,096), yet a causal LM's forward runs
``lm_head`` over every position and the loss then ignores all but the labelled ones: about 7% of the 7B
language model's FLOPs, and a float32 (batch, length, 152k) logits tensor of gigabytes at micro-batch 4.
:func:`label_position_loss` asks the model for logits only at the positions whose next token is labelled
(transformers' ``logits_to_keep`` with a boolean mask: ``lm_head`` runs on those hidden states alone) and
takes the cross-entropy there: the mean over labelled tokens, as transformers' own loss, and equal to it
to the last bit in float32 on the tiny model (tests/train/test_label_loss.py). The call goes through the
model's own forward, so DDP, DeepSpeed and peft wrappers run as they do for ``model(**batch).loss``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from keyshot.infer.protocol.chat_template import IGNORE_INDEX


def label_positions(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(where to compute logits, the tokens they predict): position t predicts token t + 1, so ``keep`` is
    True where the next label is not ``IGNORE_INDEX``; ``targets`` are those labels in row-major order."""
    following = F.pad(labels[:, 1:], (0, 1), value=IGNORE_INDEX)
    keep = following != IGNORE_INDEX
    return keep, following[keep]


def label_position_loss(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Mean cross-entropy over the labelled tokens of ``batch`` (a collated scorer batch with ``labels``),
    with ``lm_head`` run at those positions only. The recipe's training and evaluation step."""
    keep, targets = label_positions(batch["labels"])
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    logits = model(**inputs, logits_to_keep=keep).logits  # (labelled positions, vocab)
    picked = F.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])
    # The mean is reduced over every position of the batch in the order transformers' cross-entropy
    # reduces it (zeros where nothing is labelled): the same float32 sum, so the same loss to the last bit.
    flat = keep.reshape(-1, 1)
    per_position = picked.new_zeros(flat.shape).masked_scatter(flat, picked)
    return F.nll_loss(per_position, torch.where(flat[:, 0], 0, IGNORE_INDEX), ignore_index=IGNORE_INDEX)
