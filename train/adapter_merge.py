"""Folding a LoRA adapter into its base model: a servable keyshot checkpoint.

The output is what ``keyshot serve`` and ``AutoModelForImageTextToText`` load as it is: merged safetensors
weights, the processor with the training pixel bounds, the chat template, a greedy generation config and
``keyshot.json`` (taken from the adapter folder, which training writes). The recipe merges its final adapter
here; ``keyshot merge-lora`` (train/merge_lora.py) is the command.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from keyshot.infer.model.checkpoint import CheckpointError, CheckpointMeta, read_meta

logger = logging.getLogger(__name__)

#: The dtypes the merged weights may be written in ("auto": the base checkpoint's own).
DTYPES = ("auto", "bfloat16", "float16", "float32")


def adapter_base_model(adapter_dir: Path) -> str:
    cfg_path = adapter_dir / "adapter_config.json"
    if not cfg_path.exists():
        raise CheckpointError(f"{adapter_dir}: no adapter_config.json (not a peft LoRA adapter folder)")
    try:
        base = json.loads(cfg_path.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path}: not valid JSON ({exc})") from None
    if not base:
        raise CheckpointError(f"{cfg_path}: no base_model_name_or_path; pass --base")
    return base


def merge_adapter(
    adapter_dir: str | Path,
    out_dir: str | Path,
    base: str | None = None,
    dtype: str = "auto",
    prompt_variant: str | None = None,
) -> Path:
    """Merge ``adapter_dir`` into its base model and write a servable checkpoint to ``out_dir``."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from keyshot.infer.protocol.chat_template import processor_pixel_bounds
    from keyshot.train.checkpointing import write_model_folder

    adapter_dir = Path(adapter_dir)
    base = base or adapter_base_model(adapter_dir)
    meta = read_meta(adapter_dir)
    processor_src = adapter_dir if (adapter_dir / "processor_config.json").exists() else base
    processor = AutoProcessor.from_pretrained(str(processor_src))
    if meta is None:
        if prompt_variant is None:
            raise CheckpointError(
                f"{adapter_dir}: no keyshot.json (training writes one); pass --prompt-variant to describe the scorer"
            )
        from keyshot.infer.protocol.prompts import load_prompt_set

        lo, hi = processor_pixel_bounds(processor)
        meta = CheckpointMeta(
            prompt_variant, load_prompt_set(prompt_variant).version, lo, hi, base_model=base
        )
    meta = dataclasses.replace(
        meta, created="", keyshot_version="", extra={**meta.extra, "merged_adapter": str(adapter_dir)}
    )

    logger.info("merging %s into %s", adapter_dir, base)
    torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForImageTextToText.from_pretrained(base, dtype=torch_dtype)
    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    out = write_model_folder(merged, processor, Path(out_dir), meta)
    logger.info("merged checkpoint written to %s", out)
    return out
