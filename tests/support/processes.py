"""Whether the processes a test saw have ended (waiting for a moment and killing a process at it:
keyshot.infer.testing.watch)."""

from __future__ import annotations

import contextlib

import psutil


def gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    """The processes of ``pids`` still running after waiting up to ``within_s`` for them to end (a zombie
    counts as ended: its parent has not reaped it yet)."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    _, alive = psutil.wait_procs(procs, timeout=within_s)
    left = []
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(proc.pid)
    return left
