"""The one home of keyshot's process plumbing: who holds a run folder, a free port, stopping a process,
dying with the parent, and process-wide state that a fork must not carry over.

Standard library only: :mod:`keyshot.infer.serve.process_guard` imports it under ``python -I`` beside any
environment.

* :func:`pid_alive`: whether a process runs on this host (run-folder locks, cache claims).
* :func:`free_port`: a TCP port nothing listens on now (servers started on a chosen port, tests).
* :func:`stop_process`: SIGTERM, wait, then SIGKILL (of its process group when it leads one).
* :func:`die_with_parent`: the kernel sends this process SIGTERM when its parent dies (Linux).
* :class:`PerProcess`: a process-wide registry (a mapping or set) and its lock, both new in a forked child:
  a thread of the parent may have held the lock at the fork (the child would wait for it forever), and the
  parent's entries (models whose loop threads stayed behind) are handed to ``forget`` and dropped there.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: prctl(2) option: the signal the kernel sends this process when its parent thread ends
PR_SET_PDEATHSIG = 1


def pid_alive(pid: int) -> bool:
    """True while process ``pid`` runs on this host (another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the kernel's choice; another process may take it
    before the caller binds it: a server that can bind port 0 itself should, and say the port it got)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _signal_group_or_process(proc: subprocess.Popen, signum: int, group: bool) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(proc.pid, signum)
        else:
            proc.send_signal(signum)


def stop_process(
    proc: subprocess.Popen, grace_s: float = 10.0, *, group: bool = False, what: str = "process"
) -> int | None:
    """Stop ``proc``: SIGTERM (a server shuts down cleanly), wait up to ``grace_s``, then SIGKILL and reap.

    ``group``: ``proc`` leads its own process group (``start_new_session=True``); the SIGKILL goes to the
    whole group and is sent even when ``proc`` ended in time, so children that outlived it (vLLM's engine
    core and workers) go too. Returns its exit code (``None`` when it could not be reaped)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            logger.warning("%s %d did not stop within %gs of SIGTERM; killing it", what, proc.pid, grace_s)
            _signal_group_or_process(proc, signal.SIGKILL, group)
    if group:
        _signal_group_or_process(proc, signal.SIGKILL, group=True)
    try:
        return proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return None


#: glibc's mallopt parameters (malloc.h) and the values the server sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 1 << 20
TRIM_THRESHOLD = 2 << 20


def return_large_buffers() -> bool:
    """Have glibc give every buffer of 1 MiB or more back to the system when it is freed (``mallopt``).

    In ``keyshot reward env`` (which calls it) a step's screenshot passes through several such buffers
    (the PNG, its decoded pixels, the rubric's copy) in the session's own thread. glibc raises its mmap
    threshold to the largest block freed so far, so after the first screenshot they come from per-thread
    heaps that keep what is freed: at 1920x1080 screenshots 35.9 MiB a session stayed in the server, 7.4
    MiB with the threshold fixed (the screenshot itself is 5.9: bench/step_buffers.py). Setting it
    again changes nothing. False where the C library is not glibc (nothing changed)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )


def die_with_parent(signum: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send this process ``signum`` when its parent dies (``PR_SET_PDEATHSIG``, Linux).
    Returns whether it was armed; elsewhere the caller polls ``os.getppid()``. A caller that must not
    outlive a parent which died before this call compares ``os.getppid()`` with the parent it knew."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class ForkSafeLock:
    """A ``threading.Lock`` that is a new, unheld lock in a forked child (the thread that held it at the
    fork does not exist there, so the child would otherwise wait for it forever)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _renew_in_a_forked_child(self)

    def _renew(self) -> None:
        self._lock = threading.Lock()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class PerProcess(Generic[T]):
    """Process-wide state of one module: ``items`` (made by ``factory``: a dict, a ``WeakSet`` ...) and the
    ``lock`` that guards it. In a forked child the lock is new and ``items`` starts over; the parent's
    items are first handed to ``forget`` (which makes them unusable there rather than hang). With
    ``keep_after_fork`` the items stay (facts about files, valid in the child) and only the lock is new."""

    def __init__(
        self,
        factory: Callable[[], T],
        *,
        forget: Callable[[T], None] | None = None,
        keep_after_fork: bool = False,
    ) -> None:
        self._factory = factory
        self._forget = forget
        self._keep = keep_after_fork
        self.lock = ForkSafeLock()
        self.items: T = factory()
        _renew_in_a_forked_child(self)

    def _renew(self) -> None:
        if self._keep:
            return
        old, self.items = self.items, self._factory()
        if self._forget is not None:
            self._forget(old)


#: Every ForkSafeLock and PerProcess of this process, renewed in a forked child by one hook (locks first),
#: registered with the first of them: importing keyshot registers no fork hook
_after_fork: weakref.WeakSet[Any] = weakref.WeakSet()
_hook = threading.Lock()
_hooked: list[bool] = []


def _renew_in_a_forked_child(owner: ForkSafeLock | PerProcess) -> None:
    with _hook:
        _after_fork.add(owner)
        if not _hooked and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_renew_after_fork)
            _hooked.append(True)


def _renew_after_fork() -> None:
    global _hook
    _hook = threading.Lock()
    owners = list(_after_fork)
    for owner in owners:
        if isinstance(owner, ForkSafeLock):
            owner._renew()
    for owner in owners:
        if isinstance(owner, PerProcess):
            try:
                owner._renew()
            except Exception:  # a hook must not break the child's start; the registry is empty anyway
                logger.exception("forgetting a process-wide registry after a fork failed")
