"""The run's schedule: optimizer steps and warmup from the sampler's batches (a warmup as long as the run
refused), and the memory plan's line."""

from __future__ import annotations

import logging
import math

from keyshot.infer.common.config import ConfigError
from keyshot.train.memory_plan import describe_plan
from keyshot.train.train_config import TrainConfig
from keyshot.train.training_inputs import TrainingData

logger = logging.getLogger(__name__)


def check_schedule(total_steps: int, warmup: int) -> None:
    """Refuse, before the model loads, a schedule that would train at learning rate 0 throughout
    (linear warmup starts at 0: with ``warmup >= total_steps`` a 1-step run never moves). A rate of 0 itself
    is the config's to refuse (``OptimSettings``)."""
    if warmup > 0 and warmup >= total_steps:
        raise ConfigError(
            f"optim.warmup_ratio: {warmup} warmup steps for a run of {total_steps} steps; warmup must be "
            f"shorter than the run (a run of {total_steps} step(s) with warmup trains at learning rate "
            "0): lower warmup_ratio or train for more steps"
        )


def plan_schedule(cfg: TrainConfig, data: TrainingData, accumulation: int) -> tuple[int, int]:
    """``(total optimizer steps, warmup steps)``, checked (:func:`check_schedule`) and logged."""
    steps_per_epoch = data.sampler.num_steps // accumulation
    total_steps = cfg.max_steps or math.ceil(cfg.epochs * steps_per_epoch)
    warmup = math.ceil(cfg.optim.warmup_ratio * total_steps)
    check_schedule(total_steps, warmup)
    logger.info(
        "train: %d examples, %d optimizer steps per epoch, %d steps in all (%d warmup)",
        len(data.train_set),
        steps_per_epoch,
        total_steps,
        warmup,
    )
    return total_steps, warmup


def memory_plan_line(cfg: TrainConfig, data: TrainingData) -> str:
    """The run's checkpointing and why (:func:`~keyshot.train.memory_plan.describe_plan`), from the
    micro-batches of the first epoch (every rank's) as the sampler makes them of the planned lengths."""
    data.sampler.set_epoch(0)
    return describe_plan(cfg.model, list(data.sampler), data.train_set.lengths, cfg.data.pad_to_multiple_of)
