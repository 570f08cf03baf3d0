"""``keyshot tiny-model OUT``: build a tiny random Qwen2.5-VL (tests, the CPU demo; untrained)."""

from __future__ import annotations

import argparse

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import require_training_stack


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    require_training_stack("keyshot tiny-model")
    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    print(build_tiny_qwen25vl(args.out, seed=args.seed))
    return 0


COMMAND = Command(
    "tiny-model",
    help="build a tiny random Qwen2.5-VL (tests, CPU demo; untrained)",
    arguments=add_arguments,
    run=run,
)
