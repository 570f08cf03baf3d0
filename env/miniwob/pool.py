"""Live MiniWoB browsers shared by the environments of a run (a trainer's pool of environments, an agent
executor's rollouts), within the machine's :class:`~keyshot.env.miniwob.budget.BrowserBudget`::

    pool = BrowserPool(BrowserBudget.for_machine(), "click-button")
    pool.warm(8)                      # 8 browsers opened ahead, in parallel, while the trainer starts
    browser = pool.acquire()          # an open browser (or the reason the page did not open)
    page = browser.reset(seed=3, task="enter-text")   # a new episode in the page already open
    ...
    pool.release(browser)             # at the episode's end, on every path: back to the pool
    pool.close()                      # at the run's end: every browser closed

A browser serves episode after episode (each reset is a new MiniWoB episode in the same page). One that
failed (a page that did not open, a Chromium or worker that died) is closed when it comes back and a
replacement is opened ahead; a page that did not open fails the episode that asked for it (the
:class:`MiniWoBError` says why), never the run. No more browsers are open than the budget allows, nor,
once an episode ends, more than the run needs at once (``warm(n)``, or the most ever in use).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from keyshot.env.miniwob.budget import BrowserBudget, BrowserBudgetError
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.setup import BrowserSetup, MiniWoBError, browser_setup

logger = logging.getLogger(__name__)


class BrowserPool:
    """At most ``budget.max_browsers`` :class:`MiniWoBBrowser`\\ s, opened on ``task`` (any task can be
    reset in them later), ``opening`` at a time in the background (default: the CPU count, 2 to 8)."""

    def __init__(
        self,
        budget: BrowserBudget,
        task: str,
        *,
        setup: BrowserSetup | None = None,
        max_steps: int = 10,
        timeout_s: float = 60.0,
        opening: int | None = None,
    ):
        self.budget = budget
        self.task = task
        self.setup = setup or browser_setup()
        self.max_steps = max_steps
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._idle: list[MiniWoBBrowser] = []
        self._all: set[MiniWoBBrowser] = set()  # idle and in use
        self._opening = 0
        self._closing = 0  # browsers given back and being closed (their processes still run)
        self._waiting = 0
        self._failures: deque[str] = deque()  # pages that did not open, each failing one acquire
        self._target = 0  # live pages the run needs at once
        self._closed = False
        self._executor = ThreadPoolExecutor(
            max_workers=opening or min(8, max(2, os.cpu_count() or 2)), thread_name_prefix="keyshot-browser"
        )
        self.opened = 0  # browsers opened
        self.failed_opens = 0  # pages that did not open
        self.replaced = 0  # browsers closed because they failed
        self.max_alive = 0  # the most browsers open at once

    @property
    def alive(self) -> int:
        """Browsers open now (idle and in use)."""
        with self._cond:
            return len(self._all)

    def browsers(self) -> list[MiniWoBBrowser]:
        """The browsers open now (for a look at their processes)."""
        with self._cond:
            return list(self._all)

    def warm(self, n: int) -> None:
        """The run needs ``n`` live pages at once (at most the budget's; check it first with
        :meth:`BrowserBudget.require`): open browsers ahead, in the background, until ``n`` are open;
        idle ones beyond ``n`` are closed."""
        with self._cond:
            self._target = min(n, self.budget.max_browsers)
            surplus = self._trim()
            self._top_up()
        for browser in surplus:
            browser.close()

    def wait_open(self, n: int, timeout_s: float | None = None) -> bool:
        """Wait until ``n`` browsers are open (or ``timeout_s`` passed, or opening stopped short of
        ``n``): whether they are."""
        with self._cond:
            return (
                self._cond.wait_for(
                    lambda: (
                        len(self._all) >= n
                        or self._closed
                        or (self._opening == self._closing == 0 and len(self._all) < n)
                    ),
                    timeout_s,
                )
                and len(self._all) >= n
            )

    def acquire(self) -> MiniWoBBrowser:
        """An open browser, now or once one being opened is ready; raises MiniWoBError when the page
        opened for it did not open (that episode fails; the next acquire opens another), and
        BrowserBudgetError when every browser the budget allows is in use."""
        with self._cond:
            self._waiting += 1
            try:
                while True:
                    if self._closed:
                        raise MiniWoBError("the browser pool is closed")
                    if self._idle:
                        browser = self._idle.pop()
                        self._target = max(self._target, len(self._all) - len(self._idle))
                        return browser
                    if self._failures:
                        raise MiniWoBError(self._failures.popleft())
                    in_use = len(self._all)
                    if in_use >= self.budget.max_browsers:
                        raise BrowserBudgetError(
                            f"all {in_use} browsers are in use: {self.budget.describe()}; give each "
                            "browser back (release) at its episode's end"
                        )
                    while (
                        self._opening < self._waiting
                        and in_use + self._opening + self._closing < self.budget.max_browsers
                    ):
                        self._open_ahead()
                    self._cond.wait()
            finally:
                self._waiting -= 1

    def release(self, browser: MiniWoBBrowser) -> None:
        """``browser``'s episode is over: back to the pool, or closed (and replaced ahead) when it failed,
        or closed when more are open than the run needs."""
        with self._cond:
            if browser not in self._all or browser in self._idle:
                return  # released already (or not this pool's)
            failed = not browser.alive
            if not (failed or self._closed or len(self._all) > max(self._target, 1)):
                self._idle.append(browser)
                self._cond.notify_all()
                return
            self._all.discard(browser)
            self._closing += 1  # still counted: its replacement opens once it is closed
        browser.close()
        with self._cond:
            self._closing -= 1
            self.replaced += failed
            self._top_up()
            self._cond.notify_all()

    def close(self) -> None:
        """Close every browser, idle or in use, and stop opening more (idempotent)."""
        with self._cond:
            self._closed = True
            browsers, self._all, self._idle = list(self._all), set(), []
            self._cond.notify_all()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for browser in browsers:
            browser.close()

    def __enter__(self) -> BrowserPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _trim(self) -> list[MiniWoBBrowser]:
        surplus = []
        while self._idle and len(self._all) > self._target:
            browser = self._idle.pop(0)
            self._all.discard(browser)
            surplus.append(browser)
        return surplus

    def _top_up(self) -> None:
        while not self._closed and len(self._all) + self._opening + self._closing < self._target:
            self._open_ahead()

    def _open_ahead(self) -> None:
        self._opening += 1
        self._executor.submit(self._open)

    def _open(self) -> None:
        """Open one browser (its worker started, Chromium launched on the pool's task) into the pool."""
        browser, failure = None, None
        try:
            browser = MiniWoBBrowser(
                self.task, max_steps=self.max_steps, timeout_s=self.timeout_s, setup=self.setup
            )
            browser.reset()
        except MiniWoBError as exc:
            failure = str(exc)
        except Exception as exc:  # an unforeseen failure still fails one episode, with its reason
            failure = f"the browser did not open: {type(exc).__name__}: {exc}"
        with self._cond:
            self._opening -= 1
            keep = failure is None and not self._closed
            if keep:
                self._all.add(browser)
                self._idle.append(browser)
                self.opened += 1
                self.max_alive = max(self.max_alive, len(self._all))
            elif failure is not None:
                self.failed_opens += 1
                if self._waiting:  # the episode waiting for it fails with the reason
                    self._failures.append(failure)
                else:  # opened ahead: the next acquire opens another
                    logger.warning("a browser opened ahead did not open: %s", failure)
            self._cond.notify_all()
        if not keep and browser is not None:
            with contextlib.suppress(Exception):
                browser.close()
