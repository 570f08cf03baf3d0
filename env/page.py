"""What every environment of this floor gives an agent: the :class:`Page` it sees and the :class:`Browser`
it acts in (the replay, the live MiniWoB browser, and any environment added beside them). ``Page`` is
:class:`keyshot.reward.episode.Page`, re-exported: OpenRLHF's agent base on the reward floor returns the same
type, and a floor below this one cannot import it from here::

    page = browser.reset()
    while not page.done:
        page = browser.act(agent(page))
    browser.close()
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from keyshot.reward.episode import Page  # the page type both floors share (defined beside the Episode)

__all__ = ["Browser", "Page"]


@runtime_checkable
class Browser(Protocol):
    """Where an episode happens: ``reset()`` opens the task's first page, ``act(action)`` carries out an
    action and shows the page after it, ``close()`` gives back what the browser holds (idempotent: call
    it on every path that ends the browser's use). ``task`` (the goal keyshot judges), ``task_id`` and
    ``start_url`` describe the episode, known once reset."""

    @property
    def task(self) -> str: ...

    @property
    def task_id(self) -> str: ...

    @property
    def start_url(self) -> str | None: ...

    def reset(self) -> Page: ...

    def act(self, action: str) -> Page: ...

    def close(self) -> None: ...
