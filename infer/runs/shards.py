"""Deterministic shards of a run, and the checks a shard passes before it is merged.

``keyshot judge … --shard I/N`` judges the trajectories whose shard key hashes to ``I`` (of ``N``) and
writes them to ``OUT/shard-I-of-N/`` (its own verdicts, summary, call cache and lock), so N processes,
e.g. the N tasks of a SLURM job array, work side by side without sharing a file. The shard of a
trajectory depends only on its own key (sha256, not list order): adding trajectories to the input does
not move the others, and a re-submitted array finds each shard's finished verdicts where it left them.

The default key is the task id: every trajectory of one task lands in one shard, so the calls they
share (the task's key points, the same start page's score) are paid once, exactly as in one process.
``shard_by: trajectory`` spreads the runs of one task too (many rollouts of few tasks).

How the N folders are merged (verdicts and labels alike): :mod:`keyshot.infer.runs.shard_merge`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import torn_tail
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.verdicts import verdict_key
from keyshot.infer.runs.lock import RunLock, RunLockedError
from keyshot.infer.runs.summary import read_summary

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")
_FOLDER = re.compile(r"^shard-(\d+)-of-(\d+)$")


class ShardError(KeyshotError):
    """A shard spec that does not parse, or shard folders that cannot be merged."""


def shard_of(key: str, count: int) -> int:
    """The shard (0-based, of ``count``) that owns ``key``: a stable hash, the same in every process."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True)
class ShardSpec:
    """Shard ``index`` of ``count`` (0-based, as SLURM's ``SLURM_ARRAY_TASK_ID``)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str, environ: Mapping[str, str] | None = None) -> ShardSpec:
        """``"3/8"`` → shard 3 of 8 (0-based); ``"slurm"`` → this array task's shard (:meth:`from_slurm`)."""
        if (text or "").strip().lower() == "slurm":
            return cls.from_slurm(os.environ if environ is None else environ)
        m = _SPEC.match(text or "")
        if not m:
            raise ShardError(f"--shard {text!r}: expected I/N, e.g. 0/8 (shard I of N, counted from 0)")
        index, count = int(m.group(1)), int(m.group(2))
        if count < 1 or not 0 <= index < count:
            raise ShardError(f"--shard {text!r}: I must be within 0..N-1 and N >= 1")
        return cls(index, count)

    @classmethod
    def from_slurm(cls, environ: Mapping[str, str]) -> ShardSpec:
        """The shard of a SLURM array task: I = ``SLURM_ARRAY_TASK_ID``; N = ``SHARDS`` when set, else the
        array's size, which is only the shard count for a whole ``--array=0-(N-1)``."""
        if "SLURM_ARRAY_TASK_ID" not in environ:
            raise ShardError(
                "--shard slurm: not a SLURM array task (no SLURM_ARRAY_TASK_ID); use --shard I/N"
            )
        index = int(environ["SLURM_ARRAY_TASK_ID"])
        if environ.get("SHARDS"):
            return cls.parse(f"{index}/{environ['SHARDS']}")
        low, high = (
            int(environ.get("SLURM_ARRAY_TASK_MIN", 0)),
            int(environ.get("SLURM_ARRAY_TASK_MAX", index)),
        )
        count = int(environ.get("SLURM_ARRAY_TASK_COUNT", high + 1))
        if low != 0 or high + 1 != count:
            raise ShardError(
                f"--shard slurm: the array ({low}-{high}, {count} tasks) is not 0-(N-1), so its size is not the "
                "shard count; re-submit with it: sbatch --array=... --export=ALL,SHARDS=N ..."
            )
        return cls.parse(f"{index}/{count}")

    @property
    def folder(self) -> str:
        width = len(str(self.count - 1))
        return f"shard-{self.index:0{width}d}-of-{self.count}"

    def owns(self, key: str) -> bool:
        return shard_of(key, self.count) == self.index

    def holds(self, trajectory: Trajectory, by: str = "task") -> bool:
        """Whether ``trajectory`` is this shard's (by its task, or its whole identity: :func:`shard_key`)."""
        return self.owns(shard_key(trajectory.task_id, trajectory.agent, trajectory.run, by))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_key(task_id: str, agent: str | None, run: str | None, by: str) -> str:
    """What a trajectory is sharded by: its task (default) or its whole identity."""
    if by == "task":
        return str(task_id)
    return json.dumps(verdict_key(task_id, agent, run))


def find_shards(out: Path) -> tuple[int, dict[int, Path]]:
    """The shard count and ``{index: folder}`` of the shard folders in ``out``."""
    found: dict[int, dict[int, Path]] = {}
    if out.is_dir():
        for child in sorted(out.iterdir()):
            m = _FOLDER.match(child.name)
            if m and child.is_dir():
                found.setdefault(int(m.group(2)), {})[int(m.group(1))] = child
    if not found:
        raise ShardError(f"{out}: no shard folders (shard-I-of-N/); run keyshot judge with --shard I/N first")
    if len(found) > 1:
        counts = ", ".join(f"{n} ({len(f)} folders)" for n, f in sorted(found.items()))
        raise ShardError(
            f"{out}: shard folders of different shard counts: {counts}; merge one count (move the others away)"
        )
    count, shards = next(iter(found.items()))
    return count, shards


def unfinished(folder: Path, data_file: str, what: str) -> str | None:
    """Why the shard in ``folder`` cannot be merged yet (still running, killed mid-write, never finished),
    or None. ``data_file`` is the file its writer appends to; ``what`` the merging command."""
    try:
        with RunLock(folder, what=what):
            pass
    except RunLockedError as exc:
        return f"still running ({exc})"
    path = folder / data_file
    if path.is_file() and torn_tail(path):
        return f"{path} ends in a half-written line (the shard was killed)"
    if read_summary(folder) is None:
        return "did not finish (no summary.json: killed, or still starting)"
    return None


def refuse_unmergeable(
    out: Path, count: int, folders: dict[int, Path], problems: dict[int, str], rerun: str
) -> None:
    """Raise, naming every shard by number, when one never ran or has a problem; ``rerun`` is the
    command of one shard (``keyshot judge … --shard I/N``) and the script of the SLURM array."""
    missing = [i for i in range(count) if i not in folders]
    if not missing and not problems:
        return
    lines = [f"{out}: cannot merge {count} shards:"]
    if missing:
        lines.append(f"  shards that never ran: {', '.join(map(str, missing))}")
    lines += [f"  shard {i}: {why}" for i, why in sorted(problems.items())]
    redo = ",".join(map(str, sorted({*missing, *problems})))
    command, script = rerun.split(" | ")
    lines.append(
        f"re-run them ({command} --shard I/{count}; on SLURM: sbatch --array={redo} --export=ALL,SHARDS={count} "
        f"{script} …), then merge again; nothing was merged"
    )
    raise ShardError("\n".join(lines))
