"""Resuming a run: ``RUN/final`` already holding this run's result, the newest checkpoint's state, and a
state saved at the end of an epoch that reads as the start of the next."""

from __future__ import annotations

import logging
from pathlib import Path

from keyshot.infer.model.checkpoint import read_meta
from keyshot.train.batches import dataset_data_hash
from keyshot.train.checkpointing import CheckpointManager, ResumeError, TrainerState
from keyshot.train.export import FINAL
from keyshot.train.train_config import TrainConfig
from keyshot.train.validation import MetricsLog

logger = logging.getLogger(__name__)


def finished_checkpoint(cfg: TrainConfig, run_dir: Path, ds, total_steps: int) -> Path | None:
    """``RUN/final`` when it already holds this run's result (same steps, data and base model)."""
    finished = read_meta(run_dir / FINAL) if (run_dir / FINAL / "keyshot.json").exists() else None
    if cfg.checkpoint.resume and finished is not None and finished.extra.get("steps") == total_steps:
        splits = [s for s in (cfg.data.train_split, cfg.data.eval_split) if s and s in ds]
        same_data = finished.data_hash == dataset_data_hash(ds, splits)
        if same_data and finished.base_model == cfg.model.name_or_path:
            logger.info(
                "%s already holds this run's final checkpoint (%d steps): nothing to do", run_dir, total_steps
            )
            return run_dir / FINAL
    return None


def resume_state(
    cfg: TrainConfig, accelerator, checkpoints: CheckpointManager, metrics_log: MetricsLog, total_steps: int
) -> TrainerState:
    """The state of the newest checkpoint (model, optimizer and scheduler restored), else a fresh one."""
    latest = checkpoints.latest() if cfg.checkpoint.resume else None
    if latest is None:
        return TrainerState(total_steps=total_steps)
    state = checkpoints.load(accelerator, latest)
    if state.total_steps != total_steps:
        raise ResumeError(
            f"{latest}: was a run of {state.total_steps} steps, this config makes {total_steps}; "
            "resume with the same config (or a new run_dir)"
        )
    metrics_log.truncate_after(state.step)
    return state


def normalised(state: TrainerState, batches_per_epoch: int) -> TrainerState:
    """A state whose finished epoch reads as the start of the next one."""
    if state.batches_in_epoch >= batches_per_epoch:
        return TrainerState(state.step, state.epoch + 1, 0, state.samples_seen, state.total_steps)
    return TrainerState(
        state.step, state.epoch, state.batches_in_epoch, state.samples_seen, state.total_steps
    )
