"""The model, optimizer and learning-rate schedule of a run, prepared by accelerate (DeepSpeed given its
numbers), with the FLOPs model and memory plan that throughput and the step need."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from keyshot.train.accelerator_setup import deepspeed_stage, fill_deepspeed_config
from keyshot.train.memory_plan import CheckpointPlan
from keyshot.train.scorer_model import load_scorer_model
from keyshot.train.step import build_optimizer
from keyshot.train.throughput import FlopsModel
from keyshot.train.train_config import TrainConfig
from keyshot.train.training_inputs import model_load_error

logger = logging.getLogger(__name__)


@dataclass
class TrainingParts:
    """What ``accelerator.prepare`` returned, with the schedule and what throughput and evaluation need."""

    model: Any
    optimizer: Any
    scheduler: Any
    loader: Any  # the prepared train loader
    flops_model: FlopsModel
    memory: CheckpointPlan | None  # which micro-batches are checkpointed (None: as prepared, every one)
    synced_gpus: bool  # ZeRO-3 on several processes: generation must keep every rank in step


def prepare_model(cfg: TrainConfig, accelerator, loader, total_steps: int, warmup: int) -> TrainingParts:
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
    fill_deepspeed_config(accelerator, cfg, model)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.register_for_checkpointing(scheduler)  # stepped here, once per optimizer step
    synced_gpus = deepspeed_stage(accelerator) == 3 and accelerator.num_processes > 1
    return TrainingParts(model, optimizer, scheduler, loader, flops_model, memory, synced_gpus)
