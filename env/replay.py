"""A stand-in environment for trying the RL examples without a browser: it replays a recorded
trajectory folder (any format ``keyshot judge`` reads), one screenshot per step until its last.

``reset()`` shows the first recorded page; each ``act(action)`` shows the next one, whatever the action,
and the page that shows the last screenshot is ``done`` with the recorded final answer. An episode that
records every page it was shown is the recorded trajectory again, so its reward equals the folder's::

    browser = ReplayBrowser("runs/rollouts/task-17")
    page = browser.reset()
    while not page.done:
        page = browser.act("click('12')")
"""

from __future__ import annotations

from pathlib import Path

from keyshot.env.page import Page
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.loaders import load_trajectory


class ReplayError(KeyshotError):
    """The replayed folder cannot be replayed, or the replay is used past its end."""


class ReplayBrowser:
    """Replays one recorded trajectory (``source``: its folder or JSONL file); a
    :class:`~keyshot.env.page.Browser`."""

    def __init__(self, source: str | Path):
        self.source = Path(source)
        self.trajectory = load_trajectory(self.source)
        if not self.trajectory.screenshots:
            raise ReplayError(f"{self.source}: the recorded trajectory has no screenshots to replay")
        self.step = 0

    @property
    def task(self) -> str:
        return self.trajectory.task

    @property
    def task_id(self) -> str:
        return self.trajectory.task_id

    @property
    def start_url(self) -> str | None:
        return self.trajectory.extra.get("start_url") or self.trajectory.extra.get("website")

    @property
    def last_step(self) -> int:
        return len(self.trajectory.screenshots) - 1

    def reset(self) -> Page:
        """Start over: the first recorded page."""
        self.step = 0
        return self._page()

    def act(self, action: str) -> Page:
        """Take ``action`` (recorded by the caller, ignored by the replay): the next recorded page. A
        one-screenshot trajectory ends at its first action with no new page."""
        if self.step >= self.last_step:
            if self.last_step == 0 and self.step == 0:
                self.step = 1
                return Page(self._text("no more pages"), None, 1, True, self.trajectory.final_answer)
            raise ReplayError(f"{self.source}: the replay is over (its last page was shown); call reset()")
        self.step += 1
        return self._page()

    def close(self) -> None:
        """Nothing to give back (the replay holds no process); here so that every Browser closes alike."""

    def _page(self) -> Page:
        shot = self.trajectory.screenshots[self.step]
        done = self.step == self.last_step and self.last_step > 0
        recorded = self.trajectory.actions[self.step] if self.step < len(self.trajectory.actions) else None
        text = self._text(f"recorded next action: {recorded}" if recorded else "no recorded action")
        return Page(
            text,
            shot.data if shot.data is not None else shot.path,
            self.step,
            done,
            self.trajectory.final_answer if done else None,
        )

    def _text(self, note: str) -> str:
        pages = self.last_step + 1
        return f"Task: {self.task}\nPage {min(self.step, self.last_step) + 1} of {pages} ({note})."
