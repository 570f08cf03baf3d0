"""An agent played in a :class:`~keyshot.env.page.Browser`, recorded as keyshot's
:class:`~keyshot.reward.episode.Episode` (the recorder keyshot's reward scores)."""

from __future__ import annotations

import os
from collections.abc import Callable

from keyshot.env.page import Browser, Page
from keyshot.reward.episode import Episode


def record_failure(episode: Episode, page: Page) -> None:
    """Fail ``episode`` when ``page`` says the browser failed (:meth:`Episode.fail`: its reward is None
    with the page's error as the reason, counted in keyshot/failed)."""
    if page.error:
        episode.fail(page.error)


def run_episode(
    browser: Browser,
    agent: Callable[[Page], str | None],
    *,
    keep_dir: str | os.PathLike | None = None,
) -> Episode:
    """One episode of ``agent`` (a page -> action or None callable) recorded as keyshot's Episode
    (:meth:`Episode.add_step`'s order: the first page, then each action with the page it led to), until
    the page is done or the agent has no action. A browser that failed marks the episode
    (:func:`record_failure`); the browser then holds the environment's own reward, if any."""
    page = browser.reset()
    episode = Episode(browser.task, start_url=browser.start_url, task_id=browser.task_id, keep_dir=keep_dir)
    episode.add_step(page.screenshot)
    while not page.done and (action := agent(page)) is not None:
        page = browser.act(action)
        episode.add_step(page.screenshot, action=action)  # the page may be None (a failed browser)
    record_failure(episode, page)
    episode.finish(None)
    return episode
