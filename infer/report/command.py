"""``keyshot report RUN [--out DIR]``: the judged run as a static site to browse, share or host.

    keyshot report runs/judged                      # writes runs/judged/report/index.html
    keyshot report runs/judged --human-labels human_label.json --out /srv/www/seeact
    keyshot report path/to/arb_webjudge/dev/records # released judge records keyshot imports

RUN is a keyshot run folder (verdicts.jsonl), a verdicts file, or released WebJudge records (the
reference implementation's output, AgentRewardBench records). Screenshots are copied as thumbnails
(cached by content: rebuilding converts nothing twice). The folder opens from disk, no server needed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.metrics.compute import load_human_labels
from keyshot.infer.runs.lock import RunLock


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", type=Path, help="run folder, verdicts.jsonl, or released judge records")
    p.add_argument("--out", type=Path, help="report folder (default: RUN/report)")
    p.add_argument("--human-labels", type=Path, help="Online-Mind2Web human_label.json for the ground truth")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--wait", action="store_true", help="wait for another process writing in --out")


def default_out(run_path: Path) -> Path:
    return (
        run_path if run_path.is_dir() and (run_path / "verdicts.jsonl").exists() else run_path.parent
    ) / "report"


def run(args: argparse.Namespace) -> int:
    from keyshot.infer.report import build_report
    from keyshot.infer.report.model import load_run

    if not args.run.exists():
        raise KeyshotError(f"{args.run}: no such run folder or file")
    out = args.out or default_out(args.run)
    labels = load_human_labels(args.human_labels) if args.human_labels else None
    run = load_run(args.run)  # before the lock: input that holds no verdicts leaves no report folder behind
    with RunLock(out, wait=args.wait, what="keyshot report"):
        index = build_report(run, out, human_labels=labels, progress=not args.no_progress)
    print(f"report: {index}  (open it in a browser; the folder is self-contained)")
    return 0


COMMAND = Command(
    "report",
    help="a browsable HTML report of a judged run (index, metrics, plots, a page per trajectory)",
    description=__doc__,
    arguments=add_arguments,
    run=run,
)
