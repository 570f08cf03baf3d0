"""What a live MiniWoB session is opened with, and how long its browser may take: the one home of these
settings and their defaults. The pool (:class:`~keyshot.env.miniwob.pool.BrowserPool`), each session
(:class:`~keyshot.env.miniwob.client.MiniWoBBrowser`), the worker process driving a Chromium (it is given
the deadlines on its command line), keyshot's TRL environments (``keyshot.frameworks.trl.env``) and ``keyshot reward
env`` (whose options default to these fields) all read one :class:`SessionSettings`.

A browser deadline is changed here, or per run: ``BrowserPool(budget, task, answer_within_s=30)`` (any
field by name), ``keyshot reward env --answer-within-s 30 --page-timeout-s 15``. Imports nothing heavy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from keyshot.infer.common.errors import KeyshotError


class SessionSettingsError(KeyshotError, ValueError):
    """A session setting that cannot work (a deadline below zero, a page timeout past the step's)."""


@dataclass(frozen=True)
class SessionSettings:
    """Every setting of a MiniWoB session.

    Attributes:
        task: the MiniWoB task a session opens unless a reset names another (``click-test``, ...).
        max_steps: the actions after which an episode ends where MiniWoB has not ended it.
        viewport: the page's size in CSS pixels, (width, height); None: the task's own, as BrowserGym
            shows it (OpenEnv's BrowserGym server renders 1280x720: ``client.VIEWPORT_OPENENV``).
        html: every page also carries its pruned HTML (OpenEnv's BrowserGym format needs it).
        answer_within_s: the browser's deadline. A step (a reset or an action) waiting this long on a
            worker that says nothing kills that worker and its Chromium as stuck: the steps waiting on it
            answer with the reason, and their sessions' next resets open in a new Chromium. ``keyshot
            reward env`` gives the reward the same deadline; keep it below the 60 s OpenEnv's client
            waits for an answer (its ``message_timeout_s``).
        page_timeout_s: playwright's timeout for one call on a page inside the worker (what BrowserGym's
            ``BrowserEnv(timeout=...)`` sets): a page that takes longer fails its own step. Below
            ``answer_within_s``, so that a slow page fails its step before its browser is taken for stuck.
        dom_wait_s: how long a step waits for its page's DOM to load after an action and at a reset
            (BrowserGym's wait, 3 s).
    """

    task: str = "click-test"
    max_steps: int = 10
    viewport: tuple[int, int] | None = None
    html: bool = False
    answer_within_s: float = 45.0
    page_timeout_s: float = 20.0
    dom_wait_s: float = 3.0

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise SessionSettingsError(f"max_steps must be at least 1, got {self.max_steps}")
        for name in ("answer_within_s", "page_timeout_s", "dom_wait_s"):
            if not getattr(self, name) > 0:
                raise SessionSettingsError(f"{name} must be above 0 seconds, got {getattr(self, name)}")
        if self.page_timeout_s >= self.answer_within_s:
            raise SessionSettingsError(
                f"page_timeout_s ({self.page_timeout_s:g} s) must be below answer_within_s "
                f"({self.answer_within_s:g} s), else a slow page kills its whole browser as stuck: lower "
                "the page timeout (keyshot reward env --page-timeout-s) or raise the deadline"
            )

    def worker_arguments(self) -> list[str]:
        """The deadlines as the worker process's command line takes them (after the Chromium), in ms."""
        return [str(round(self.page_timeout_s * 1000)), str(round(self.dom_wait_s * 1000))]

    def with_changes(self, task: str | None = None, **changes) -> SessionSettings:
        """These settings with ``task`` (when given) and any other fields, by name, replaced."""
        if task is not None:
            changes["task"] = task
        known = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise TypeError(f"unknown session setting(s) {unknown}: SessionSettings has {known}")
        return dataclasses.replace(self, **changes) if changes else self
