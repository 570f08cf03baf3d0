"""Live MiniWoB pages shared by the environments of a run (a trainer's pool of environments, an OpenEnv
server's sessions, an agent executor's rollouts), within the machine's
:class:`~keyshot.env.miniwob.budget.BrowserBudget`. The whole API::

    pool = BrowserPool(BrowserBudget.for_machine(), "click-button")
    pool.warm(128)                    # the Chromium processes 128 pages need, launched in the background
    browser = pool.lease()            # a session (MiniWoBBrowser); BrowserBudgetError beyond the budget
    page = browser.reset(seed=3, task="enter-text")   # a new episode in a fresh browser context
    page = browser.act("click('13')")
    browser.close()                   # at the session's end, on every path: back to the pool
    pool.close()                      # at the run's end: every Chromium closed

(``with pool.lease() as browser:`` does the same for one block.) A lease opens nothing: the session's
first reset places it in the pool's least-loaded live Chromium (up to ``budget.pages_per_browser`` pages
each), launching another where all are full. A session serves episode after episode, each reset a fresh
context. A page that crashes fails its own episode; a Chromium or worker that dies (or stops answering)
fails the episodes of its own sessions, and their next resets go to a live Chromium (a replacement is
launched when needed): never the run. No more pages are leased at once than the budget allows.
"""

from __future__ import annotations

import logging
import threading

from keyshot.env.miniwob.budget import BrowserBudget, BrowserBudgetError
from keyshot.env.miniwob.client import BrowserProcess, MiniWoBBrowser
from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.miniwob.setup import BrowserSetup, MiniWoBError, browser_setup

logger = logging.getLogger(__name__)


class BrowserPool:
    """Sessions on shared Chromium processes, at most ``budget.max_pages`` leased at once, every one opened
    with ``settings`` (:class:`~keyshot.env.miniwob.settings.SessionSettings`; ``task``, a session's
    default task, and any other of its fields by name replace the defaults: ``BrowserPool(budget,
    "click-button", max_steps=5)``). Any task can be reset in a session."""

    def __init__(
        self,
        budget: BrowserBudget,
        task: str | None = None,
        *,
        settings: SessionSettings | None = None,
        setup: BrowserSetup | None = None,
        **changes,
    ):
        self.budget = budget
        self.settings = (settings or SessionSettings()).with_changes(task, **changes)
        self.setup = setup or browser_setup()
        self._lock = threading.Lock()
        self._load: dict[BrowserProcess, int] = {}  # live processes and the sessions placed in each
        self._leased: set[MiniWoBBrowser] = set()
        # where each leased session's page is: a session counts in one process's load at most, and only
        # until it is given back, however often and from however many threads that is asked
        self._placed: dict[MiniWoBBrowser, BrowserProcess] = {}
        self._closed = False
        self.launched = 0  # Chromium processes started
        self.replaced = 0  # of them, those found dead (their sessions' episodes failed)
        self.max_leased = 0  # the most sessions leased at once
        self.max_browsers = 0  # the most Chromium processes alive at once
        self.given_back = 0  # sessions given back (each once, however many times its close was called)

    @property
    def leased(self) -> int:
        """Sessions leased now."""
        with self._lock:
            return len(self._leased)

    def processes(self) -> list[BrowserProcess]:
        """The Chromium processes open now (for a look at their process ids or memory)."""
        with self._lock:
            return list(self._load)

    def sessions(self) -> list[MiniWoBBrowser]:
        """The sessions leased now."""
        with self._lock:
            return list(self._leased)

    def pages(self) -> dict[BrowserProcess, int]:
        """The pages placed in each live Chromium process now (a leased session's, from its first reset
        until it is given back)."""
        with self._lock:
            return dict(self._load)

    def lease(self, task: str | None = None) -> MiniWoBBrowser:
        """A session of this pool (``task``: its default task, else the pool's); nothing is opened until
        its first reset. Its :meth:`~MiniWoBBrowser.close` gives it back. Raises BrowserBudgetError (one
        line, the numbers and the way out) when ``budget.max_pages`` sessions are leased already."""
        with self._lock:
            if self._closed:
                raise MiniWoBError("the browser pool is closed")
            if len(self._leased) >= self.budget.max_pages:
                raise BrowserBudgetError(
                    f"all {len(self._leased)} live pages are leased: {self.budget.describe()}; close each "
                    "session at its end, or lower the sessions asked for at once"
                )
            browser = MiniWoBBrowser(task or self.settings.task, setup=self.setup, pool=self)
            self._leased.add(browser)
            self.max_leased = max(self.max_leased, len(self._leased))
            return browser

    def warm(self, pages: int) -> None:
        """Launch, in the background, the Chromium processes ``pages`` pages need (at most the budget's):
        a trainer's pages then open without waiting for launches."""
        with self._lock:
            wanted = self.budget.browsers_for(min(pages, self.budget.max_pages))
            while not self._closed and len(self._live()) < wanted:
                self._launch()

    def wait_ready(self, timeout_s: float | None = None) -> bool:
        """Wait until every process launched so far has its Chromium up: whether they all have."""
        return all(process.wait_ready(timeout_s) for process in self.processes())

    def close(self) -> None:
        """Close every Chromium, with the sessions in it (their next reset raises), and lease no more
        (idempotent)."""
        with self._lock:
            self._closed = True
            processes, self._load, self._leased, self._placed = list(self._load), {}, set(), {}
        for process in processes:
            process.close()

    def __enter__(self) -> BrowserPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- what sessions call
    def _place(self, browser: MiniWoBBrowser) -> BrowserProcess:
        """A live process for ``browser``'s next page (the one it was in, if any, was found dead): the
        least-loaded with room, or a new one. A session given back is placed nowhere again."""
        with self._lock:
            if self._closed:
                raise MiniWoBError("the browser pool is closed")
            if browser not in self._leased:
                raise MiniWoBError(f"{browser.task_id}: the session is closed (lease another)")
            self._unplace(browser)
            live = self._live()
            room = [p for p in live if self._load[p] < self.budget.pages_per_browser]
            process = min(room, key=self._load.__getitem__) if room else self._launch()
            self._load[process] += 1
            self._placed[browser] = process
            return process

    def _give_back(self, browser: MiniWoBBrowser) -> bool:
        """The session's lease ended: its page's place freed. Idempotent: only the first call for a
        session frees anything (whether it did is returned), so a page given back twice, by two paths or
        two threads at once, cannot free a second place and let the Chromium hold more pages than the
        budget says."""
        with self._lock:
            if browser not in self._leased:
                return False
            self._leased.discard(browser)
            self._unplace(browser)
            self.given_back += 1
            dead = self._drop_dead()
        for process in dead:
            process.close()
        return True

    def _unplace(self, browser: MiniWoBBrowser) -> None:
        """(Under the lock.) ``browser``'s page is no longer counted where it was placed."""
        process = self._placed.pop(browser, None)
        if process is not None and process in self._load:
            self._load[process] -= 1

    def _live(self) -> list[BrowserProcess]:
        """The live processes (under the lock); dead ones are dropped and closed in the background."""
        for process in self._drop_dead():
            threading.Thread(target=process.close, name="keyshot-browser-close", daemon=True).start()
        return list(self._load)

    def _drop_dead(self) -> list[BrowserProcess]:
        dead = [p for p in self._load if not p.alive]
        for process in dead:
            del self._load[process]
            self.replaced += 1
            logger.warning("a browser of the pool died (%s); its sessions' episodes failed", process.failure)
        return dead

    def _launch(self) -> BrowserProcess:
        process = BrowserProcess(self.setup, self.settings)
        self._load[process] = 0
        self.launched += 1
        self.max_browsers = max(self.max_browsers, len(self._load))
        return process
