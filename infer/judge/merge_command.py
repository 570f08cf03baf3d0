"""``keyshot merge``: join the shards of a judge run into one verdict file, summary and metrics.

    keyshot judge data/om2w --config configs/judge/webjudge7b.yaml --out runs/om2w --shard 3/8   # x8
    keyshot merge runs/om2w                                   # -> runs/om2w/verdicts.jsonl, summary.md
    keyshot merge runs/om2w --human-labels data/om2w/human_label.json   # + runs/om2w/metrics/

What is refused and what is merged: :mod:`keyshot.infer.judge.verdict_merge`. Trajectories a shard left
incomplete are listed (exit 3: re-run those shards). ``keyshot report OUT`` reads the result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import EXIT_INCOMPLETE, EXIT_OK
from keyshot.infer.judge.verdict_merge import merge_shards
from keyshot.infer.protocol.verdicts import VERDICTS_FILE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", type=Path, help="the --out folder the shards were judged into")
    p.add_argument(
        "--human-labels", type=Path, help="Online-Mind2Web human_label.json: also write OUT/metrics"
    )
    p.add_argument("--arb-index", type=Path, help="AgentRewardBench index.csv: also write OUT/metrics")


def run(args: argparse.Namespace) -> int:
    summary = merge_shards(args.out)
    print(summary["markdown"])
    print(f"verdicts: {args.out / VERDICTS_FILE}")
    if args.human_labels or args.arb_index:
        from keyshot.infer.metrics.run import MetricsInputs, run_metrics

        inputs = MetricsInputs(args.out / VERDICTS_FILE, args.human_labels, args.arb_index)
        print(run_metrics(inputs, args.out / "metrics").text())
    print(f"browse it: keyshot report {args.out}")
    if summary["incomplete"]:
        print(
            f"keyshot merge: {summary['incomplete']} trajectories incomplete; re-run their shards, then merge again",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK


COMMAND = Command(
    "merge",
    help="join the shards of a judge run (OUT/shard-I-of-N) into OUT/verdicts.jsonl + summary",
    description=__doc__,
    arguments=add_arguments,
    run=run,
)
