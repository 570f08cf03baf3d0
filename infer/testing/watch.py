"""Watching a process a test or bench started: waiting for a moment while it runs, killing it at that
moment (a run stopped by ``kill -9`` mid-write, then resumed), and the lines a run has written so far."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def line_count(path: Path) -> int:
    """The whole lines of ``path`` (0 before it exists): what a run has written so far."""
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait_until(
    ready: Callable[[], bool], what: str, timeout_s: float = 60.0, *, proc: subprocess.Popen | None = None
) -> None:
    """Return once ``ready()`` holds (``what`` says what it waits for). Raises RuntimeError, naming
    ``what``, when it does not hold within ``timeout_s`` or when ``proc`` (the process that should bring it
    about) ends first."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process ended (exit code {proc.returncode}) before {what}")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"not {what} within {timeout_s:g} s")
        time.sleep(0.02)


def kill_when(proc: subprocess.Popen, ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """SIGKILL ``proc`` as soon as ``ready()`` holds while it runs, and reap it. Raises RuntimeError when
    it ends first, or by itself before the kill lands: a kill at a moment nobody meant (after the run
    ended, or before ``what``) proves nothing."""
    wait_until(ready, what, timeout_s, proc=proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    if proc.returncode != -signal.SIGKILL:
        raise RuntimeError(f"the process ended by itself (exit code {proc.returncode}) before the kill")
