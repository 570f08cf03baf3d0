"""``keyshot synth``: distil screenshot-relevance labels from large judges into a dataset.

    keyshot synth run --config configs/synth/paper.yaml [--dry-run] [--retry-failed] [--no-build]
    keyshot synth import-arb DIR --run RUN [--index index.csv] [--trajectories DIR] [--judges a,b]
    keyshot synth import-reference RESULTS.jsonl --trajectories DIR --run RUN [--teacher gpt-4o]
    keyshot synth build RUN [--config configs/synth/paper.yaml] [aggregation.consensus=mean]
    keyshot synth run --config configs/synth/paper.yaml --shard 3/8     # one of 8 shards (slurm/synth.sh)
    keyshot synth merge RUN --config configs/synth/paper.yaml          # join the shards, build the dataset

``run`` labels (resumable: run it again after any stop) and then builds ``RUN/dataset``; the
imports add labels from existing WebJudge logs at no cost; ``build`` (re)builds the dataset from
whatever labels the run folder holds. Also runnable as ``python -m keyshot.data_synth.cli``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from keyshot.data_synth.arb_import import import_arb
from keyshot.data_synth.dataset import build_dataset
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.label_merge import merge_synth_shards
from keyshot.data_synth.labelling_run import run_synth
from keyshot.data_synth.ray_synth import synth_on_ray
from keyshot.data_synth.reference_import import import_reference
from keyshot.data_synth.synth_config import load_build_config, load_synth_config
from keyshot.infer.common.command import Command
from keyshot.infer.common.config import split_paths_and_overrides
from keyshot.infer.engines.ray_engine import add_engine_arguments, engine_options
from keyshot.infer.runs.shards import ShardSpec

logger = logging.getLogger(__name__)


def run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--config", required=True, type=Path, help="synth config YAML (configs/synth/*.yaml)")
    run.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides, as for every keyshot command"
    )
    run.add_argument("--dry-run", action="store_true", help="print the cost estimate and make no call")
    run.add_argument("--retry-failed", action="store_true", help="ask again for labels recorded as failed")
    run.add_argument(
        "--no-build", action="store_true", help="label only; build later with `keyshot synth build`"
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="label only shard I of N (0-based, by a stable hash of the task id) into RUN/shard-I-of-N with "
        "1/N of each budget; join the shards and build with `keyshot synth merge`",
    )
    add_engine_arguments(run)


def merge_arguments(merge: argparse.ArgumentParser) -> None:
    merge.add_argument(
        "items",
        nargs="*",
        metavar="RUN|key=value",
        help="the run folder (default: the config's run_dir), then build config overrides",
    )
    merge.add_argument(
        "--config", type=Path, help="synth config (its `build:` section) or a build config YAML"
    )
    merge.add_argument("--no-build", action="store_true", help="merge the labels only")


def arb_arguments(arb: argparse.ArgumentParser) -> None:
    arb.add_argument("records", type=Path, help="folder of records (<judge>/<benchmark>/<agent>/<task>.json)")
    arb.add_argument("--run", required=True, type=Path, help="run folder to add the labels to")
    arb.add_argument(
        "--index", type=Path, help="index.csv with human labels (default: found beside the records)"
    )
    arb.add_argument("--trajectories", type=Path, help="AgentLab run folders, for screenshots no judge kept")
    arb.add_argument("--judges", help="comma-separated judge names to import (default: all)")
    arb.add_argument("--prompt-variant", default="online_mind2web", help="prompt set the dataset rows use")


def reference_arguments(ref: argparse.ArgumentParser) -> None:
    ref.add_argument("results", type=Path, help="the results file (JSON lines)")
    ref.add_argument("--trajectories", required=True, type=Path, help="the trajectory folder it was run on")
    ref.add_argument("--run", required=True, type=Path, help="run folder to add the labels to")
    ref.add_argument("--teacher", help="teacher name (default: the model in the results file name)")
    ref.add_argument("--agent", help="agent name of these trajectories")
    ref.add_argument("--benchmark", help="benchmark name (default: the loader's)")
    ref.add_argument(
        "--human-labels", type=Path, help="human_label.json (Online-Mind2Web) or {task_id: label}"
    )
    ref.add_argument("--format", default="auto", help="trajectory format (default: detect)")
    ref.add_argument("--prompt-variant", default="online_mind2web", help="prompt set the dataset rows use")


def build_arguments(build: argparse.ArgumentParser) -> None:
    build.add_argument(
        "items", nargs="*", metavar="RUN|key=value", help="the run folder, then build config overrides"
    )
    build.add_argument(
        "--config", type=Path, help="synth config (its `build:` section) or a build config YAML"
    )
    build.add_argument("--out", type=Path, help="dataset folder (default: RUN/dataset)")


def _run_and_overrides(items: list[str]) -> tuple[Path | None, list[str]]:
    paths, overrides = split_paths_and_overrides(items)
    if len(paths) > 1:
        raise SynthError(f"one run folder, not {len(paths)}: {' '.join(paths)}")
    return (Path(paths[0]) if paths else None), overrides


def run(args: argparse.Namespace) -> int:
    cfg = load_synth_config(args.config, args.overrides)
    shard = ShardSpec.parse(args.shard) if args.shard else None
    engine = engine_options(args)
    if engine is not None:
        return run_on_ray(args, cfg, engine, shard)
    report = run_synth(
        cfg, dry_run=args.dry_run, retry_failed=args.retry_failed, build=not args.no_build, shard=shard
    )
    print(report.summary())
    if shard is not None and not args.dry_run:
        print(f"when every shard is done: keyshot synth merge {cfg.run_dir} --config {args.config}")
    return report.exit_code


def run_on_ray(args: argparse.Namespace, cfg, engine, shard: ShardSpec | None) -> int:
    """``keyshot synth run --engine ray``: the shards on the cluster, merged and built (:mod:`ray_synth`)."""
    if shard is not None or args.dry_run:
        raise SynthError(f"--engine ray runs every shard itself: drop {'--shard' if shard else '--dry-run'}")
    build = None if args.no_build else load_build_config(args.config, args.overrides)
    done = synth_on_ray(cfg, engine, retry_failed=args.retry_failed, build=build)
    print(*done.summaries, sep="\n")
    if done.merged is not None:
        print(f"merged {done.merged['shards']} shards into {Path(cfg.run_dir) / 'labels.jsonl'}")
    if done.built is not None:
        print(
            f"dataset written to {done.built.path}: {done.built.meta.rows}",
            *done.built.empty_split_lines(),
            sep="\n",
        )
    return done.exit_code


def merge(args: argparse.Namespace) -> int:
    run_dir, overrides = _run_and_overrides(args.items)
    if run_dir is None:
        if args.config is None:
            raise SynthError("give the run folder, or --config with its run_dir")
        run_dir = Path(load_synth_config(args.config).run_dir)
    build = None if args.no_build else load_build_config(args.config, overrides)
    merged, result = merge_synth_shards(run_dir, build)
    print(f"merged {merged['shards']} shards into {run_dir / 'labels.jsonl'}")
    if result is not None:
        print(f"dataset written to {result.path}: {result.meta.rows}", *result.empty_split_lines(), sep="\n")
    return 0


def _imported(report, run_dir: Path) -> int:
    """What an import says when it is done; exit 1 when no record gave a label."""
    print(report.summary())
    print(f"labels added to {run_dir}; build the dataset with `keyshot synth build {run_dir}`")
    return 0 if report.records > len(report.errors) else 1


def arb(args: argparse.Namespace) -> int:
    judges = [j.strip() for j in args.judges.split(",") if j.strip()] if args.judges else None
    report = import_arb(
        args.records,
        args.run,
        index_csv=args.index,
        trajectories_dir=args.trajectories,
        judges=judges,
        prompt_variant=args.prompt_variant,
    )
    return _imported(report, args.run)


def reference(args: argparse.Namespace) -> int:
    report = import_reference(
        args.results,
        args.trajectories,
        args.run,
        teacher=args.teacher,
        agent=args.agent,
        benchmark=args.benchmark,
        human_labels=args.human_labels,
        fmt=args.format,
        prompt_variant=args.prompt_variant,
    )
    return _imported(report, args.run)


def build(args: argparse.Namespace) -> int:
    run_dir, overrides = _run_and_overrides(args.items)
    if run_dir is None:
        raise SynthError("give the run folder whose labels to build (keyshot synth build RUN)")
    cfg = load_build_config(args.config, overrides)
    if args.out is not None:
        cfg.output_dir = str(args.out)
    result = build_dataset(run_dir, cfg)
    print(f"dataset written to {result.path}: {result.meta.rows}")
    print(f"prompt version {result.meta.prompt_version}, data hash {result.meta.data_hash}")
    for reason, n in sorted(result.report.dropped.items()):
        print(f"  dropped, {reason}: {n}")
    for line in result.empty_split_lines():
        print(line)
    return 0


COMMAND = Command(
    "synth",
    help="distil teacher labels into a training dataset",
    description=__doc__.split("\n\n")[0],
    subcommands=(
        Command(
            "run",
            help="label every screenshot with every teacher, then build the dataset",
            arguments=run_arguments,
            run=run,
            overrides="overrides",
        ),
        Command(
            "merge",
            help="join the shards of `synth run --shard I/N`, then build the dataset",
            arguments=merge_arguments,
            run=merge,
            overrides="items",
        ),
        Command(
            "import-arb",
            help="import AgentRewardBench WebJudge records as teacher labels",
            arguments=arb_arguments,
            run=arb,
        ),
        Command(
            "import-reference",
            help="import the reference src/run.py results as teacher labels",
            arguments=reference_arguments,
            run=reference,
        ),
        Command(
            "build",
            help="aggregate a run's labels into the dataset",
            arguments=build_arguments,
            run=build,
            overrides="items",
        ),
    ),
)


def main(argv: list[str] | None = None) -> int:
    """``python -m keyshot.data_synth.cli ACTION ...``: ``keyshot synth`` under keyshot's signal and error
    handling."""
    from keyshot.infer.cli import run_alone

    return run_alone(COMMAND, argv, prog="python -m keyshot.data_synth.cli")


if __name__ == "__main__":
    sys.exit(main())
