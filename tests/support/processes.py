"""Processes a test started, and whether they ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable

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


def wait_until(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Return once ``ready()`` holds while ``proc`` still runs (``what`` says what it waits for); fail the
    test, naming ``what``, when ``proc`` ends first or ``ready()`` does not hold within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        code = proc.poll()
        assert code is None, f"the process ended (exit code {code}) before {what}"
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:g} s"
        time.sleep(0.02)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds (:func:`wait_until`), and reap it: a test that kills a
    process mid-run fails rather than kill it at a moment it did not mean to (after the run ended, or
    before ``what``)."""
    wait_until(proc, ready, what, timeout_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, f"the process ended by itself (exit code {proc.returncode})"
