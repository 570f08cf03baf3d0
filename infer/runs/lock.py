"""One writer per run folder: an exclusive lock held by ``keyshot judge``, ``synth`` and ``report``.

The lock is ``RUN/.lock``, an ``flock`` that the kernel releases when its holder dies (``kill -9``
included); the file says who holds it (pid, host, command, start time). A second process fails at
once naming the holder (:class:`RunLockedError`, exit 2), or waits for it with ``wait=True``. A lock
file left by a process that is gone is taken over with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import pid_alive

logger = logging.getLogger(__name__)

LOCK_FILE = ".lock"


class RunLockedError(KeyshotError):
    """Another process holds the run folder."""


def _describe(holder: dict) -> str:
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('started', '?')}: "
        f"{holder.get('command', '?')}"
    )


class RunLock:
    """``with RunLock(run_dir):`` — the exclusive right to write in ``run_dir``.

    Args:
        run_dir: the run folder (created if missing).
        wait: block until the holder lets go instead of failing at once.
        what: the command, for the message a second process sees.
    """

    def __init__(self, run_dir: str | os.PathLike, *, wait: bool = False, what: str | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self.wait = wait
        self.what = what or " ".join(Path(a).name if i == 0 else a for i, a in enumerate(sys.argv))
        self._fd: int | None = None

    def _read_holder(self, fd: int) -> dict:
        with contextlib.suppress(OSError, ValueError):
            os.lseek(fd, 0, os.SEEK_SET)
            raw = os.read(fd, 1 << 16)
            data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
            return data if isinstance(data, dict) else {}
        return {}

    def __enter__(self) -> RunLock:
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise KeyshotError(
                f"{self.run_dir}: cannot use it as a run folder ({exc.strerror or exc}); "
                "choose a writable folder with --out"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._read_holder(fd)
            if not self.wait:
                os.close(fd)
                raise RunLockedError(
                    f"{self.run_dir}: another keyshot process is writing here ({_describe(holder)}); "
                    "wait for it, stop it, pass --wait, or choose another --out"
                ) from None
            logger.warning("%s is in use by %s; waiting for it", self.run_dir, _describe(holder))
            fcntl.flock(fd, fcntl.LOCK_EX)
        previous = self._read_holder(fd)
        pid = previous.get("pid")
        if isinstance(pid, int) and previous.get("host") == socket.gethostname() and not pid_alive(pid):
            logger.warning(
                "%s: taking over a stale lock left by %s (that process is gone)",
                self.run_dir,
                _describe(previous),
            )
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "command": self.what,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, (json.dumps(me) + "\n").encode("utf-8"))
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
