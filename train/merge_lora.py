"""``keyshot merge-lora ADAPTER_DIR --out MERGED``: fold a LoRA adapter into its base model.

The output is a servable keyshot checkpoint (vLLM and ``AutoModelForImageTextToText`` load it as it
is): merged safetensors weights, the processor with the training pixel bounds, the chat template,
a greedy generation config and ``keyshot.json`` (taken from the adapter folder, which training
writes). The base model is the adapter's ``base_model_name_or_path`` unless ``--base`` is given. The merge
itself is ``keyshot.train.adapter_merge.merge_adapter``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import require_training_stack
from keyshot.train.adapter_merge import DTYPES, merge_adapter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("adapter_dir", type=Path, help="peft adapter folder (RUN/final_adapter)")
    p.add_argument("--out", type=Path, required=True, help="folder for the merged checkpoint")
    p.add_argument(
        "--base", default=None, help="base model path or hub id (default: from adapter_config.json)"
    )
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="dtype of the merged weights")
    p.add_argument(
        "--prompt-variant",
        default=None,
        help="only for adapters without keyshot.json: the prompt set they were trained on",
    )


def run(args) -> int:
    require_training_stack("keyshot merge-lora")
    print(merge_adapter(args.adapter_dir, args.out, args.base, args.dtype, args.prompt_variant))
    return 0


COMMAND = Command(
    "merge-lora",
    help="merge a LoRA adapter into its base model (servable keyshot checkpoint)",
    description=__doc__,
    arguments=add_arguments,
    run=run,
)
