"""keyshot.infer.common.processes: the one home of stopping a process, dying with the parent, a free
port, and the process-wide registries a fork renews."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from keyshot.infer.common.processes import PerProcess, free_port, pid_alive, stop_process


def _in_forked_child(check) -> int:
    """Fork; in the child run ``check()`` (True: exit 0) with a watchdog; the child's exit code."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 1
        try:
            code = 0 if check() else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _held_by_a_thread(lock) -> tuple[threading.Event, threading.Event]:
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(10)
    return held, release


#: The process-wide registries of keyshot's modules other than reward.shared's and reward.model's: each a
#: PerProcess, and whether a forked child keeps its entries (facts about files, warnings already said) or
#: starts over (the verl adapter's state of models the child cannot use)
REGISTRIES = [
    ("keyshot.frameworks.verl.state", "_states", False),
    ("keyshot.env.miniwob.setup", "_prepared", True),
    ("keyshot.reward.logs", "_warned", True),
]


@pytest.mark.parametrize(("module", "name", "kept"), REGISTRIES)
def test_a_fork_while_a_thread_holds_a_registry_lock_leaves_the_child_a_free_lock(module, name, kept):
    """The parent's thread that held the lock at the fork does not exist in the child: with a plain
    threading.Lock the child's first use waited forever (this test's child timed out on that code). Each
    registry is a PerProcess, whose one fork hook renews its lock and, unless it keeps them, its entries
    (logs' had no lock at all, setup's and verl_state's were a ForkSafeLock beside a dict of their own)."""
    import importlib

    registry = getattr(importlib.import_module(module), name)
    assert isinstance(registry, PerProcess)
    parents = registry.items
    _, release = _held_by_a_thread(registry.lock)
    try:
        code = _in_forked_child(
            lambda: registry.lock.acquire(timeout=5) and (registry.items is parents) == kept
        )
    finally:
        release.set()
    assert code == 0, (
        f"{module}.{name}: in the forked child, its lock was held or its entries were not as declared"
    )


def test_the_shared_reward_registry_starts_over_in_a_forked_child():
    from keyshot.reward import shared

    sentinel = object()
    _, release = _held_by_a_thread(shared._batchers.lock)
    shared._batchers.items["parent-config"] = sentinel
    try:
        code = _in_forked_child(
            lambda: shared._batchers.lock.acquire(timeout=5) and not shared._batchers.items
        )
    finally:
        release.set()
        shared._batchers.items.pop("parent-config", None)
    assert code == 0


def test_a_registry_hands_the_parents_items_to_forget_in_the_child():
    forgotten: list[dict] = []
    registry = PerProcess(dict, forget=forgotten.append)
    registry.items["model"] = "parent's"
    code = _in_forked_child(lambda: forgotten == [{"model": "parent's"}] and registry.items == {})
    assert code == 0 and registry.items == {"model": "parent's"}  # the parent keeps its own


def test_stop_process_kills_what_ignores_sigterm_and_its_group():
    """SIGTERM, the grace, then SIGKILL of the whole group: a grandchild that outlived its parent goes too."""
    script = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    grandchild = int(proc.stdout.readline())
    t0 = time.monotonic()
    code = stop_process(proc, 0.5, group=True)
    assert code == -signal.SIGKILL and time.monotonic() - t0 < 15
    deadline = time.monotonic() + 10
    while pid_alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.05)  # the grandchild is re-parented to init, which reaps it
    assert not pid_alive(grandchild)
    proc.stdout.close()


def test_stop_process_lets_a_process_that_stops_on_sigterm_exit_by_itself():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert stop_process(proc, 10) == -signal.SIGTERM


def test_free_port_can_be_bound():
    import socket

    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_freed_large_buffers_go_back_to_the_system_and_setting_it_twice_is_harmless():
    """keyshot reward env fixes glibc's mmap threshold (bench/step_buffers.py: 35.9 -> 7.4 MiB a
    session): in a process of its own, a 16 MiB block freed after it is unmapped at once, so the RSS falls
    back; with glibc's own threshold a freed block of that size raises the threshold and the next one stays."""
    code = """
import sys, psutil
from keyshot.infer.common.processes import return_large_buffers
assert return_large_buffers() and return_large_buffers()  # again: the same settings, no error
rss = lambda: psutil.Process().memory_info().rss
before = rss()
for _ in range(3):
    block = bytearray(16 << 20)
    del block
print((rss() - before) / 2**20)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 4  # nothing of the 16 MiB blocks stays
