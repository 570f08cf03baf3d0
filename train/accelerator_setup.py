"""The launch's accelerate set-up: the Accelerator (gloo on a CPU, the accumulation from the global batch),
DeepSpeed given the recipe's numbers where its JSON says "auto", the trackers, every RNG seeded."""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path

import torch

from keyshot.infer.common.config import config_to_dict
from keyshot.train.train_config import TrainConfig

logger = logging.getLogger(__name__)


def tracker_name(name: str) -> str | None:
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
        log_with=tracker_name(cfg.log.tracker),
        project_config=ProjectConfiguration(project_dir=str(run_dir), logging_dir=str(run_dir / "logs")),
        kwargs_handlers=handlers,
        step_scheduler_with_optimizer=False,
    )
    accelerator.gradient_accumulation_steps = cfg.gradient_accumulation_steps(accelerator.num_processes)
    return accelerator


def start_accelerator(cfg: TrainConfig, run_dir: Path):
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


def deepspeed_stage(accelerator) -> int | None:
    plugin = accelerator.state.deepspeed_plugin
    return int(plugin.deepspeed_config["zero_optimization"]["stage"]) if plugin is not None else None


def fill_deepspeed_config(accelerator, cfg: TrainConfig, model) -> None:
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


def init_trackers(cfg: TrainConfig, accelerator) -> None:
    if tracker_name(cfg.log.tracker):
        flat = {
            k: (v if isinstance(v, int | float | str | bool) else str(v))
            for k, v in flatten_config(config_to_dict(cfg)).items()
        }
        accelerator.init_trackers("keyshot-scorer", config=flat)


def flatten_config(data: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten_config(v, key + "."))
        else:
            out[key] = v
    return out
