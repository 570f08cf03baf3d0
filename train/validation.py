"""Validation during training: loss, and score quality from greedy generation on a fixed sample.

Every rank evaluates its share; shares are padded to equal length (padding items are run and
discarded) so collective ops — ZeRO-3 parameter gathers inside ``generate`` included — stay in step.
Scores are read with ``keyshot.infer.protocol.parsing.parse_score`` (strict): an unparseable answer counts as a miss.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.protocol.chat_template import IGNORE_INDEX
from keyshot.infer.protocol.parsing import parse_score
from keyshot.train.batches import ScorerCollator, ScorerDataset
from keyshot.train.label_loss import label_position_loss

logger = logging.getLogger(__name__)


def padded_shard(items: Sequence, rank: int, world: int) -> list[tuple[object, bool]]:
    """Rank ``rank``'s items as ``(item, real)``; every rank gets ``ceil(n / world)`` (repeats are not real)."""
    per_rank = math.ceil(len(items) / world) if items else 0
    mine = list(items[rank::world])
    out = [(x, True) for x in mine]
    while len(out) < per_rank:
        out.append((items[0], False))
    return out


def score_metrics(predictions: Sequence[int | None], targets: Sequence[int], key_threshold: int = 3) -> dict:
    """Exact match (invalid = miss), MAE over valid answers, precision/recall/F1 of score >= key_threshold."""
    n = len(targets)
    valid = [(p, t) for p, t in zip(predictions, targets, strict=True) if p is not None]
    tp = sum(1 for p, t in valid if p >= key_threshold and t >= key_threshold)
    predicted = sum(1 for p, _ in valid if p >= key_threshold)
    actual = sum(1 for t in targets if t >= key_threshold)
    precision = tp / predicted if predicted else None
    recall = tp / actual if actual else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else None
    return {
        "samples": n,
        "valid_rate": len(valid) / n if n else None,
        "score_exact_match": sum(1 for p, t in valid if p == t) / n if n else None,
        "score_mae": float(np.mean([abs(p - t) for p, t in valid])) if valid else None,
        "key_precision": precision,
        "key_recall": recall,
        "key_f1": f1,
    }


@torch.no_grad()
def eval_loss(accelerator, model, dataset: ScorerDataset, collator: ScorerCollator, batch_size: int) -> float:
    """Token-weighted mean loss over ``dataset`` (the labelled answer tokens)."""
    batches = [list(range(i, min(i + batch_size, len(dataset)))) for i in range(0, len(dataset), batch_size)]
    total = torch.zeros(2, dtype=torch.float64, device=accelerator.device)
    model.eval()
    for indices, real in tqdm(
        padded_shard(batches, accelerator.process_index, accelerator.num_processes),
        desc="eval loss",
        disable=not accelerator.is_local_main_process,
        leave=False,
    ):
        batch = {k: v.to(accelerator.device) for k, v in collator([dataset[i] for i in indices]).items()}
        loss = label_position_loss(model, batch)
        tokens = (batch["labels"][:, 1:] != IGNORE_INDEX).sum()
        if real:
            total += torch.stack([loss.double() * tokens, tokens.double()])
    model.train()
    total = accelerator.reduce(total, reduction="sum")
    return (total[0] / total[1].clamp(min=1)).item()


@torch.no_grad()
def generate_answers(
    accelerator, model, dataset: ScorerDataset, indices: Sequence[int], max_new_tokens: int, synced_gpus: bool
) -> dict[int, str]:
    """Greedy answers for ``indices`` of ``dataset``, gathered on every rank."""
    from accelerate.utils import gather_object

    tokenizer = dataset.renderer.tokenizer
    unwrapped = accelerator.unwrap_model(model)
    model.eval()
    answers: list[tuple[int, str]] = []
    for i, real in tqdm(
        padded_shard(list(indices), accelerator.process_index, accelerator.num_processes),
        desc="eval generate",
        disable=not accelerator.is_local_main_process,
        leave=False,
    ):
        inputs = {k: v.to(accelerator.device) for k, v in dataset.prompt(i).items()}
        out = unwrapped.generate(
            **inputs,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            use_cache=True,
            pad_token_id=tokenizer.pad_token_id,
            synced_gpus=synced_gpus,
        )
        if real:
            answers.append(
                (i, tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))
            )
    model.train()
    return dict(gather_object(answers))


def evaluate(
    accelerator,
    model,
    dataset: ScorerDataset,
    collator: ScorerCollator,
    *,
    batch_size: int,
    generate_indices: Sequence[int],
    max_new_tokens: int,
    key_threshold: int,
    synced_gpus: bool,
) -> dict:
    metrics = {"loss": eval_loss(accelerator, model, dataset, collator, batch_size)}
    if generate_indices:
        answers = generate_answers(accelerator, model, dataset, generate_indices, max_new_tokens, synced_gpus)
        order = sorted(answers)
        preds = [parse_score(answers[i]).score for i in order]
        targets = [dataset.target_score(i) for i in order]
        keep = [k for k, t in enumerate(targets) if t is not None]
        metrics.update(score_metrics([preds[k] for k in keep], [targets[k] for k in keep], key_threshold))
        if order:
            metrics["example_answer"] = answers[order[0]][:500]
    return metrics


class MetricsLog:
    """``RUN/metrics.jsonl``: one JSON line per logged train step or evaluation (main process only)."""

    def __init__(self, path: str | Path, enabled: bool):
        self.path = Path(path)
        self.enabled = enabled

    def truncate_after(self, step: int) -> None:
        """Drop records past ``step`` (what a killed run logged after its last checkpoint)."""
        if not self.enabled or not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    kept.append(line)
            except json.JSONDecodeError:
                logger.warning("%s: dropping a torn line", self.path)
        write_text_atomic(self.path, "".join(k + "\n" for k in kept))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record, default=float) + "\n"
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode("utf-8"))
        finally:
            os.close(fd)
