"""The scorer fine-tuning recipe: one readable loop around accelerate (DDP or DeepSpeed ZeRO-2/3).

accelerator → processor with the scorer's pixel bounds → datasets (rendered in DataLoader workers,
length-bounded, length-grouped batches) → model (frozen vision tower, optional LoRA, gradient
checkpointing) → AdamW + warmup/cosine schedule → resume from the newest checkpoint, if any →
train with gradient accumulation, logging throughput and MFU, evaluating and checkpointing
periodically → a final self-describing checkpoint in ``RUN/final``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from keyshot.train.accelerator_setup import init_trackers, start_accelerator
from keyshot.train.checkpointing import CheckpointManager
from keyshot.train.evaluation import Evaluation
from keyshot.train.export import export_final
from keyshot.train.loop import TrainingLoop, rows_skipped_off_plan
from keyshot.train.preemption import PreemptionWatch, clear_marker
from keyshot.train.resume import finished_checkpoint, resume_state
from keyshot.train.schedule import memory_plan_line, plan_schedule
from keyshot.train.train_config import TrainConfig
from keyshot.train.training_inputs import load_data
from keyshot.train.training_parts import prepare_model
from keyshot.train.validation import MetricsLog

logger = logging.getLogger(__name__)


def run_training(cfg: TrainConfig) -> Path:
    """Train the scorer as ``cfg`` says; return the final checkpoint folder (``RUN/final``).

    SIGUSR1/SIGTERM save a checkpoint at the next optimizer step and raise :class:`Preempted`."""
    watch = PreemptionWatch()
    try:
        return _run_training(cfg, watch)
    finally:
        watch.close()


def _run_training(cfg: TrainConfig, watch: PreemptionWatch) -> Path:
    run_dir = Path(cfg.run_dir)
    accelerator = start_accelerator(cfg, run_dir)
    data = load_data(cfg, accelerator)
    total_steps, warmup = plan_schedule(cfg, data, accelerator.gradient_accumulation_steps)
    logger.info("memory plan: %s", memory_plan_line(cfg, data))
    finished = finished_checkpoint(cfg, run_dir, data.ds, total_steps)
    if finished is not None:
        return finished
    parts = prepare_model(cfg, accelerator, data.loader, total_steps, warmup)
    init_trackers(cfg, accelerator)
    metrics_log = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    checkpoints = CheckpointManager(run_dir, cfg.checkpoint.keep_last)
    state = resume_state(cfg, accelerator, checkpoints, metrics_log, total_steps)
    evaluation = Evaluation(cfg, accelerator, parts, data, metrics_log)
    if accelerator.is_main_process:
        clear_marker(run_dir)
    TrainingLoop(cfg, accelerator, parts, data, state, evaluation, metrics_log, checkpoints, watch).run()
    skipped = rows_skipped_off_plan(accelerator, data.train_set)
    evaluation.run(state)
    final = export_final(
        accelerator,
        parts.model,
        data.renderer.processor,
        cfg,
        run_dir,
        data.prompt_variant,
        data.prompt_version,
        data.ds,
        data.renderer.policy.to_dict(),
        state,
        answer_tokens=data.train_set.answer_tokens,
        skipped_rows=skipped,
    )
    accelerator.end_training()
    return final
