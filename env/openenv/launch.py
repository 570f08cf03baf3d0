"""``keyshot reward env`` started as a process of its own, and the URL it serves read from its first line
(for tests and benches, which run the server in the OpenEnv venv and its clients elsewhere). Imports
nothing of OpenEnv."""

from __future__ import annotations

import os
import re
import select
import subprocess
from pathlib import Path

#: The server's first line names where it listens: ``... on http://HOST:PORT (...)``.
SERVED = re.compile(r"on (http://\S+)")


def start_env(python: str | os.PathLike, config: Path, *extra: str, stderr) -> subprocess.Popen:
    """``PYTHON -m keyshot.infer.cli reward env --config CONFIG --port 0 EXTRA...`` (a free port; the first
    line says which), its stdout read by :func:`served_url`, its stderr to ``stderr``."""
    command = [str(python), "-m", "keyshot.infer.cli", "reward", "env", "--config", str(config)]
    return subprocess.Popen(
        [*command, "--port", "0", *extra], stdout=subprocess.PIPE, stderr=stderr, text=True
    )


def first_line(proc: subprocess.Popen, timeout_s: float, what: str = "keyshot reward env") -> str:
    """The first line ``proc`` writes to its stdout. Raises RuntimeError when it says nothing within
    ``timeout_s`` or ends first."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    if not ready:
        raise RuntimeError(f"{what} said nothing in {timeout_s:g} s")
    line = proc.stdout.readline()
    if not line:
        raise RuntimeError(f"{what} ended (exit {proc.wait()}) before it said anything")
    return line


def served_url(proc: subprocess.Popen, timeout_s: float = 180) -> str:
    """The URL the server names in its first line. Raises RuntimeError when it says nothing within
    ``timeout_s``, ends first, or its line names no URL (its stderr says why)."""
    line = first_line(proc, timeout_s)
    url = SERVED.search(line)
    if not url:
        raise RuntimeError(f"keyshot reward env's first line names no URL: {line.strip()!r}")
    return url[1]
