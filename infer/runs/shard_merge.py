"""How the shards of a run merge: the steps ``keyshot merge`` (verdict shards) and ``keyshot synth merge``
(label shards) share.

``RUN/shard-I-of-N/`` folders (:mod:`keyshot.infer.runs.shards`) join into ``RUN`` under its lock:

1. **Check every shard** (:func:`check_shards`): each must have finished (not running, no half-written
   line, a ``summary.json``) and pass its kind's own check. One that never ran or fails is named by
   number, with the command that re-runs it, and nothing is written.
2. **Refuse a foreign output**: a data file in ``RUN`` that no merge wrote is never overwritten.
3. **Stream the data files** (:func:`stream_shards`) one after the other into one atomic output, so
   memory stays flat and a killed merge leaves the previous merge's file whole.

What differs by kind stays with the kind: how shards must agree (the judge's protocol, synthesis's
manifest), what else is merged (summary and metrics; usage files and the dataset).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from keyshot.infer.common.fileio import atomic_output
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.shards import ShardError, find_shards, refuse_unmergeable, unfinished
from keyshot.infer.runs.summary import read_summary

Part = TypeVar("Part")


@dataclass(frozen=True)
class Shard:
    """One finished shard: its number, its folder and its ``summary.json``."""

    index: int
    folder: Path
    summary: dict


@dataclass(frozen=True)
class ShardKind:
    """What the merge of one kind of shard needs to know.

    ``command``: the merging command (``keyshot merge``); ``data_file``: the file each shard appends to
    and the merge writes; ``rerun``: one shard's command and the SLURM script that runs them
    (``keyshot judge … | slurm/judge.sh``); ``problem``: why a finished shard still cannot be merged,
    or None; ``foreign``: what a data file that no merge wrote may be, and what to do
    (``(a run without --shard?); move it away``).
    """

    command: str
    data_file: str
    rerun: str
    problem: Callable[[Shard], str | None]
    foreign: str


def check_shards(run: Path, kind: ShardKind) -> list[Shard]:
    """Every shard of ``run``, in order; raises naming every shard that never ran, did not finish or
    fails ``kind.problem``."""
    count, folders = find_shards(run)
    shards: list[Shard] = []
    problems: dict[int, str] = {}
    for index, folder in sorted(folders.items()):
        why = unfinished(folder, kind.data_file, kind.command)
        shard = Shard(index, folder, read_summary(folder) or {})
        if why is None:
            why = kind.problem(shard)
        if why is None:
            shards.append(shard)
        else:
            problems[index] = why
    refuse_unmergeable(run, count, folders, problems, kind.rerun)
    return shards


@contextmanager
def merging(run: Path, kind: ShardKind) -> Iterator[list[Shard]]:
    """Hold ``run``'s lock while its checked shards (:func:`check_shards`) are merged."""
    run = Path(run)
    find_shards(run)  # before the lock, which would create a folder that is not there
    with RunLock(run, what=kind.command):
        yield check_shards(run, kind)


def copy_shard(path: Path, writer: BinaryIO) -> None:
    """Copy one shard's data file as bytes (a shard that owned nothing may have none)."""
    if not path.is_file():
        return
    with open(path, "rb") as fh:
        shutil.copyfileobj(fh, writer)


def stream_shards(
    run: Path,
    shards: list[Shard],
    kind: ShardKind,
    *,
    merged_before: bool,
    write: Callable[[Shard, Path, BinaryIO], Part],
) -> list[Part]:
    """Write every shard's data file, in shard order, into ``run/<data_file>`` (atomically, synced) with
    ``write(shard, its data file, writer)``; returns what ``write`` says of each shard. Refuses a data file
    already in ``run`` unless a merge wrote it (``merged_before``)."""
    merged = run / kind.data_file
    if merged.exists() and not merged_before:
        raise ShardError(
            f"{merged} exists and was not written by {kind.command} {kind.foreign}, nothing was merged"
        )
    with atomic_output(merged, sync=True) as writer:
        return [write(shard, shard.folder / kind.data_file, writer) for shard in shards]
