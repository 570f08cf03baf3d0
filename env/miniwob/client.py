"""Live episodes: BrowserGym's MiniWoB++ tasks in headless Chromium, a
:class:`~keyshot.env.page.Browser` beside the replay, so an RL example takes either.

``reset()`` opens the task's page (its goal is the task keyshot judges); each ``act(action)`` carries out
a BrowserGym action (``click('19')``, ``fill('15', 'text')``, ...) in the page and shows the page after
it, with its screenshot and text (the goal, the accessibility tree with BrowserGym ids, the last action's
error). The page is ``done`` when MiniWoB ends the episode or after ``max_steps`` actions. The browser
holds MiniWoB's own reward (1.0 once the task is done right, else 0.0), the ground truth to compare
keyshot's verdict with::

    with MiniWoBBrowser("click-button", seed=3) as browser:
        page = browser.reset()
        while not page.done:
            page = browser.act(agent(page))
        browser.reward

The browser runs in a process of its own (``worker.py``). Its first reset launches Chromium; every later
reset is a new MiniWoB episode in the same page (``reset(seed=..., task=...)``: any MiniWoB task), so one
browser serves episode after episode (:class:`~keyshot.env.miniwob.pool.BrowserPool` shares them between
environments). A browser that dies mid-episode gives a last page with ``error`` set (and ``reward``
None): an episode recorded from it is marked with the reason (:func:`keyshot.env.play.record_failure`),
so its keyshot reward is None too; its next reset replaces the process.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from keyshot.env.miniwob.setup import BrowserSetup, MiniWoBError, browser_setup
from keyshot.env.page import Page

WORKER = Path(__file__).with_name("worker.py")
TASK_NAMES = (
    "the names are browsergym.miniwob.ALL_MINIWOB_TASKS' subdomains, e.g. click-button, click-dialog-2, "
    "enter-text"
)


def _started(pid: int) -> str | None:
    """When process ``pid`` started (its /proc start time), so a pid reused by another process is told
    apart; None when it is gone or this is not Linux."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


class MiniWoBBrowser:
    """One MiniWoB++ task (``task``: its name, e.g. ``click-button``) in headless Chromium through
    BrowserGym, run in a process of its own; ``seed`` picks the task's instance (its goal and page),
    ``max_steps`` ends an episode MiniWoB has not ended, ``timeout_s`` is how long the worker may take to
    answer before the browser counts as failed (a page may take half of it to load); ``setup``: a prepared :class:`BrowserSetup` (default: this process's,
    for ``chromium``). Browsers run side by side, one per thread."""

    def __init__(
        self,
        task: str,
        seed: int = 0,
        *,
        max_steps: int = 10,
        chromium: str | None = None,
        text_chars: int = 4000,
        timeout_s: float = 60.0,
        setup: BrowserSetup | None = None,
    ):
        self.setup = setup or browser_setup(chromium)
        self.task_name = task.removeprefix("miniwob.")
        self.seed = seed
        self.max_steps = max_steps
        self.text_chars = text_chars
        self.timeout_s = timeout_s
        self.goal: str | None = None
        self.url: str | None = None
        self.step = 0
        self.reward: float | None = None
        self.error: str | None = None
        self.done = False
        self.episodes = 0  # resets that opened a page
        self.launches = 0  # of them, those that launched Chromium (the rest reused the page)
        self.pids: list[int] = []  # the browsers' main processes (the page's and BrowserGym's chat window)
        self._pid_starts: dict[int, str | None] = {}
        self.process: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr, closed in close())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(WORKER),
                self.task_name,
                str(self.setup.chromium),
                str(self.text_chars),
                str(int(self.timeout_s * 500)),  # a page's load: half the time the worker has to answer
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=self.setup.worker_env(),
            start_new_session=True,  # a terminal's Ctrl-C reaches the trainer, which closes its browsers
        )
        ready = self._receive()
        if "error" in ready:
            self.close()
            raise MiniWoBError(
                f"unknown MiniWoB task {self.task_name!r} ({ready['error']}); {TASK_NAMES}"
                if _unknown(ready["error"])
                else f"miniwob.{self.task_name}: the browser process did not start: {ready['error']}"
            )

    def _receive(self) -> dict:
        """The worker's next answer, or ``{"error": ...}`` when it died or took longer than timeout_s."""
        out = self.process.stdout
        ready, _, _ = select.select([out], [], [], self.timeout_s)
        line = out.readline() if ready else b""
        if line:
            return json.loads(line)
        if not ready:
            self.process.kill()
            return {"error": f"no answer in {self.timeout_s:.0f} s (the browser process was stopped)"}
        self.process.wait()
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the browser process ended (exit {self.process.returncode}): {tail[0]}"}

    def _request(self, message: dict) -> dict:
        if self.process.poll() is not None:
            return {"error": f"the browser process ended (exit {self.process.returncode})"}
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except OSError as exc:
            return {"error": f"the browser process does not listen: {exc}"}
        return self._receive()

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
        """The browser can serve another episode (its process runs and did not fail)."""
        return self.error is None and self.process is not None and self.process.poll() is None

    @property
    def processes(self) -> list[int]:
        """The worker's and both Chromium main processes' ids (what a close ends)."""
        return ([self.process.pid] if self.process is not None else []) + self.pids

    def reset(self, seed: int | None = None, task: str | None = None) -> Page:
        """A new episode: ``task``'s page (default: the browser's task) at ``seed`` (default: the
        browser's seed), in the page already open where there is one; a browser process that failed is
        replaced first. Raises MiniWoBError when the page does not open (``error`` then says why)."""
        if seed is not None:
            self.seed = seed
        if task is not None:
            self.task_name = task.removeprefix("miniwob.")
        if not self.alive:
            self.close()
            self._start()
        self.step, self.reward, self.error, self.done, self.goal = 0, 0.0, None, False, None
        answer = self._request({"op": "reset", "seed": self.seed, "task": self.task_name})
        if "error" in answer:
            self.error, self.reward = answer["error"], None
            if _unknown(answer["error"]):
                raise MiniWoBError(
                    f"unknown MiniWoB task {self.task_name!r} ({answer['error']}); {TASK_NAMES}"
                )
            raise MiniWoBError(f"{self.task_id}: the page did not open: {answer['error']}")
        self.goal, self.url = answer["goal"], answer["url"]
        self._track(answer["pids"])
        self.episodes += 1
        self.launches += bool(answer["relaunched"])
        return self._page(answer)

    def _track(self, pids: list[int]) -> None:
        self.pids = list(pids)
        self._pid_starts = {pid: self._pid_starts.get(pid) or _started(pid) for pid in pids}

    def act(self, action: str) -> Page:
        """Carry out a BrowserGym action (an action's own error is shown in the page's text, as BrowserGym
        does); the page after it. A browser that fails ends the episode with ``error`` set."""
        if self.goal is None:
            raise MiniWoBError(f"{self.task_id}: reset() before act()")
        if self.done:
            raise MiniWoBError(f"{self.task_id}: the episode is over (its last page was shown); call reset()")
        self.step += 1
        answer = self._request({"op": "step", "action": action})
        if "error" in answer:
            self.error = f"the browser failed at step {self.step}: {answer['error']}"
            self.done, self.reward = True, None
            return Page(f"Error: {self.error}", None, self.step, True, None, None, self.error)
        self.reward = answer["reward"]
        self.done = answer["done"] or self.step >= self.max_steps
        return self._page(answer)

    def _page(self, answer: dict) -> Page:
        return Page(answer["text"], base64.b64decode(answer["png"]), self.step, self.done, None, self.reward)

    def close(self) -> None:
        """Close the browsers and their process; any of their processes still running is killed.
        Idempotent: call it on every path that ends the browser's use."""
        if self.process is not None:
            if self.process.poll() is None:
                self._request({"op": "close"})
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._log.close()
            self.process = None
        for pid in self.pids:
            if _started(pid) == self._pid_starts.get(pid):  # still the Chromium it reported
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        self.pids, self._pid_starts = [], {}

    def __enter__(self) -> MiniWoBBrowser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _unknown(error: str) -> bool:
    return "doesn't exist" in error or "NameNotFound" in error
