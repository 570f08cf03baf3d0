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
import sys
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.helptext import plain
from keyshot.infer.common.logs import setup_logging
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
    parser.set_defaults(func=run)
    return parser


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``metrics`` on a ``keyshot`` subcommand parser."""
    parser = subparsers.add_parser(
        "metrics",
        help="success rate, agreement, SR gap, precision/recall/F1 against the truth (human labels or the "
        "runs' own reward)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return _configure(parser)


def run(args: argparse.Namespace) -> int:
    try:
        if args.verdicts is not None:
            verdicts, kind = load_verdicts(args.verdicts)
            folder = args.verdicts if args.verdicts.is_dir() else args.verdicts.parent
            notes = evidence_notes(verdicts, stand_in_of(folder) if kind == "keyshot" else None)
            labels = load_human_labels(args.human_labels) if args.human_labels else None
            index = load_arb_index(args.arb_index) if args.arb_index else None
            records = records_from_verdicts(
                verdicts, human_labels=labels, arb_index=index, agent=args.agent, benchmark=args.benchmark
            )
            sources = {"verdicts": str(args.verdicts)}
        elif args.arb_index is not None:
            records = arb_records(args.arb_index, judge=args.arb_judge, parse_mode=args.arb_parse_mode)
            notes = []
            sources = {"arb_judge": args.arb_judge or "(the only one)", "arb_parse_mode": args.arb_parse_mode}
        else:
            print("error: give a verdict file, or --arb-index to score released records", file=sys.stderr)
            return 2
        for name in ("human_labels", "arb_index"):
            if getattr(args, name) is not None:
                sources[name] = str(getattr(args, name))
        report = compute_metrics(records, label_2=args.label_2, sources=sources)
        report.notes = notes
        require_compared(report)
        paths = write_metrics(report, args.out)
    except KeyshotError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    print(metrics_markdown(report))
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


def main(argv: list[str] | None = None) -> int:
    parser = _configure(
        argparse.ArgumentParser(
            prog="keyshot metrics",
            description=plain(__doc__),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )
    setup_logging()
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
