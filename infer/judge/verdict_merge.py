"""The merge of a judge run's shards (``keyshot judge --shard I/N`` folders ``OUT/shard-I-of-N/``) into
``OUT``: one verdict file, summary and run.json, by the steps every merge shares
(:mod:`keyshot.infer.runs.shard_merge`). ``keyshot merge`` is its command line.

Refuses, naming each shard by number, shards that never ran, did not finish (killed, stopped, still
running, a half-written verdict file), were judged under another protocol or read their trajectories
otherwise (run.json's ``inputs``: paths, format, agent, benchmark, ``--allow-outside``), each naming the
field; nothing is merged then. The merged run.json records the shards' protocol and inputs, so a sweep of
the merged folder reads the trajectories as the shards did. Trajectories a shard left incomplete are merged
and counted. Merging again after re-running a shard replaces the merged files.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, Verdict, VerdictFileError, verdict_key
from keyshot.infer.runs.run_record import (
    PROTOCOL,
    protocol_differences,
    read_inputs,
    read_protocol,
    record_inputs,
    write_payload,
)
from keyshot.infer.runs.shard_merge import Shard, ShardKind, copy_shard, merging, stream_shards
from keyshot.infer.runs.shards import ShardError
from keyshot.infer.runs.summary import (
    combine_cut_reports,
    combine_summaries,
    read_summary,
    summarize,
    write_summary,
)

logger = logging.getLogger(__name__)


def _problem(shard: Shard) -> str | None:
    """Why a finished verdict shard cannot be merged: no readable protocol, or it stopped early."""
    try:
        protocol = read_protocol(shard.folder)
    except KeyshotError as exc:  # named among the shards to re-run
        return str(exc)
    if protocol is None:
        return "never started judging (no run.json)"
    run = shard.summary.get("run", {})
    if run.get("stopped") or run.get("not_reached"):
        return f"stopped before the end: {run.get('stopped') or 'not every trajectory reached'}"
    return None


VERDICT_SHARDS = ShardKind(
    command="keyshot merge",
    data_file=VERDICTS_FILE,
    rerun="keyshot judge … | slurm/judge.sh",
    problem=_problem,
    foreign="(a run without --shard?); move it away or merge shards of another --out",
)


def _one_record(shards: list[Shard], read: Callable[[Path], dict | None], how: str, redo: str) -> dict | None:
    """What ``read`` finds in every shard's run.json, the same in all (None: recorded by none); raises naming
    the first shard whose record differs from the first shard's, and each field that differs."""
    records = {s.index: read(s.folder) for s in shards}
    first = min(records)
    for index, record in sorted(records.items()):
        if (record is None) != (records[first] is None):
            shown = f"recorded in shard {first if record is None else index} only (an older keyshot?)"
        else:
            names = (f"in shard {first}", f"in shard {index}")
            shown = protocol_differences(records[first] or {}, record or {}, names)
        if shown:
            raise ShardError(
                f"shard {index} {how} than shard {first} ({shown}); re-run it {redo}, nothing was merged"
            )
    return records[first]


def common_protocol(shards: list[Shard]) -> dict:
    """The protocol every shard was judged under; raises naming a shard of another protocol or shard key."""
    shard_by = {s.index: s.summary.get("run", {}).get("shard_by") for s in shards}
    if len(set(shard_by.values())) > 1:
        raise ShardError(
            f"the shards were assigned by different keys ({shard_by}): their trajectories overlap; re-run "
            "them all with one shard_by, nothing was merged"
        )
    # every shard has one here: a shard without one was refused by _problem
    return (
        _one_record(shards, read_protocol, "was judged under another protocol", "with the same config") or {}
    )


def common_inputs(shards: list[Shard]) -> dict | None:
    """How every shard read its trajectories (run.json's ``inputs``: paths, format, agent, benchmark,
    ``--allow-outside``), None when no shard recorded it; raises naming a shard that read them otherwise."""
    redo = "with the same inputs and options (a sweep of the merged folder reads them so)"
    return _one_record(shards, read_inputs, "read its trajectories otherwise", redo)


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


def _write_verdicts(shard: Shard, path: Path, writer: BinaryIO) -> dict:
    """Write one shard's latest verdicts to ``writer``; returns the shard's summary of them.

    A shard whose file holds exactly one line per trajectory its summary counts (nothing was judged
    again, nothing appended since) is copied as bytes and its own summary is used; any other is read
    and summarised again, line by line, its superseded lines left out.
    """
    if not path.is_file():
        return summarize([], run={})
    if _count_lines(path) == shard.summary.get("trajectories"):
        copy_shard(path, writer)
        return shard.summary
    return summarize(_latest(path, writer), run={})


def _merged_run(shards: list[Shard]) -> dict:
    """The merged summary's ``run``: the shards' last runs together."""
    runs = [s.summary["run"] for s in shards]
    return {
        "merged_shards": len(shards),
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
        "shard_seconds": {s.index: s.summary["run"].get("seconds") for s in shards},
        "stopped": None,
        "exit_code": None,
        "cut_answers": combine_cut_reports([r.get("cut_answers") or [] for r in runs]),
        "ledger": UsageLedger.summed([r.get("ledger") or {} for r in runs]).as_dict(),
        "config": runs[0].get("config"),
    }


def merge_shards(out: Path) -> dict:
    """Merge ``out/shard-I-of-N/`` into ``out``; returns the merged summary (with ``markdown``)."""
    t0 = time.perf_counter()
    out = Path(out)
    with merging(out, VERDICT_SHARDS) as shards:
        protocol = common_protocol(shards)
        inputs = common_inputs(shards)
        merged_before = bool((read_summary(out) or {}).get("run", {}).get("merged_shards"))
        run = _merged_run(shards)
        parts = stream_shards(out, shards, VERDICT_SHARDS, merged_before=merged_before, write=_write_verdicts)
        summary = combine_summaries(parts, run=run)
        write_payload(out, PROTOCOL, protocol)
        if inputs is not None:
            record_inputs(out, inputs)
        summary["run"]["seconds"] = time.perf_counter() - t0
        markdown = write_summary(out, summary, UsageLedger.summed([run["ledger"]]).table_if_used())
    summary["markdown"] = markdown
    return summary
