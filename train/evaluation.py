"""Evaluation during and after training: the eval split's loss, and scores from greedy generation on a
fixed sample of it, logged to metrics.jsonl and the trackers."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np

from keyshot.train.checkpointing import TrainerState
from keyshot.train.train_config import TrainConfig
from keyshot.train.training_inputs import TrainingData
from keyshot.train.training_parts import TrainingParts
from keyshot.train.validation import MetricsLog, evaluate

logger = logging.getLogger(__name__)


@dataclass
class Evaluation:
    """Evaluation on the eval split: loss, and scores from greedy generation on a fixed sample of it."""

    cfg: TrainConfig
    accelerator: Any
    parts: TrainingParts
    data: TrainingData
    metrics_log: MetricsLog

    def __post_init__(self) -> None:
        self.generate_indices: list[int] = []
        eval_set = self.data.eval_set
        if eval_set is not None and self.cfg.eval.generate_samples:
            rng = np.random.default_rng(self.cfg.seed)
            k = min(self.cfg.eval.generate_samples, len(eval_set))
            self.generate_indices = sorted(int(i) for i in rng.choice(len(eval_set), size=k, replace=False))

    def run(self, state: TrainerState) -> None:
        if self.data.eval_set is None:
            return
        metrics = evaluate(
            self.accelerator,
            self.parts.model,
            self.data.eval_set,
            self.data.collator,
            batch_size=self.cfg.eval.batch_size,
            generate_indices=self.generate_indices,
            max_new_tokens=self.cfg.eval.max_new_tokens,
            key_threshold=self.cfg.eval.key_threshold,
            synced_gpus=self.parts.synced_gpus,
        )
        record = {"step": state.step, "epoch": state.epoch, "split": "eval", **metrics}
        logger.info(
            "eval step %d: %s", state.step, {k: v for k, v in metrics.items() if k != "example_answer"}
        )
        log_scalars(self.accelerator, self.metrics_log, record, "eval")


def log_scalars(accelerator, metrics_log: MetricsLog, record: dict, prefix: str) -> None:
    metrics_log.write(record)
    scalars = {
        f"{prefix}/{k}": v
        for k, v in record.items()
        if isinstance(v, int | float) and k not in ("step", "epoch")
    }
    if accelerator.trackers:
        accelerator.log(scalars, step=record["step"])
