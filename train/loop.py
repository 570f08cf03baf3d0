"""The training loop: optimizer steps with gradient accumulation until the run's total, logging throughput,
evaluating and saving a resumable checkpoint at their intervals, stopping cleanly when preempted."""

from __future__ import annotations

import logging
import signal

import torch

from keyshot.train.batches import ScorerDataset
from keyshot.train.checkpointing import CheckpointManager, TrainerState
from keyshot.train.evaluation import Evaluation, log_scalars
from keyshot.train.preemption import Preempted, PreemptionWatch
from keyshot.train.resume import normalised
from keyshot.train.step import train_step
from keyshot.train.throughput import ThroughputMeter, log_totals
from keyshot.train.train_config import TrainConfig, is_due
from keyshot.train.training_inputs import TrainingData
from keyshot.train.training_parts import TrainingParts
from keyshot.train.validation import MetricsLog

logger = logging.getLogger(__name__)


class TrainingLoop:
    """Optimizer steps until ``state.total_steps``, with gradient accumulation; logs, evaluates and saves
    a resumable checkpoint at their intervals, and saves and raises :class:`Preempted` when asked to stop."""

    def __init__(
        self,
        cfg: TrainConfig,
        accelerator,
        parts: TrainingParts,
        data: TrainingData,
        state: TrainerState,
        evaluation: Evaluation,
        metrics_log: MetricsLog,
        checkpoints: CheckpointManager,
        watch: PreemptionWatch,
    ):
        self.cfg = cfg
        self.accelerator = accelerator
        self.parts = parts
        self.sampler = data.sampler
        self.state = state
        self.evaluation = evaluation
        self.metrics_log = metrics_log
        self.checkpoints = checkpoints
        self.watch = watch
        self.meter = ThroughputMeter(
            parts.flops_model, cfg.log.peak_tflops_per_device, accelerator.num_processes
        )
        self.losses: list[torch.Tensor] = []
        self.grad_norm = None
        self.trainable = [p for p in parts.model.parameters() if p.requires_grad]

    def run(self) -> None:
        state, loader = self.state, self.parts.loader
        self.parts.model.train()
        while state.step < state.total_steps:
            # accelerate's loader re-seeds a batch sampler it holds directly with its own pass counter, which
            # restarts at 0 in a resumed process: set the epoch on both
            loader.set_epoch(state.epoch)
            self.sampler.set_epoch(state.epoch)
            epoch_loader = (
                self.accelerator.skip_first_batches(loader, state.batches_in_epoch)
                if state.batches_in_epoch
                else loader
            )
            for batch in epoch_loader:
                self._train_on(batch)
                state.batches_in_epoch += 1
                if not self.accelerator.sync_gradients:
                    continue
                self._finish_optimizer_step()
                if state.step >= state.total_steps:
                    break
            else:
                state.epoch += 1
                state.batches_in_epoch = 0

    def _train_on(self, batch) -> None:
        """One micro-batch: forward, backward and (on the last of an accumulation) the optimizer step."""
        result = train_step(
            self.accelerator,
            self.parts.model,
            self.parts.optimizer,
            batch,
            trainable=self.trainable,
            max_grad_norm=self.cfg.optim.max_grad_norm,
            memory=self.parts.memory,
        )
        if result.optimizer_stepped:
            self.grad_norm = result.grad_norm
        self.losses.append(result.loss.float())
        self.meter.add_batch(batch)

    def _finish_optimizer_step(self) -> None:
        state, scheduler = self.state, self.parts.scheduler
        step_lr = scheduler.get_last_lr()[0]  # the rate this optimizer step used
        if not self.accelerator.optimizer_step_was_skipped:
            scheduler.step()
        state.step += 1
        state.samples_seen += self.cfg.global_batch_size
        if is_due(state.step, self.cfg.log.every_steps) or state.step == state.total_steps:
            self._log_progress(step_lr)
        self.losses.clear()
        self._at_intervals()

    def _log_progress(self, step_lr: float) -> None:
        state, accelerator = self.state, self.accelerator
        stats = accelerator.reduce(
            log_totals(self.losses, self.meter, accelerator.device), reduction="sum"
        ).cpu()
        rates = self.meter.report(stats[1:])
        record = {
            "step": state.step,
            "epoch": state.epoch,
            "split": "train",
            "loss": stats[0].item() / accelerator.num_processes,
            "lr": step_lr,
            "grad_norm": float(self.grad_norm) if self.grad_norm is not None else None,
            "samples_seen": state.samples_seen,
            **rates,
        }
        logger.info(
            "step %d/%d loss %.4f lr %.3g | %.2f samples/s %.0f tokens/s MFU %.2f%% padding %.1f%%",
            state.step,
            state.total_steps,
            record["loss"],
            record["lr"],
            rates["samples_per_s"],
            rates["tokens_per_s"],
            100 * rates["mfu"],
            100 * rates["padding_fraction"],
        )
        log_scalars(accelerator, self.metrics_log, record, "train")

    def _at_intervals(self) -> None:
        """Evaluation, a stop on preemption and a resumable checkpoint, each before the last step only
        (after it, the final evaluation and the final checkpoint follow)."""
        state, accelerator = self.state, self.accelerator
        before_last = state.step < state.total_steps
        if is_due(state.step, self.cfg.eval.every_steps) and before_last:
            self.evaluation.run(state)
        if before_last and self.watch.requested(accelerator):
            self.checkpoints.save(accelerator, normalised(state, len(self.parts.loader)))
            accelerator.end_training()
            raise Preempted(self.watch.signum or signal.SIGTERM, state.step)
        if is_due(state.step, self.cfg.checkpoint.every_steps) and before_last:
            self.checkpoints.save(accelerator, normalised(state, len(self.parts.loader)))


def rows_skipped_off_plan(accelerator, data: ScorerDataset) -> list[int]:
    """The rows any rank skipped because they rendered off their plan (every rank must call this)."""
    flags = data.mismatch_flags().to(accelerator.device)
    gathered = accelerator.gather(flags).view(-1, len(data)).amax(0).cpu()
    rows = [data.plans[i].row for i in gathered.nonzero().flatten().tolist()]
    if rows:
        logger.warning(
            "%s: %d row(s) rendered off their plan and were skipped (rows %s; warnings above give the numbers)",
            data.name,
            len(rows),
            rows[:20],
        )
    return rows
