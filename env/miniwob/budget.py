"""How many live MiniWoB pages this machine holds at once, counted in pages and measured.

A page is a session (a browser context of its own) in a Chromium that holds up to ``pages_per_browser``
of them; each Chromium also costs its worker process (Python with BrowserGym), playwright's driver and
Chromium's own processes. Both figures were measured here by ``bench/pages.py`` (PSS of every
process of the pool, pages open on a MiniWoB task, 2 cores, Debian's Chromium) and are recorded below;
run it again on another machine (``--record`` prints the two lines to paste). The default budget is the
memory available when it is made, less a reserve for the rest of the machine (the trainer, the server,
the judge), over those figures; ``max_pages`` sets it instead.

What cannot be held is refused before anything is opened (:meth:`BrowserBudget.require`), in one line
naming the numbers and the ways out; a lease beyond the budget is refused the same way
(:meth:`keyshot.env.miniwob.pool.BrowserPool.lease`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError

#: PSS of one page (its context, its renderer, its share of the GPU process): the slope over 16, 64 and
#: 128 open click-button pages, measured by bench/pages.py on 2026-11-27 (bench/RESULTS.md, live
#: rows: 128 pages in two Chromium held 6,927 MiB, these figures say 6,966)
MIB_PER_PAGE = 49
#: PSS of one page at OpenEnv's 1280x720 (``keyshot reward env``'s default viewport): the slope over 16 and
#: 32 pages, bench/pages.py --viewport 1280x720 on 2026-11-27 (32 pages in one Chromium: 1,950 MiB)
MIB_PER_PAGE_1280X720 = 57
#: PSS of one Chromium with no page: its worker (Python, BrowserGym), playwright's driver, Chromium's
#: browser, GPU, network and utility processes (same measurement)
MIB_PER_BROWSER = 347
#: Pages one Chromium holds (Chromium keeps each browser context's pages in renderers of their own)
PAGES_PER_BROWSER = 64
#: Memory left to the rest of the machine by default: an eighth of it, at least 1 GiB
RESERVE_FRACTION = 8
MIN_RESERVE_MIB = 1024


class BrowserBudgetError(KeyshotError):
    """More live pages are needed at once than the machine holds, or the budget is set wrong."""


def _meminfo_mib(field: str) -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_free_mib() -> int | None:
    """What the cgroup (v2) this process runs in still lets it use, where it has a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text().strip()
        used = int((root / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - used) // 2**20


def available_mib() -> int:
    """Memory this process can still use: the kernel's MemAvailable, capped by the cgroup's limit."""
    found = [m for m in (_meminfo_mib("MemAvailable"), _cgroup_free_mib()) if m is not None]
    if found:
        return min(found)
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


def page_mib(viewport: tuple[int, int] | None = None) -> int:
    """The measured PSS of a page of ``viewport`` (None: the MiniWoB task's own size, BrowserGym's): the
    1280x720 figure up to that size, grown with the pixels beyond it."""
    if viewport is None:
        return MIB_PER_PAGE
    pixels = viewport[0] * viewport[1]
    grown = (MIB_PER_PAGE_1280X720 - MIB_PER_PAGE) * max(1.0, pixels / (1280 * 720))
    return math.ceil(MIB_PER_PAGE + grown)


#: The OpenEnv server's own memory per 1280x720 session (MiniWoB's 1.5x zoom: a 1920x1080 screenshot), beside
#: Chromium's page: the slope of the server's RSS over 4 and 20 sessions, each holding its last answer,
#: bench/sessions.py on 2026-11-27 (5.6 MiB: the screenshot's array). It was 75 MiB (19,077 MiB at 256
#: sessions, OOM-killed) while the observation was a nested list of integers (bench/RESULTS.md).
MIB_PER_SESSION_1280X720 = 6


def observation_mib(viewport: tuple[int, int] | None) -> int:
    """The OpenEnv server's own memory per session at ``viewport`` (None: MiniWoB's small page), scaled
    with the pixels from the 1280x720 measurement."""
    width, height = viewport or (500, 350)  # MiniWoB's own page is about 500x330
    return math.ceil(MIB_PER_SESSION_1280X720 * width * height / (1280 * 720))


def total_mib() -> int:
    return _meminfo_mib("MemTotal") or os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2**20


@dataclass(frozen=True)
class BrowserBudget:
    """At most ``max_pages`` live pages at once, ``pages_per_browser`` to a Chromium. ``available_mib`` and
    ``reserve_mib`` are what the default was made from (None when ``max_pages`` was given)."""

    max_pages: int
    pages_per_browser: int = PAGES_PER_BROWSER
    mib_per_page: int = MIB_PER_PAGE
    mib_per_browser: int = MIB_PER_BROWSER
    available_mib: int | None = None
    reserve_mib: int | None = None

    @classmethod
    def for_machine(
        cls,
        max_pages: int | None = None,
        *,
        memory_mib: int | None = None,
        reserve_mib: int | None = None,
        pages_per_browser: int = PAGES_PER_BROWSER,
        viewport: tuple[int, int] | None = None,
        session_mib: int = 0,
    ) -> BrowserBudget:
        """``max_pages`` when given (``--max-pages``), else the most pages of ``viewport`` (the pool's;
        None: the task's own size) that fit in ``memory_mib`` (default: the memory available now) less
        ``reserve_mib`` (default: an eighth of the machine's memory, at least 1 GiB) at the measured
        figures; ``session_mib``: what the serving process itself holds per page beside Chromium (keyshot
        reward env: :func:`observation_mib`)."""
        per_page = page_mib(viewport) + session_mib
        if max_pages is not None:
            if max_pages < 1:
                raise BrowserBudgetError(f"--max-pages must be at least 1 (got {max_pages})")
            return cls(max_pages, pages_per_browser, per_page)
        memory = available_mib() if memory_mib is None else memory_mib
        reserve = (
            max(MIN_RESERVE_MIB, total_mib() // RESERVE_FRACTION) if reserve_mib is None else reserve_mib
        )
        budget = cls(0, pages_per_browser, per_page, available_mib=memory, reserve_mib=reserve)
        pages = max(0, (memory - reserve) // per_page)
        while pages > 0 and budget.mib_for(pages) > memory - reserve:
            pages -= 1
        return cls(pages, pages_per_browser, per_page, available_mib=memory, reserve_mib=reserve)

    @property
    def max_browsers(self) -> int:
        """The Chromium processes ``max_pages`` pages take."""
        return self.browsers_for(self.max_pages)

    def browsers_for(self, pages: int) -> int:
        return math.ceil(pages / self.pages_per_browser)

    def mib_for(self, pages: int) -> int:
        """The memory ``pages`` live pages take at the measured figures."""
        return pages * self.mib_per_page + self.browsers_for(pages) * self.mib_per_browser

    def describe(self) -> str:
        """Where the number comes from, e.g. "this machine holds 365 live pages (23,000 MiB available less
        a 3,000 MiB reserve, at 49 MiB a page and 347 MiB a Chromium of 64 pages)"."""
        figures = f"at {self.mib_per_page} MiB a page and {self.mib_per_browser} MiB a Chromium of {self.pages_per_browser} pages"
        if self.available_mib is None:
            return f"--max-pages allows {self.max_pages} live pages ({self.mib_for(self.max_pages):,} MiB {figures})"
        return (
            f"this machine holds {self.max_pages} live pages ({self.available_mib:,} MiB available less a "
            f"{self.reserve_mib:,} MiB reserve, {figures})"
        )

    def require(self, needed: int, what: str, ways_out: str) -> None:
        """Refuse, in one line, a ``what`` that needs ``needed`` live pages at once beyond the budget;
        ``ways_out`` says how to need fewer, or where else the pages can be opened (the caller's options:
        the OpenEnv server, ``keyshot reward env``, on another machine, is one)."""
        if needed > self.max_pages:
            raise BrowserBudgetError(
                f"{what} needs {needed} live MiniWoB pages at once ({self.mib_for(needed):,} MiB), but "
                f"{self.describe()}: {ways_out}"
            )
