"""Run a command that must not outlive the process that started it (a vLLM server keyshot starts).

    python -I -m keyshot.infer.serve.process_guard [--grace-s 20] -- COMMAND [ARG ...]

The guard is started in a new session (its own process group) by :class:`keyshot.infer.serve.server.VLLMServer`.
It asks the kernel for SIGTERM when its parent dies (:func:`~keyshot.infer.common.processes.die_with_parent`;
on other systems it polls its parent id), runs COMMAND in its process group, and on SIGTERM/SIGINT or its
parent's death stops COMMAND (:func:`~keyshot.infer.common.processes.stop_process`: SIGTERM, so vLLM shuts
its engine down cleanly, then SIGKILL after ``--grace-s``), then SIGKILLs the rest of its group, so vLLM's
engine-core and worker processes go too. It exits with COMMAND's exit code. It imports nothing but the
standard library and keyshot.infer.common.processes (itself standard library only): it runs with ``-I``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from keyshot.infer.common.processes import die_with_parent, stop_process


def _kill_group() -> None:
    """SIGKILL every other process of this group (children of the command that outlived it)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    me, group = os.getpid(), os.getpgrp()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            if os.getpgid(int(entry)) == group:
                os.kill(int(entry), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="process_guard", description=__doc__.splitlines()[0])
    parser.add_argument("--grace-s", type=float, default=20.0)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")
    parent = os.getppid()
    die_with_parent()  # where it cannot be armed, the parent-id poll below still catches it
    if os.getppid() != parent:  # the parent died before the death signal was armed
        return 1
    stop_requested: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stop_requested.append(signum))
    signal.signal(signal.SIGINT, lambda signum, frame: stop_requested.append(signum))
    child = subprocess.Popen(command)
    while True:
        try:
            code = child.wait(timeout=1.0)
            break
        except subprocess.TimeoutExpired:
            pass
        if stop_requested or os.getppid() != parent:
            stop_process(child, args.grace_s, what="the guarded command")
            code = child.wait()
            break
    time.sleep(0.1)
    _kill_group()
    return 128 + stop_requested[0] if stop_requested and code < 0 else (code if code >= 0 else 128 - code)


if __name__ == "__main__":
    sys.exit(main())
