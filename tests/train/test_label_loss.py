"""The recipe's loss computes logits at the labelled positions only and equals transformers' own loss to the
last bit (float32, the tiny model), for a full fine-tune and through peft's LoRA wrapper."""

from __future__ import annotations

import pytest
import torch

from keyshot.train.label_loss import label_position_loss, label_positions
from keyshot.train.scorer_model import load_scorer_model
from keyshot.train.train_config import LoraSettings, ModelSettings
from tests.support.scorer_batch import scorer_batch


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return scorer_batch(tiny_model_dir)


def test_label_positions_are_the_tokens_before_each_label():
    labels = torch.tensor([[-100, -100, 7, 8, -100], [-100, 5, -100, -100, -100]])
    keep, targets = label_positions(labels)
    assert keep.tolist() == [[False, True, True, False, False], [True, False, False, False, False]]
    assert targets.tolist() == [7, 8, 5]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_loss_equals_transformers_to_the_last_bit(tiny_model_dir, batch, lora):
    settings = ModelSettings(
        name_or_path=str(tiny_model_dir),
        dtype="float32",
        attn_implementation="sdpa",
        lora=LoraSettings(enabled=lora, r=4, alpha=8),
    )
    torch.manual_seed(0)
    model = load_scorer_model(settings)
    model.train()
    head = (model.get_base_model() if lora else model).lm_head
    rows: list[int] = []
    handle = head.register_forward_hook(
        lambda _m, args, _out: rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
    )
    with torch.no_grad():
        want = model(**batch).loss
        got = label_position_loss(model, batch)
    handle.remove()
    labelled = int((batch["labels"] != -100).sum())
    length = batch["input_ids"].numel()
    assert labelled > 10 and length > 20 * labelled  # an answer among a long prompt, as the scorer's rows
    assert rows == [length, labelled]  # transformers' head ran on every position, ours on the labelled ones
    assert got.dtype == want.dtype == torch.float32
    assert torch.equal(got, want), (got.item(), want.item())
    trained = [p for p in model.parameters() if p.requires_grad]
    want_grads = torch.autograd.grad(model(**batch).loss, trained)
    got_grads = torch.autograd.grad(label_position_loss(model, batch), trained)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-7)
