"""Fine-tune the Qwen2.5-VL key-screenshot scorer: a thin entry for ``accelerate launch``.

    # the paper recipe on 4×H100 (DeepSpeed ZeRO-3); LoRA on one GPU (`train/sft.py` works as well as `-m keyshot.train.sft`)
    accelerate launch --config_file configs/accelerate/gpu4_zero3.yaml -m keyshot.train.sft --config configs/train/webjudge7b_full.yaml
    accelerate launch --config_file configs/accelerate/gpu1.yaml -m keyshot.train.sft --config configs/train/webjudge7b_lora.yaml
    # CPU (the tiny model): one process, or two with gloo (ACCELERATE_USE_CPU=1 is required)
    accelerate launch --config_file configs/accelerate/cpu1.yaml -m keyshot.train.sft --config configs/train/tiny_cpu.yaml
    ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate/cpu2.yaml -m keyshot.train.sft --config configs/train/tiny_cpu.yaml
    # overrides: key.sub=value after the config
    accelerate launch ... -m keyshot.train.sft --config configs/train/tiny_cpu.yaml run_dir=runs/x optim.lr=1e-4 max_steps=20

Re-running the same command resumes from the newest checkpoint in ``run_dir``. SIGUSR1 or SIGTERM
(SLURM's warning before a time limit or preemption) saves a checkpoint at the next step and exits
with code 75, so that ``slurm/train.sh`` requeues the job (``train/preemption.py``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from keyshot.infer.cli import run_alone
from keyshot.infer.common.command import Command
from keyshot.infer.common.config import dump_config, load_config
from keyshot.train.train_config import TrainConfig

logger = logging.getLogger("keyshot.train.sft")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, help="YAML file (configs/train/*.yaml)")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    parser.add_argument(
        "--check",
        action="store_true",
        help="check the config, the dataset and the model path, and render every row whose image is shrunk "
        "to fit max_length (and a sample of the others) to prove it has its planned length, then exit (no "
        "model weights are loaded): run it before `accelerate launch` or sbatch, whose launchers add their "
        "own traceback to any failure",
    )


def run(args: argparse.Namespace) -> int:
    rank = int(os.environ.get("RANK", "0"))
    root = logging.getLogger()  # each rank's lines say which rank wrote them; rank 0 alone says INFO
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)
    for handler in root.handlers:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s [rank{rank}] %(levelname)s %(name)s: %(message)s")
        )
    from keyshot.train.recipe import run_training
    from keyshot.train.training_inputs import check_inputs, check_training_rows

    cfg = load_config(TrainConfig, args.config, args.overrides)
    checked = check_inputs(cfg)  # before anything is written or a model is loaded
    rendered = check_training_rows(cfg) if args.check else ""
    if args.check:
        print(f"ok: {checked}\nok: {rendered}")
        return 0
    logger.info("config: %s", cfg)
    if rank == 0:
        dump_config(cfg, Path(cfg.run_dir) / "config.yaml")
    from keyshot.train.preemption import EXIT_REQUEUE, Preempted, write_marker

    try:
        run_training(cfg)
    except Preempted as stop:
        if rank == 0:
            write_marker(Path(cfg.run_dir), stop)
        logger.warning(
            "%s: checkpoint saved; run the same command again (or requeue the job) to resume", stop
        )
        return EXIT_REQUEUE
    return 0


COMMAND = Command(
    "sft",
    help="fine-tune the scorer",
    description=__doc__,
    arguments=add_arguments,
    run=run,
    overrides="overrides",
)


def main(argv: list[str] | None = None) -> int:
    """The entry ``accelerate launch`` starts: keyshot's parsing, signals, error lines and exit codes."""
    return run_alone(COMMAND, argv)


if __name__ == "__main__":
    sys.exit(main())
