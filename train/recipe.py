"""The scorer fine-tuning recipe: one readable loop around accelerate (DDP or DeepSpeed ZeRO-2/3).

accelerator → processor with the scorer's pixel bounds → datasets (rendered in DataLoader workers,
length-bounded, length-grouped batches) → model (frozen vision tower, optional LoRA, gradient
checkpointing) → AdamW + warmup/cosine schedule → resume from the newest checkpoint, if any →
train with gradient accumulation, logging throughput and MFU, evaluating and checkpointing
periodically → a final self-describing checkpoint in ``RUN/final``.
"""

from __future__ import annotations

import logging
import math
import os
import signal
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from keyshot.infer.common.config import ConfigError, config_to_dict
from keyshot.infer.model.checkpoint import (
    CheckpointMeta,
    looks_like_local_path,
    model_folder_problem,
    read_meta,
)
from keyshot.infer.protocol.chat_template import (
    DataError,
    ScorerRenderer,
    image_policy_for,
    processor_pixel_bounds,
    set_processor_pixel_bounds,
)
from keyshot.train.batches import (
    ScorerCollator,
    ScorerDataset,
    build_batch_sampler,
    dataset_data_hash,
    dataset_description,
    dataset_prompt_version,
    load_scorer_dataset,
)
from keyshot.train.checkpointing import (
    CheckpointManager,
    ResumeError,
    TrainerState,
    write_adapter_folder,
    write_model_folder,
)
from keyshot.train.memory_plan import CheckpointPlan, describe_plan
from keyshot.train.preemption import Preempted, PreemptionWatch, clear_marker
from keyshot.train.scorer_model import load_scorer_model
from keyshot.train.step import build_optimizer, train_step
from keyshot.train.throughput import FlopsModel, ThroughputMeter, log_totals
from keyshot.train.train_config import TrainConfig, is_due
from keyshot.train.validation import MetricsLog, evaluate

logger = logging.getLogger(__name__)

FINAL = "final"
FINAL_ADAPTER = "final_adapter"


def _tracker(name: str) -> str | None:
    import importlib.util

    if name == "none":
        return None
    if name == "wandb" and importlib.util.find_spec("wandb") is None:
        logger.warning("log.tracker=wandb but wandb is not installed; using tensorboard")
        return "tensorboard"
    return name


def build_accelerator(cfg: TrainConfig, run_dir: Path):
    """An Accelerator for this launch (gloo on CPU); gradient accumulation derived from the global batch."""
    from accelerate import Accelerator, InitProcessGroupKwargs
    from accelerate.utils import ProjectConfiguration

    handlers = []
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if (
        distributed and not torch.cuda.is_available()
    ):  # CPU runs (tests, CI): DeepSpeed needs gloo spelled out
        handlers.append(InitProcessGroupKwargs(backend="gloo", timeout=timedelta(minutes=30)))
    accelerator = Accelerator(
        mixed_precision=cfg.mixed_precision,
        log_with=_tracker(cfg.log.tracker),
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        kwargs_handlers=handlers,
        step_scheduler_with_optimizer=False,
    )
    accelerator.gradient_accumulation_steps = cfg.gradient_accumulation_steps(accelerator.num_processes)
    return accelerator


def _deepspeed_stage(accelerator) -> int | None:
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.deepspeed_config["zero_optimization"]["stage"]) if plugin is not None else None


def _fill_deepspeed_config(accelerator, cfg: TrainConfig, model) -> None:
    """Give DeepSpeed this recipe's numbers (the shipped JSON files say "auto" for them)."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = cfg.per_device_batch_size
    ds["gradient_accumulation_steps"] = accelerator.gradient_accumulation_steps
    ds["train_batch_size"] = cfg.global_batch_size
    ds["gradient_clipping"] = cfg.optim.max_grad_norm
    hidden = model.config.get_text_config().hidden_size
    zero = ds.setdefault("zero_optimization", {})
    for key, value in (
        ("reduce_bucket_size", hidden * hidden),
        ("stage3_prefetch_bucket_size", int(0.9 * hidden * hidden)),
        ("stage3_param_persistence_threshold", 10 * hidden),
    ):
        if zero.get(key) == "auto":
            zero[key] = value


def _prompt_identity(ds, cfg: TrainConfig) -> tuple[str, str]:
    from keyshot.infer.protocol.prompts import load_prompt_set

    version = dataset_prompt_version(ds)
    if version is None:
        if cfg.data.prompt_variant is None:
            raise DataError(
                f"{cfg.data.path}: rows carry no prompt_version; set data.prompt_variant to the prompt set they used"
            )
        return cfg.data.prompt_variant, load_prompt_set(cfg.data.prompt_variant).version
    return version.split("@", 1)[0], version


def load_training_data(cfg: TrainConfig):
    """The dataset with its train split and its prompt set ``(ds, prompt_variant, prompt_version)``;
    DataError naming the path otherwise (what ``train/sft.py --check`` and a run both check)."""
    ds = load_scorer_dataset(cfg.data.path)
    if cfg.data.train_split not in ds:
        raise DataError(f"{cfg.data.path}: no split {cfg.data.train_split!r}; has {list(ds)}")
    return (ds, *_prompt_identity(ds, cfg))


def check_inputs(cfg: TrainConfig) -> str:
    """The training data (:func:`load_training_data`) and a local model path that must be a model folder,
    checked without loading the model or writing anything; DataError naming the path. Returns what was
    checked, in one line."""
    ds, _, prompt_version = load_training_data(cfg)
    model = str(cfg.model.name_or_path)
    if looks_like_local_path(model) and (problem := model_folder_problem(model)):
        raise DataError(
            f"{model}: model.name_or_path is not a model folder ({problem}); give a checkpoint folder or a hub id"
        )
    rows = ", ".join(f"{len(part):,} {split}" for split, part in ds.items())
    return f"dataset {cfg.data.path} ({rows} rows, prompt {prompt_version}), model {cfg.model.name_or_path}"


def model_load_error(name_or_path: str, what: str, exc: Exception) -> DataError:
    """The one line for a model whose ``what`` (processor, weights) could not be loaded: a local folder is
    named as one; a name that is no local folder says the hub could not give it (an offline cluster node)
    and how to point at a local copy."""
    reason = " ".join(str(exc).split())
    if looks_like_local_path(name_or_path):
        return DataError(f"{name_or_path}: model.name_or_path has no loadable {what} ({reason})")
    return DataError(
        f"{name_or_path}: model.name_or_path is no local folder and its {what} could not be had from the "
        f"Hugging Face hub ({reason}); point at a local copy with model.name_or_path=/path/to/folder, or "
        "on a node without network set HF_HUB_OFFLINE=1 with the model in the Hugging Face cache (HF_HOME)"
    )


def training_renderer(cfg: TrainConfig) -> ScorerRenderer:
    """The run's renderer: the model's processor under the configured pixel bounds, its image policy."""
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(cfg.model.name_or_path)
    except (OSError, ValueError) as exc:  # no processor files, an unrecognised one, a hub id not reachable
        raise model_load_error(str(cfg.model.name_or_path), "processor", exc) from None
    lo, hi = processor_pixel_bounds(processor)
    set_processor_pixel_bounds(processor, cfg.data.min_pixels or lo, cfg.data.max_pixels or hi)
    return ScorerRenderer(processor, image_policy_for(processor, cfg.data.max_aspect), cfg.data.max_length)


def check_rendering(data: ScorerDataset, sample: int = 32, seed: int = 0) -> str:
    """Render every shrunk example of ``data`` and ``sample`` of the others; DataError naming each row
    whose rendered length is not its planned length (with the numbers). Returns what was rendered."""
    shrunk = [i for i, plan in enumerate(data.plans) if plan.bounded]
    others = [i for i, plan in enumerate(data.plans) if not plan.bounded]
    rng = np.random.default_rng(seed)
    picked = sorted(int(i) for i in rng.choice(others, size=min(sample, len(others)), replace=False))
    problems = [p for i in shrunk + picked if (p := data.render_problem(i))]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise DataError(
            f"{len(problems)} of {len(shrunk) + len(picked)} rendered rows differ from their plan: "
            + "; ".join(problems[:5])
            + more
        )
    return (
        f"{data.name}: {len(shrunk)} shrunk and {len(picked)} other rows render at their planned length "
        f"(max_length={data.renderer.max_length}; {data.stats.dropped_too_long} dropped, text alone too long; "
        f"{data.stats.dropped_no_image_room} dropped, no room for the image at min_pixels)"
    )


def check_training_rows(cfg: TrainConfig, sample: int = 32) -> str:
    """``train/sft.py --check``'s rendering check: plan the train split as a run would (the processor,
    no model weights) and :func:`check_rendering` it."""
    ds, _, _ = load_training_data(cfg)
    data = ScorerDataset(
        ds[cfg.data.train_split], training_renderer(cfg), max_samples=cfg.data.max_train_samples, name="train"
    )
    return check_rendering(data, sample, cfg.seed)


def _log_scalars(accelerator, metrics_log: MetricsLog, record: dict, prefix: str) -> None:
    metrics_log.write(record)
    scalars = {
        f"{prefix}/{k}": v
        for k, v in record.items()
        if isinstance(v, int | float) and k not in ("step", "epoch")
    }
    if accelerator.trackers:
        accelerator.log(scalars, step=record["step"])


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
    accelerator = _start(cfg, run_dir)
    data = _load_data(cfg, accelerator)
    total_steps, warmup = _plan_schedule(cfg, data, accelerator.gradient_accumulation_steps)
    logger.info("memory plan: %s", _memory_plan_line(cfg, data))
    finished = _finished_checkpoint(cfg, run_dir, data.ds, total_steps)
    if finished is not None:
        return finished
    parts = _prepare_model(cfg, accelerator, data.loader, total_steps, warmup)
    _init_trackers(cfg, accelerator)
    metrics_log = MetricsLog(run_dir / "metrics.jsonl", enabled=accelerator.is_main_process)
    checkpoints = CheckpointManager(run_dir, cfg.checkpoint.keep_last)
    state = _resume(cfg, accelerator, checkpoints, metrics_log, total_steps)
    evaluation = _Evaluation(cfg, accelerator, parts, data, metrics_log)
    if accelerator.is_main_process:
        clear_marker(run_dir)
    _TrainingLoop(cfg, accelerator, parts, data, state, evaluation, metrics_log, checkpoints, watch).run()
    skipped = _rows_skipped_off_plan(accelerator, data.train_set)
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


def _start(cfg: TrainConfig, run_dir: Path):
    """The accelerator of this launch, its layout logged, every RNG seeded."""
    from accelerate.utils import set_seed

    accelerator = build_accelerator(cfg, run_dir)
    logger.info(
        "world_size=%d distributed_type=%s backend=%s device=%s gradient_accumulation=%d global_batch=%d",
        accelerator.num_processes,
        accelerator.distributed_type.value,
        getattr(accelerator.state, "backend", None),
        accelerator.device,
        accelerator.gradient_accumulation_steps,
        cfg.global_batch_size,
    )
    set_seed(cfg.seed)
    return accelerator


# ---------------------------------------------------------------------------- data
@dataclass
class _TrainingData:
    """The dataset and its prompt set, the renderer, the planned train/eval sets and the train loader."""

    ds: Any
    prompt_variant: str
    prompt_version: str
    renderer: ScorerRenderer
    train_set: ScorerDataset
    eval_set: ScorerDataset | None
    collator: ScorerCollator
    sampler: Any
    loader: torch.utils.data.DataLoader


def _load_data(cfg: TrainConfig, accelerator) -> _TrainingData:
    renderer = training_renderer(cfg)
    logger.info("image policy: %s", renderer.policy.to_dict())
    ds, prompt_variant, prompt_version = load_training_data(cfg)
    _warn_if_prepared_for_other_bounds(ds, renderer.policy)
    with accelerator.main_process_first():
        train_set = ScorerDataset(
            ds[cfg.data.train_split],
            renderer,
            max_samples=cfg.data.max_train_samples,
            name="train",
            repeat_by_count=cfg.data.repeat_by_count,
        )
        eval_set = _eval_set(cfg, ds, renderer)
    collator = ScorerCollator(renderer.processor.tokenizer.pad_token_id, cfg.data.pad_to_multiple_of)
    sampler = build_batch_sampler(
        cfg.data.batching,
        train_set.lengths,
        cfg.per_device_batch_size,
        accelerator.num_processes,
        cfg.seed,
        accelerator.gradient_accumulation_steps,
        cfg.data.group_window,
    )
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=cfg.data.num_workers,
        persistent_workers=cfg.data.num_workers > 0,
    )
    return _TrainingData(
        ds, prompt_variant, prompt_version, renderer, train_set, eval_set, collator, sampler, loader
    )


def _warn_if_prepared_for_other_bounds(ds, policy) -> None:
    recorded = dataset_description(ds).get("image_policy") or {}
    if recorded and (recorded.get("min_pixels"), recorded.get("max_pixels")) != (
        policy.min_pixels,
        policy.max_pixels,
    ):
        logger.warning(
            "the dataset's screenshots were prepared for pixel bounds %s..%s, the scorer trains (and is served) "
            "at %d..%d: every image is prepared again",
            recorded.get("min_pixels"),
            recorded.get("max_pixels"),
            policy.min_pixels,
            policy.max_pixels,
        )


def _eval_set(cfg: TrainConfig, ds, renderer: ScorerRenderer) -> ScorerDataset | None:
    """The evaluation split, planned; None (with a warning when one was asked for) when there is none."""
    split = cfg.data.eval_split
    if split and split in ds and len(ds[split]) == 0:
        logger.warning("%s: split %r is empty: no evaluation", cfg.data.path, split)
    elif split and split in ds:
        return ScorerDataset(ds[split], renderer, max_samples=cfg.eval.max_samples, name=split)
    elif split:
        logger.warning("%s: no split %r: no evaluation", cfg.data.path, split)
    return None


def _plan_schedule(cfg: TrainConfig, data: _TrainingData, accumulation: int) -> tuple[int, int]:
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


def _memory_plan_line(cfg: TrainConfig, data: _TrainingData) -> str:
    """The run's checkpointing and why (:func:`~keyshot.train.memory_plan.describe_plan`), from the
    micro-batches of the first epoch (every rank's) as the sampler makes them of the planned lengths."""
    data.sampler.set_epoch(0)
    return describe_plan(cfg.model, list(data.sampler), data.train_set.lengths, cfg.data.pad_to_multiple_of)


def _finished_checkpoint(cfg: TrainConfig, run_dir: Path, ds, total_steps: int) -> Path | None:
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


# ---------------------------------------------------------------------------- model, optimizer, schedule
@dataclass
class _TrainingParts:
    """What ``accelerator.prepare`` returned, with the schedule and what throughput and evaluation need."""

    model: Any
    optimizer: Any
    scheduler: Any
    loader: Any  # the prepared train loader
    flops_model: FlopsModel
    memory: CheckpointPlan | None  # which micro-batches are checkpointed (None: as prepared, every one)
    synced_gpus: bool  # ZeRO-3 on several processes: generation must keep every rank in step


def _prepare_model(cfg: TrainConfig, accelerator, loader, total_steps: int, warmup: int) -> _TrainingParts:
    from transformers import get_scheduler

    try:
        model = load_scorer_model(cfg.model)
    except (OSError, ValueError) as exc:  # no weights, an unrecognised config, a hub id not reachable
        raise model_load_error(str(cfg.model.name_or_path), "weights", exc) from None
    flops_model = FlopsModel.from_model(
        model, lora=cfg.model.lora.enabled, train_vision=cfg.model.train_vision_tower
    )
    memory = CheckpointPlan.for_model(model, cfg.model)
    optimizer = build_optimizer(model, cfg)
    scheduler_name = "constant_with_warmup" if cfg.optim.scheduler == "constant" else cfg.optim.scheduler
    scheduler = get_scheduler(
        scheduler_name, optimizer, num_warmup_steps=warmup, num_training_steps=total_steps
    )
    _fill_deepspeed_config(accelerator, cfg, model)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(scheduler)  # stepped here, once per optimizer step
    synced_gpus = _deepspeed_stage(accelerator) == 3 and accelerator.num_processes > 1
    return _TrainingParts(model, optimizer, scheduler, loader, flops_model, memory, synced_gpus)


def _init_trackers(cfg: TrainConfig, accelerator) -> None:
    if _tracker(cfg.log.tracker):
        flat = {
            k: (v if isinstance(v, int | float | str | bool) else str(v))
            for k, v in _flatten(config_to_dict(cfg)).items()
        }
        accelerator.init_trackers("keyshot-scorer", config=flat)


def _resume(
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


# ---------------------------------------------------------------------------- evaluation
@dataclass
class _Evaluation:
    """Evaluation on the eval split: loss, and scores from greedy generation on a fixed sample of it."""

    cfg: TrainConfig
    accelerator: Any
    parts: _TrainingParts
    data: _TrainingData
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
        _log_scalars(self.accelerator, self.metrics_log, record, "eval")


# ---------------------------------------------------------------------------- the loop
class _TrainingLoop:
    """Optimizer steps until ``state.total_steps``, with gradient accumulation; logs, evaluates and saves
    a resumable checkpoint at their intervals, and saves and raises :class:`Preempted` when asked to stop."""

    def __init__(
        self,
        cfg: TrainConfig,
        accelerator,
        parts: _TrainingParts,
        data: _TrainingData,
        state: TrainerState,
        evaluation: _Evaluation,
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
        _log_scalars(accelerator, self.metrics_log, record, "train")

    def _at_intervals(self) -> None:
        """Evaluation, a stop on preemption and a resumable checkpoint, each before the last step only
        (after it, the final evaluation and the final checkpoint follow)."""
        state, accelerator = self.state, self.accelerator
        before_last = state.step < state.total_steps
        if is_due(state.step, self.cfg.eval.every_steps) and before_last:
            self.evaluation.run(state)
        if before_last and self.watch.requested(accelerator):
            self.checkpoints.save(accelerator, _normalised(state, len(self.parts.loader)))
            accelerator.end_training()
            raise Preempted(self.watch.signum or signal.SIGTERM, state.step)
        if is_due(state.step, self.cfg.checkpoint.every_steps) and before_last:
            self.checkpoints.save(accelerator, _normalised(state, len(self.parts.loader)))


def _rows_skipped_off_plan(accelerator, data: ScorerDataset) -> list[int]:
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


def _normalised(state: TrainerState, batches_per_epoch: int) -> TrainerState:
    """A state whose finished epoch reads as the start of the next one."""
    if state.batches_in_epoch >= batches_per_epoch:
        return TrainerState(state.step, state.epoch + 1, 0, state.samples_seen, state.total_steps)
    return TrainerState(
        state.step, state.epoch, state.batches_in_epoch, state.samples_seen, state.total_steps
    )


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def export_final(
    accelerator,
    model,
    processor,
    cfg: TrainConfig,
    run_dir: Path,
    variant,
    version,
    ds,
    policy,
    state,
    *,
    answer_tokens: dict | None = None,
    skipped_rows: list[int] | None = None,
) -> Path:
    """Write ``RUN/final`` (and ``RUN/final_adapter`` for LoRA); every rank must call this.

    ``answer_tokens`` (the train rows' answer lengths, ``ScorerDataset.answer_tokens``) goes into
    ``keyshot.json``, where ``keyshot serve`` and ``keyshot judge`` read the answer length to allow."""
    from keyshot.train.adapter_merge import merge_adapter

    state_dict = accelerator.get_state_dict(model)  # gathers ZeRO-3 shards (16-bit save enabled in the JSON)
    final = run_dir / FINAL
    if accelerator.is_main_process:
        lo, hi = processor_pixel_bounds(processor)
        splits = [s for s in (cfg.data.train_split, cfg.data.eval_split) if s and s in ds]
        meta = CheckpointMeta(
            prompt_variant=variant,
            prompt_version=version,
            min_pixels=lo,
            max_pixels=hi,
            base_model=cfg.model.name_or_path,
            max_length=cfg.data.max_length,
            data_hash=dataset_data_hash(ds, splits),
            image_policy=policy,
            answer_tokens=dict(answer_tokens or {}),
            extra={
                "steps": state.step,
                "samples_seen": state.samples_seen,
                "world_size": accelerator.num_processes,
                "lora": cfg.model.lora.enabled,
                "deepspeed_zero_stage": _deepspeed_stage(accelerator),
                "rows_skipped_off_plan": list(skipped_rows or []),
            },
        )
        unwrapped = accelerator.unwrap_model(model)
        if cfg.model.lora.enabled:
            adapter = write_adapter_folder(unwrapped, processor, run_dir / FINAL_ADAPTER, meta, state_dict)
            merge_adapter(adapter, final, base=cfg.model.name_or_path, dtype=cfg.model.dtype)
        else:
            write_model_folder(unwrapped, processor, final, meta, state_dict)
        logger.info("final checkpoint: %s (%s)", final, read_meta(final))
    accelerator.wait_for_everyone()
    return final
