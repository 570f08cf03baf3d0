"""Live episodes: BrowserGym's MiniWoB++ tasks in headless Chromium, a :class:`~keyshot.env.page.Browser`
beside the replay, so an RL example takes either.

:class:`MiniWoBBrowser` is one *session*: a MiniWoB page in a browser context of its own, inside a
Chromium that holds many such sessions (:class:`BrowserProcess`, one worker process each: ``worker.py``).
``reset()`` opens the task's page in a fresh context (its goal is the task keyshot judges); each
``act(action)`` carries out a BrowserGym action (``click('19')``, ``fill('15', 'text')``, ...) and shows
the page after it, with its screenshot and text (the goal, the last action's error, the accessibility
tree with BrowserGym ids). The page is ``done`` when MiniWoB ends the episode or after ``max_steps``
actions. The session holds MiniWoB's own reward (1.0 once the task is done right, else 0.0), the ground
truth to compare keyshot's verdict with::

    with MiniWoBBrowser("click-button", seed=3) as browser:     # a Chromium of its own
        page = browser.reset()
        while not page.done:
            page = browser.act(agent(page))
        browser.reward

Many sessions share a Chromium through :meth:`keyshot.env.miniwob.pool.BrowserPool.lease` (the way a run
gets its pages). A page that crashes fails its own session's episode; a Chromium (or its worker) that dies
fails the episodes of its own sessions: each gets a last page with ``error`` set (``reward`` None), so an
episode recorded from it is marked with the reason (:func:`keyshot.env.play.record_failure`), and the
session's next reset opens its page in a live Chromium (the pool's replacement).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Protocol

from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.miniwob.setup import BrowserSetup, MiniWoBError, browser_setup
from keyshot.env.page import Page

WORKER = Path(__file__).with_name("worker.py")
TASK_NAMES = (
    "the names are browsergym.miniwob.ALL_MINIWOB_TASKS' subdomains, e.g. click-button, click-dialog-2, "
    "enter-text"
)
#: OpenEnv's BrowserGym server renders 1280x720 (its default viewport); None: the MiniWoB task's own
#: (332x214 CSS pixels at BrowserGym's zoom)
VIEWPORT_OPENENV = (1280, 720)


def _stat(pid: int) -> list[str] | None:
    """The fields of process ``pid``'s /proc stat after its name (state first); None when it is gone or
    this is not Linux."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _started(pid: int) -> str | None:
    """When process ``pid`` started (its /proc start time), so a pid reused by another process is told
    apart; None when it is gone or this is not Linux."""
    fields = _stat(pid)
    return fields[19] if fields else None


def _gone(pid: int, started: str) -> bool:
    """Whether process ``pid``, started at ``started`` (:func:`_started`), has ended: gone, a zombie, or
    its pid taken by another process."""
    fields = _stat(pid)
    return fields is None or fields[0] == "Z" or fields[19] != started


class BrowserProcess:
    """One Chromium and the worker process that drives it (``worker.py``), holding many sessions (browser
    contexts); started at construction (Chromium launches in the background: the first request waits for
    it). Its deadlines are ``settings``' (:class:`~keyshot.env.miniwob.settings.SessionSettings`): a
    worker silent for ``answer_within_s`` while a request waits counts as stuck and is killed (its
    sessions fail); the worker is given ``page_timeout_s`` and ``dom_wait_s`` and says, once ready, what
    it runs with (``worker_deadlines``). Thread-safe: sessions on many threads send requests at once;
    answers are matched to requests by id."""

    def __init__(self, setup: BrowserSetup, settings: SessionSettings | None = None):
        self.setup = setup
        self.settings = settings or SessionSettings()
        self.worker_deadlines: dict | None = None  # the deadlines the worker said it runs with
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr, closed in close())
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._pending: dict[int, Future] = {}
        self._ready: Future = Future()
        self._last_heard = time.monotonic()
        self.failure: str | None = None  # why the process is gone, once it is
        self.chromium_pid: int | None = None
        self._chromium_start: str | None = None
        self.process = subprocess.Popen(
            [sys.executable, "-I", str(WORKER), str(setup.chromium), *self.settings.worker_arguments()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=setup.worker_env(),
            start_new_session=True,  # a terminal's Ctrl-C reaches the trainer, which closes its browsers
        )
        self._reader = threading.Thread(target=self._read, name="keyshot-browser-reader", daemon=True)
        self._reader.start()

    @property
    def alive(self) -> bool:
        """The process can serve requests (it runs and its Chromium did not die)."""
        return self.failure is None and self.process.poll() is None

    @property
    def pids(self) -> list[int]:
        """The worker's and its Chromium's main process ids (what :meth:`close` ends)."""
        return [self.process.pid] + ([self.chromium_pid] if self.chromium_pid else [])

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until Chromium is launched (or failed to): whether it is."""
        with contextlib.suppress(FutureTimeout):
            self._ready.result(timeout_s if timeout_s is not None else self.settings.answer_within_s)
        return self._ready.done() and self.alive

    def request(self, message: dict) -> dict:
        """Send ``message`` and wait for its answer: ``{"error": ...}`` when the page failed, the process
        died, or it stayed silent for the settings' ``answer_within_s`` (it is then killed: a stuck browser
        fails its sessions)."""
        future: Future = Future()
        with self._lock:
            if not self.alive:
                return {
                    "error": self.failure or f"the browser process ended (exit {self.process.returncode})"
                }
            rid = next(self._ids)
            self._pending[rid] = future
            try:
                self.process.stdin.write((json.dumps({**message, "id": rid}) + "\n").encode())
                self.process.stdin.flush()
            except OSError as exc:
                self._pending.pop(rid, None)
                return {"error": f"the browser process does not listen: {exc}"}
        sent = time.monotonic()
        while True:
            deadline_s = self.settings.answer_within_s
            try:
                return future.result(timeout=min(5.0, deadline_s))
            except FutureTimeout:
                if self._chromium_start and _gone(self.chromium_pid, self._chromium_start):
                    # its worker did not say so: stuck in a playwright call that never returns after it
                    self.fail("the browser died: the browser (Chromium) died (its worker did not answer)")
                # silent since this request was sent, or since it last answered another one: a worker
                # idle before the request is not stuck for having been idle
                elif time.monotonic() - max(sent, self._last_heard) > deadline_s:
                    self.fail(f"no answer in {deadline_s:g} s (the browser process was stopped)")

    def send(self, message: dict) -> None:
        """Send ``message`` without waiting for its answer (a session's end)."""
        with self._lock:
            if self.alive:
                with contextlib.suppress(OSError):
                    rid = next(self._ids)
                    self.process.stdin.write((json.dumps({**message, "id": rid}) + "\n").encode())
                    self.process.stdin.flush()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._last_heard = time.monotonic()
            answer = json.loads(line)
            if "ready" in answer:
                self.chromium_pid = answer.get("pid")
                self.worker_deadlines = answer.get("deadlines")
                self._chromium_start = _started(self.chromium_pid) if self.chromium_pid else None
                self._ready.set_result(True)
            elif "gone" in answer:
                self.fail(f"the browser died: {answer['gone']}")
            elif "id" in answer:
                with self._lock:
                    future = self._pending.pop(answer["id"], None)
                if future is not None:
                    future.set_result(answer)
            elif "error" in answer:  # the worker could not launch Chromium
                self.fail(f"the browser did not start: {answer['error']}")
        self.process.wait()
        self.fail(self._ended())

    def _ended(self) -> str:
        with self._lock:
            self._log.seek(0)
            lines = self._log.read().decode(errors="replace").strip().splitlines()
        return f"the browser process ended (exit {self.process.returncode}): {(lines or ['no output'])[-1]}"

    def fail(self, reason: str) -> None:
        """The process is gone (or stuck: then killed): every request waiting on it fails with ``reason``."""
        with self._lock:
            if self.failure is None:
                self.failure = reason
            pending, self._pending = list(self._pending.values()), {}
        self._kill()
        for future in pending:
            if not future.done():
                future.set_result({"error": self.failure})
        if not self._ready.done():
            self._ready.set_result(False)

    def _kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        if self.chromium_pid and _started(self.chromium_pid) == self._chromium_start:  # still its Chromium
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.chromium_pid, signal.SIGKILL)

    def close(self) -> None:
        """Close Chromium and the worker; anything still running is killed. Idempotent."""
        if self.process.poll() is not None:  # it ended on its own: its reader says why before "closed" would
            self._reader.join(timeout=5)
        elif self.failure is None:
            with contextlib.suppress(OSError), self._lock:
                self.process.stdin.write(b'{"op": "close"}\n')
                self.process.stdin.flush()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
        self.fail("the browser was closed")
        self.process.wait()
        self._reader.join(timeout=5)
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self._log.close()


_sessions = itertools.count()


class SessionHost(Protocol):
    """Where a leased session's pages open (:class:`~keyshot.env.miniwob.pool.BrowserPool`)."""

    setup: BrowserSetup
    settings: SessionSettings

    def _place(self, browser: MiniWoBBrowser) -> BrowserProcess: ...

    def _give_back(self, browser: MiniWoBBrowser) -> bool: ...


class MiniWoBBrowser:
    """One MiniWoB++ session (``task``: its name, e.g. ``click-button``): a page in a browser context of its
    own. ``seed`` picks the task's instance (its goal and page). Its steps, page size and deadlines are
    ``settings``' (:class:`~keyshot.env.miniwob.settings.SessionSettings`: by default the pool's, else the
    defaults; any field given by name replaces it: ``MiniWoBBrowser("click-button", max_steps=5)``).
    Made by a :class:`~keyshot.env.miniwob.pool.BrowserPool`'s ``lease()``, it lives in the pool's
    Chromium and :meth:`close` gives it back; made directly, it starts a Chromium of its own (``setup``: a
    prepared :class:`BrowserSetup`, default this process's for ``chromium``). Sessions run side by side,
    one per thread."""

    def __init__(
        self,
        task: str,
        seed: int = 0,
        *,
        chromium: str | None = None,
        settings: SessionSettings | None = None,
        setup: BrowserSetup | None = None,
        pool: SessionHost | None = None,
        **changes,
    ):
        self.setup = setup or (pool.setup if pool is not None else browser_setup(chromium))
        self.settings = (settings or (pool.settings if pool is not None else SessionSettings())).with_changes(
            task, **changes
        )
        self.task_name = task.removeprefix("miniwob.")
        self.seed = seed
        self.pool = pool
        self.name = f"s{next(_sessions)}"
        self.goal: str | None = None
        self.url: str | None = None
        self.step = 0
        self.reward: float | None = None
        self.error: str | None = None
        self.done = False
        self.closed = False
        self._closing = threading.Lock()
        self.episodes = 0  # resets that opened a page
        self.process: BrowserProcess | None = None
        if pool is None:
            self.process = BrowserProcess(self.setup, self.settings)

    @property
    def task(self) -> str:
        """The goal MiniWoB gave this instance (known once reset)."""
        if self.goal is None:
            raise MiniWoBError(f"miniwob.{self.task_name}: reset() first (the goal comes with the page)")
        return self.goal

    @property
    def task_id(self) -> str:
        return f"miniwob.{self.task_name}.{self.seed}"

    @property
    def start_url(self) -> str | None:
        return self.url

    @property
    def alive(self) -> bool:
        """The session can serve another episode (its Chromium runs and its page did not fail)."""
        return self.error is None and self.process is not None and self.process.alive

    @property
    def processes(self) -> list[int]:
        """The worker's and its Chromium's main process ids (shared with the other sessions of a pool)."""
        return self.process.pids if self.process is not None else []

    def reset(self, seed: int | None = None, task: str | None = None) -> Page:
        """A new episode: ``task``'s page (default: the session's task) at ``seed`` (default: the session's
        seed), in a fresh browser context; where the session's Chromium died, in a live one (the pool's
        replacement, or a new Chromium of its own). Raises MiniWoBError when the page does not open
        (``error`` then says why)."""
        if self.closed:
            raise MiniWoBError(f"{self.task_id}: the session is closed (lease another)")
        if seed is not None:
            self.seed = seed
        if task is not None:
            self.task_name = task.removeprefix("miniwob.")
        if self.process is None or not self.process.alive:
            self._replace_process()
        self.step, self.reward, self.error, self.done, self.goal = 0, 0.0, None, False, None
        viewport = list(self.settings.viewport) if self.settings.viewport else None
        request = {"op": "reset", "session": self.name, "task": self.task_name, "seed": self.seed}
        request.update(viewport=viewport, html=self.settings.html)
        answer = self.process.request(request)
        if answer.get("dead"):
            self.process.fail("the browser (Chromium) died")
        if not self.process.alive:  # its Chromium died between episodes: the page opens in a live one
            self._replace_process()
            answer = self.process.request(request)
        if "error" in answer:
            self.error, self.reward = answer["error"], None
            if _unknown(answer["error"]):
                raise MiniWoBError(
                    f"unknown MiniWoB task {self.task_name!r} ({answer['error']}); {TASK_NAMES}"
                )
            raise MiniWoBError(f"{self.task_id}: the page did not open: {answer['error']}")
        self.goal, self.url = answer["goal"], answer["url"]
        self.episodes += 1
        return self._page(answer)

    def _replace_process(self) -> None:
        old, self.process = self.process, None
        if self.pool is not None:
            process = self.pool._place(self)  # refused once the session is given back
            with self._closing:
                if self.closed:  # closed by another thread meanwhile: the pool freed the place just taken
                    raise MiniWoBError(f"{self.task_id}: the session is closed (lease another)")
                self.process = process
        else:
            if old is not None:
                old.close()
            self.process = BrowserProcess(self.setup, self.settings)

    def act(self, action: str) -> Page:
        """Carry out a BrowserGym action (an action's own error is shown in the page's text, as BrowserGym
        does); the page after it. A page or browser that fails ends the episode with ``error`` set."""
        if self.goal is None:
            raise MiniWoBError(f"{self.task_id}: reset() before act()")
        if self.done:
            raise MiniWoBError(f"{self.task_id}: the episode is over (its last page was shown); call reset()")
        self.step += 1
        answer = self.process.request({"op": "step", "session": self.name, "action": action})
        if "error" in answer:
            self.error = f"the browser failed at step {self.step}: {answer['error']}"
            self.done, self.reward = True, None
            return Page(f"Error: {self.error}", None, self.step, True, None, None, self.error)
        self.reward = answer["reward"]
        self.done = answer["done"] or self.step >= self.settings.max_steps
        return self._page(answer)

    def _page(self, answer: dict) -> Page:
        png = base64.b64decode(answer["png"])
        return Page(answer["text"], png, self.step, self.done, None, self.reward, html=answer.get("html"))

    def close(self) -> None:
        """End the session: its context closed; a pool's session goes back to the pool (its place in the
        budget freed), a session of its own closes its Chromium. Idempotent: call it on every path that
        ends the session's use."""
        with self._closing:  # once, even when two threads close it at the same moment
            if self.closed:
                return
            self.closed = True
            process, self.process = self.process, None
        if self.pool is not None:
            if process is not None:
                process.send({"op": "end", "session": self.name})
            self.pool._give_back(self)
        elif process is not None:
            process.close()

    def __enter__(self) -> MiniWoBBrowser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unknown(error: str) -> bool:
    return "doesn't exist" in error or "NameNotFound" in error
