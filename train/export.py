"""The final checkpoint of a run: ``RUN/final`` (and ``RUN/final_adapter`` for LoRA), self-describing."""

from __future__ import annotations

import logging
from pathlib import Path

from keyshot.infer.model.checkpoint import CheckpointMeta, read_meta
from keyshot.infer.protocol.chat_template import processor_pixel_bounds
from keyshot.train.accelerator_setup import deepspeed_stage
from keyshot.train.batches import dataset_data_hash
from keyshot.train.checkpointing import write_adapter_folder, write_model_folder
from keyshot.train.train_config import TrainConfig

logger = logging.getLogger(__name__)

FINAL = "final"
FINAL_ADAPTER = "final_adapter"


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
                "deepspeed_zero_stage": deepspeed_stage(accelerator),
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
