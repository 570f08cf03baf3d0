"""``keyshot merge``: join the shards of a judge run into one verdict file, summary and metrics.

    keyshot judge data/om2w --config configs/judge/webjudge7b.yaml --out runs/om2w --shard 3/8   # x8
    keyshot merge runs/om2w                                   # -> runs/om2w/verdicts.jsonl, summary.md
    keyshot merge runs/om2w --human-labels data/om2w/human_label.json   # + runs/om2w/metrics/

Refuses, naming each shard by number, shards that never ran, did not finish (killed, stopped, still
running, a half-written verdict file) or were judged under another protocol; nothing is merged then.
Trajectories a shard left incomplete are merged and listed (exit 3: re-run those shards). Merging
again after re-running a shard replaces the merged files. ``keyshot report OUT`` reads the result.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.errors import EXIT_INCOMPLETE, EXIT_OK, KeyshotError
from keyshot.infer.common.fileio import atomic_output, write_text_atomic
from keyshot.infer.common.helptext import plain
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, Verdict, VerdictFileError, verdict_key
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.run_record import RUN_FILE, protocol_differences, read_protocol
from keyshot.infer.runs.shards import (
    SUMMARY_FILE,
    ShardError,
    find_shards,
    read_summary,
    refuse_unmergeable,
    unfinished,
)
from keyshot.infer.runs.summary import combine_cut_reports, combine_summaries, summarize, summary_markdown

logger = logging.getLogger(__name__)


def check_shards(out: Path) -> tuple[int, dict[int, Path], dict[int, dict], dict]:
    """The shard count, folders, summaries and common protocol; raises naming every shard that is
    missing, unfinished or of another protocol."""
    count, folders = find_shards(out)
    problems: dict[int, str] = {}
    summaries: dict[int, dict] = {}
    protocols: dict[int, dict] = {}
    for index, folder in sorted(folders.items()):
        summary = read_summary(folder) or {}
        why = unfinished(folder, VERDICTS_FILE, "keyshot merge")
        try:
            protocol = read_protocol(folder)
        except KeyshotError as exc:  # named among the shards to re-run
            protocol, why = None, why or str(exc)
        if why is None and protocol is None:
            why = "never started judging (no run.json)"
        run = summary.get("run", {})
        if why is None and (run.get("stopped") or run.get("not_reached")):
            why = f"stopped before the end: {run.get('stopped') or 'not every trajectory reached'}"
        if why is None:
            summaries[index], protocols[index] = summary, protocol
        else:
            problems[index] = why
    refuse_unmergeable(out, count, folders, problems, "keyshot judge … | slurm/judge.sh")
    first = min(protocols)
    shard_by = {i: summaries[i].get("run", {}).get("shard_by") for i in summaries}
    if len(set(shard_by.values())) > 1:
        raise ShardError(
            f"the shards were assigned by different keys ({shard_by}): their trajectories overlap; re-run "
            "them all with one shard_by, nothing was merged"
        )
    for index, protocol in sorted(protocols.items()):
        shown = protocol_differences(protocols[first], protocol, (f"in shard {first}", f"in shard {index}"))
        if shown:
            raise ShardError(
                f"shard {index} was judged under another protocol than shard {first} ({shown}); "
                "re-run it with the same config, nothing was merged"
            )
    return count, folders, summaries, protocols[first]


def _last_lines(path: Path) -> dict[tuple[str, str, str], int]:
    """Pass 1: the number of the line holding each trajectory's last verdict (a re-judged trajectory's
    newer line supersedes the older one)."""
    last: dict[tuple[str, str, str], int] = {}
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if raw.strip():
                try:
                    obj = json.loads(raw)
                    last[verdict_key(obj["task_id"], obj.get("agent"), obj.get("run"))] = number
                except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
                    raise VerdictFileError(f"{path}:{number}: not a keyshot verdict ({exc})") from None
    return last


def _count_lines(path: Path) -> int:
    with open(path, "rb") as fh:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))


def _latest(path: Path, writer: BinaryIO) -> Iterator[Verdict]:
    """The latest verdict of each trajectory in one shard's file (two passes), written to ``writer``."""
    last = _last_lines(path)
    with open(path, "rb") as fh:
        for number, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            obj = json.loads(raw)
            key = verdict_key(obj["task_id"], obj.get("agent"), obj.get("run"))
            if last.get(key) != number:
                continue  # superseded by a later line of the same trajectory
            writer.write(raw if raw.endswith(b"\n") else raw + b"\n")
            yield Verdict.from_dict(obj)


def _merge_files(folders: dict[int, Path], summaries: dict[int, dict], writer: BinaryIO) -> list[dict]:
    """Write every shard's latest verdicts to ``writer``; returns each shard's summary of them.

    A shard whose file holds exactly one line per trajectory its summary counts (nothing was judged
    again, nothing appended since) is copied as bytes and its own summary is used; any other is read
    and summarised again, line by line, its superseded lines left out.
    """
    parts = []
    for index, folder in sorted(folders.items()):
        path = folder / VERDICTS_FILE
        if not path.is_file():
            parts.append(summarize([], run={}))
        elif _count_lines(path) == summaries[index].get("trajectories"):
            with open(path, "rb") as fh:
                shutil.copyfileobj(fh, writer)
            parts.append(summaries[index])
        else:
            parts.append(summarize(_latest(path, writer), run={}))
    return parts


def merge_shards(out: Path) -> dict:
    """Merge ``out/shard-I-of-N/`` into ``out``; returns the merged summary (with ``markdown``)."""
    t0 = time.perf_counter()
    out = Path(out)
    find_shards(out)  # before the lock, which would create a folder that is not there
    with RunLock(out, what="keyshot merge"):
        count, folders, summaries, protocol = check_shards(out)
        merged_path = out / VERDICTS_FILE
        previous = read_summary(out)
        if merged_path.exists() and not (previous or {}).get("run", {}).get("merged_shards"):
            raise ShardError(
                f"{merged_path} exists and was not written by keyshot merge (a run without --shard?); "
                "move it away or merge shards of another --out, nothing was merged"
            )
        runs = [summaries[i]["run"] for i in sorted(summaries)]
        run = {
            "merged_shards": count,
            "found": max((r.get("found") or 0) for r in runs),
            "judged": sum(r.get("judged", 0) for r in runs),
            "skipped": sum(r.get("skipped", 0) for r in runs),
            "not_reached": 0,
            "load_errors": sum(r.get("load_errors", 0) for r in runs),
            "load_error_messages": [m for r in runs for m in r.get("load_error_messages", [])],
            "not_trajectories": sum(r.get("not_trajectories", 0) for r in runs),
            "not_trajectory_messages": [m for r in runs for m in r.get("not_trajectory_messages", [])],
            "duplicates": [m for r in runs for m in r.get("duplicates", [])],
            "seconds": 0.0,
            "shard_seconds": {i: summaries[i]["run"].get("seconds") for i in sorted(summaries)},
            "stopped": None,
            "exit_code": None,
            "cut_answers": combine_cut_reports([r.get("cut_answers") or [] for r in runs]),
            "ledger": UsageLedger.summed([r.get("ledger") or {} for r in runs]).as_dict(),
            "config": runs[0].get("config"),
        }
        with atomic_output(merged_path, sync=True) as writer:
            summary = combine_summaries(_merge_files(folders, summaries, writer), run=run)
        write_text_atomic(out / RUN_FILE, json.dumps({"protocol": protocol}, indent=2) + "\n")
        summary["run"]["seconds"] = time.perf_counter() - t0
        ledger = UsageLedger.summed([run["ledger"]])
        markdown = summary_markdown(summary, ledger.table() if ledger.names() else "")
        write_text_atomic(out / SUMMARY_FILE, json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        write_text_atomic(out / "summary.md", markdown)
    summary["markdown"] = markdown
    return summary


# ---------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "merge",
        help="join the shards of a judge run (OUT/shard-I-of-N) into OUT/verdicts.jsonl + summary",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("out", type=Path, help="the --out folder the shards were judged into")
    p.add_argument(
        "--human-labels", type=Path, help="Online-Mind2Web human_label.json: also write OUT/metrics"
    )
    p.add_argument("--arb-index", type=Path, help="AgentRewardBench index.csv: also write OUT/metrics")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        summary = merge_shards(args.out)
    except KeyshotError as exc:
        print(f"keyshot merge: {exc}", file=sys.stderr)
        return exc.exit_code
    print(summary["markdown"])
    print(f"verdicts: {args.out / VERDICTS_FILE}")
    if args.human_labels or args.arb_index:
        from keyshot.infer.metrics.command import write_verdict_metrics

        code = write_verdict_metrics(
            args.out / VERDICTS_FILE,
            args.out / "metrics",
            human_labels=args.human_labels,
            arb_index=args.arb_index,
        )
        if code:
            return code
    print(f"browse it: keyshot report {args.out}")
    if summary["incomplete"]:
        print(
            f"keyshot merge: {summary['incomplete']} trajectories incomplete; re-run their shards, then merge again",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return EXIT_OK
