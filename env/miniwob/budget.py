"""How many live MiniWoB pages this machine holds at once. Each live page is a browser: keyshot's worker,
playwright's driver and two Chromium instances (the page's and BrowserGym's chat window), measured at
480-510 MiB PSS over 40 episodes each (3 browsers, click-button and enter-text, 2 cores;
bench/soak_live.py measures it again under a trainer's load). The default budget is half the memory
available when it is made, the other half left to the trainer; ``max_browsers`` sets it instead.

A run whose batch needs more live pages at once than the budget refuses at start (:meth:`BrowserBudget.
require`), before any browser is opened, naming the numbers and the ways out.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError

#: PSS of one live browser (worker, driver, two Chromium), rounded up from the 480-510 MiB measured
MIB_PER_BROWSER = 512


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


@dataclass(frozen=True)
class BrowserBudget:
    """At most ``max_browsers`` live pages at once; ``available_mib`` is the memory the default was made
    from (None when ``max_browsers`` was given)."""

    max_browsers: int
    mib_per_browser: int = MIB_PER_BROWSER
    available_mib: int | None = None

    @classmethod
    def for_machine(
        cls,
        max_browsers: int | None = None,
        *,
        memory_mib: int | None = None,
        mib_per_browser: int = MIB_PER_BROWSER,
    ) -> BrowserBudget:
        """``max_browsers`` when given (``--max-browsers``), else half of ``memory_mib`` (default: the
        memory available now) over ``mib_per_browser``."""
        if max_browsers is not None:
            if max_browsers < 1:
                raise BrowserBudgetError(f"--max-browsers must be at least 1 (got {max_browsers})")
            return cls(max_browsers, mib_per_browser)
        memory = available_mib() if memory_mib is None else memory_mib
        return cls(memory // 2 // mib_per_browser, mib_per_browser, memory)

    def describe(self) -> str:
        """Where the number comes from, e.g. "this machine holds 20 live pages (half of the 20,950 MiB
        available, at 512 MiB per browser)"."""
        if self.available_mib is None:
            return (
                f"--max-browsers allows {self.max_browsers} live pages "
                f"({self.max_browsers * self.mib_per_browser:,} MiB at {self.mib_per_browser} MiB per browser)"
            )
        return (
            f"this machine holds {self.max_browsers} live pages (half of the {self.available_mib:,} MiB "
            f"available, at {self.mib_per_browser} MiB per browser)"
        )

    def require(self, needed: int, what: str, ways_out: str) -> None:
        """Refuse, in one line, a ``what`` that needs ``needed`` live pages at once beyond the budget;
        ``ways_out`` says how to need fewer, or where else the pages can be opened (the caller's options:
        the OpenEnv server, ``keyshot reward env``, on another machine, is one)."""
        if needed > self.max_browsers:
            raise BrowserBudgetError(
                f"{what} needs {needed} live MiniWoB pages at once, but {self.describe()}: {ways_out}"
            )
