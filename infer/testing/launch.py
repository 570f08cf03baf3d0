"""keyshot's servers started as processes of their own for tests and benches (``keyshot reward serve``;
``keyshot reward env``, in the OpenEnv venv), each on a port the kernel chooses (``--port 0``) and handed
over once its first line says where it listens; and the one reader of a process's output lines (a
server's, a framework driver's answers)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.processes import stop_process

#: Where both servers say they listen: ``... listening on http://HOST:PORT (...)``, ``... on http://HOST:PORT (OpenEnv; ...)``
SERVED = re.compile(r" on (http://\S+)")


class OutputLines:
    """The lines a process writes to its stdout (a text pipe), read on a thread of their own as they come:
    the pipe never fills while nobody looks, and a caller waits for a line instead of sleeping."""

    def __init__(self, proc: subprocess.Popen, what: str = "the process"):
        self.proc = proc
        self.what = what
        self.lines: list[str] = []
        self._next = 0  # the first line :meth:`wait_for` looks at
        self._ended = False
        self._changed = threading.Condition()
        threading.Thread(target=self._read, name="output-lines", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self.proc.stdout:
                with self._changed:
                    self.lines.append(line)
                    self._changed.notify_all()
        except ValueError:  # the owner closed the pipe (its process stopped): the output ended
            pass
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def wait_for(self, text: str = "", timeout_s: float = 60.0) -> str:
        """The next line holding ``text`` (``""``: the next line), after the last one this returned. Raises
        RuntimeError, with the output so far, when the process closes its output or ``timeout_s`` passes
        first."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for i in range(self._next, len(self.lines)):
                    if text in self.lines[i]:
                        self._next = i + 1
                        return self.lines[i]
                left = deadline - time.monotonic()
                if self._ended or left <= 0:
                    break
                self._changed.wait(left)
        why = f"ended (exit code {self._exit_code()})" if self._ended else f"said nothing in {timeout_s:g} s"
        output = self.text()[-4000:]
        raise RuntimeError(f"{self.what} {why} before a line with {text!r}; its output: {output!r}")

    def _exit_code(self) -> int | None:
        try:
            return self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None

    def text(self) -> str:
        """Everything read so far."""
        with self._changed:
            return "".join(self.lines)


@dataclass
class Served:
    """A server started by :func:`start_reward_serve` or :func:`start_reward_env`: its process, the URL it
    listens on, its output lines. As a context manager, it is stopped (SIGTERM, then SIGKILL) at the end."""

    proc: subprocess.Popen
    url: str
    output: OutputLines

    def stop(self, grace_s: float = 30.0) -> int | None:
        return stop_process(self.proc, grace_s, what=self.output.what)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _served(argv: list[str], what: str, timeout_s: float, **popen) -> Served:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, **popen)
    output = OutputLines(proc, what)
    try:
        url = SERVED.search(output.wait_for(" on http://", timeout_s))[1]
    except BaseException:
        stop_process(proc, 5, what=what)
        raise
    return Served(proc, url, output)


def start_reward_serve(
    config: Path,
    allow_root: Path,
    *extra: str,
    python: str | os.PathLike = sys.executable,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    timeout_s: float = 60.0,
) -> Served:
    """``keyshot reward serve --config CONFIG --port 0 --allow-root ROOT EXTRA...``, its stderr with its
    stdout (:attr:`Served.output`), once it listens."""
    argv = [str(python), "-m", "keyshot.infer.cli", "reward", "serve", "--config", str(config), "--port", "0"]
    argv += ["--allow-root", str(allow_root), *extra]
    return _served(argv, "keyshot reward serve", timeout_s, stderr=subprocess.STDOUT, env=env, cwd=cwd)


def start_reward_env(
    python: str | os.PathLike, config: Path, *extra: str, stderr, timeout_s: float = 180.0
) -> Served:
    """``PYTHON -m keyshot.infer.cli reward env --config CONFIG --port 0 EXTRA...`` (PYTHON: the OpenEnv
    venv's, :mod:`keyshot.infer.testing.frameworks`), its stderr to ``stderr`` (a file), once it listens."""
    argv = [str(python), "-m", "keyshot.infer.cli", "reward", "env", "--config", str(config), "--port", "0"]
    return _served([*argv, *extra], "keyshot reward env", timeout_s, stderr=stderr)
