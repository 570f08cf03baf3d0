"""``keyshot metrics``: a judge's verdicts against the truth: success rate, agreement, SR gap, precision,
recall and F1, of a keyshot run (its folder or verdicts.jsonl) or of a released ARB WebJudge run.

Examples::

    keyshot metrics runs/om2w/verdicts.jsonl --human-labels data/online_mind2web/human_label.json --out runs/om2w/metrics
    keyshot metrics runs/arb/verdicts.jsonl --arb-index data/arb_webjudge/dev/index.csv --out runs/arb/metrics
    keyshot metrics --arb-index data/arb_webjudge/dev/index.csv --arb-judge webjudge_7B --out runs/released_7b
    keyshot metrics runs/mine/verdicts.jsonl --human-labels labels.csv --agent MyAgent --out runs/mine/metrics

The truth of each trajectory, and every table names where it came from: human labels (--human-labels:
Online-Mind2Web's human_label.json, a JSON object {task_id: 0|1} or {task_id: {"label": 0|1, "agent":
NAME}}, or a CSV with the header task_id,label[,agent]), AgentRewardBench's annotation (--arb-index), else
the benchmark's own reward recorded with the run (AgentLab/BrowserGym cum_reward > 0: success).

Verdicts that rest on no readable screenshot score are not counted (dropped as "no readable scores"), and
a run of stand-in models (the demo's untrained model) says so above every table.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.metrics.calibration import OBJECTIVES
from keyshot.infer.metrics.compute import (
    INCOMPLETE,
    LABEL_2_POLICIES,
    NO_READABLE_SCORES,
    MetricsInputError,
    MetricsReport,
    arb_records,
    compute_metrics,
    evidence_notes,
    load_arb_index,
    load_human_labels,
    records_from_verdicts,
)
from keyshot.infer.metrics.files import metrics_markdown, write_metrics
from keyshot.infer.metrics.operating import write_operating_point, write_sweep_metrics
from keyshot.infer.metrics.sweep_compare import is_sweep_folder
from keyshot.infer.runs.run_record import stand_in_of
from keyshot.infer.runs.verdict_sources import load_verdicts

logger = logging.getLogger(__name__)


def _configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "verdicts",
        nargs="?",
        type=Path,
        help="a keyshot judge output folder or its verdicts.jsonl (or released judge records); leave out to "
        "score the released records listed in --arb-index",
    )
    parser.add_argument(
        "--human-labels",
        type=Path,
        help="human labels: Online-Mind2Web human_label.json, {task_id: 0|1} JSON, or task_id,label[,agent] CSV",
    )
    parser.add_argument(
        "--agent", help="the agent of verdicts judged without one (joined with the labels by it)"
    )
    parser.add_argument("--benchmark", help="the benchmark of verdicts judged without one")
    parser.add_argument(
        "--label-2",
        choices=LABEL_2_POLICIES,
        default="not_success",
        help="how to count Online-Mind2Web's human label 2 (not executable); the paper counts it as not success",
    )
    parser.add_argument(
        "--arb-index", type=Path, help="AgentRewardBench WebJudge index.csv (human labels, records)"
    )
    parser.add_argument(
        "--arb-judge", help="judge folder in --arb-index to score when no verdict file is given"
    )
    parser.add_argument(
        "--arb-parse-mode",
        choices=("reference", "strict"),
        default="reference",
        help="how to read the released records' outcome answers",
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for metrics.{json,md,csv,png}")
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="agreement",
        help="what the p_success threshold maximises on the tune split (reported on the test split)",
    )
    parser.add_argument("--split-seed", default="0", help="seed of the task-hash tune/test split")
    parser.add_argument("--bins", type=int, default=10, help="bins of the reliability diagram")
    return parser


def run(args: argparse.Namespace) -> int:
    options = {
        "label_2": args.label_2,
        "objective": getattr(args, "objective", "agreement"),
        "seed": getattr(args, "split_seed", "0"),
        "n_bins": getattr(args, "bins", 10),
    }
    labels = load_human_labels(args.human_labels) if args.human_labels else None
    index = load_arb_index(args.arb_index) if args.arb_index else None
    if args.verdicts is not None and is_sweep_folder(
        args.verdicts
    ):  # keyshot sweep's OUT: the δ's side by side
        text, paths = write_sweep_metrics(
            args.verdicts, args.out, labels, index, agent=args.agent, benchmark=args.benchmark, **options
        )
        print(text)
        print("wrote " + ", ".join(str(p) for p in paths.values()))
        return 0
    if args.verdicts is not None:
        verdicts, kind = load_verdicts(args.verdicts)
        folder = args.verdicts if args.verdicts.is_dir() else args.verdicts.parent
        notes = evidence_notes(verdicts, stand_in_of(folder) if kind == "keyshot" else None)
        records = records_from_verdicts(
            verdicts, human_labels=labels, arb_index=index, agent=args.agent, benchmark=args.benchmark
        )
        sources = {"verdicts": str(args.verdicts)}
    elif args.arb_index is not None:
        records = arb_records(args.arb_index, judge=args.arb_judge, parse_mode=args.arb_parse_mode)
        notes = []
        sources = {"arb_judge": args.arb_judge or "(the only one)", "arb_parse_mode": args.arb_parse_mode}
    else:
        raise KeyshotError("give a verdict file, or --arb-index to score released records")
    for name in ("human_labels", "arb_index"):
        if getattr(args, name) is not None:
            sources[name] = str(getattr(args, name))
    report = compute_metrics(records, label_2=args.label_2, sources=sources)
    report.notes = notes
    require_compared(report)
    paths = write_metrics(report, args.out)
    print(metrics_markdown(report))
    if args.verdicts is not None:  # p_success against the truth, every input counted
        stand_in = stand_in_of(folder) if kind == "keyshot" else None
        text, more = write_operating_point(records, args.out, labels, index, stand_in=stand_in, **options)
        print(text)
        paths.update(more)
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def require_compared(report: MetricsReport) -> None:
    """Refuse a report that compares nothing: no record had a truth to join."""
    if report.n_used:
        return
    dropped = ", ".join(f"{reason} {n}" for reason, n in report.dropped.items()) or "none"
    if NO_READABLE_SCORES in report.dropped or INCOMPLETE in report.dropped:
        advice = " ".join(report.notes) or "re-run keyshot judge to retry the failed calls"
    elif "no_human_label" in report.dropped:
        advice = (
            "give the human labels with --human-labels FILE (Online-Mind2Web human_label.json, {task_id: 0|1} "
            "JSON or task_id,label[,agent] CSV), or for AgentRewardBench --arb-index INDEX.csv"
        )
    else:
        advice = "every truth is unsure or not executable (--label-2 decides how not executable counts)"
    raise MetricsInputError(
        f"nothing to compare: {report.n_records} records, none with a usable verdict and truth (dropped: "
        f"{dropped}); {advice}"
    )


def write_verdict_metrics(
    verdicts_path: Path,
    out: Path,
    *,
    human_labels: Path | None = None,
    arb_index: Path | None = None,
    label_2: str = "not_success",
) -> int:
    """Metrics of a verdict file against human labels, printed and written to ``out``; the exit code."""
    args = argparse.Namespace(
        verdicts=verdicts_path,
        human_labels=human_labels,
        arb_index=arb_index,
        arb_judge=None,
        arb_parse_mode="reference",
        agent=None,
        benchmark=None,
        label_2=label_2,
        out=out,
    )
    return run(args)


COMMAND = Command(
    "metrics",
    help="success rate, agreement, SR gap, precision/recall/F1 against the truth (human labels or the "
    "runs' own reward)",
    description=__doc__,
    arguments=_configure,
    run=run,
)
