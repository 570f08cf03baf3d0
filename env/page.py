"""What every environment of this floor gives an agent: the :class:`Page` it sees and the :class:`Browser`
it acts in (the replay, the live MiniWoB browser, and any environment added beside them)::

    page = browser.reset()
    while not page.done:
        page = browser.act(agent(page))
    browser.close()
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from PIL import Image

from keyshot.infer.protocol.decode import decoded, read_header


@dataclass
class Page:
    """One page an agent is shown.

    Attributes:
        text: what the agent reads (the goal, the page's structure, the last action's error).
        screenshot: the page's image: a file path, or encoded bytes (PNG/JPEG); None when the page could
            not be shown (``error`` says why).
        step: the page's 0-based step in its episode.
        done: the episode is over (no action follows this page).
        answer: the recorded final answer, on the replay's last page.
        reward: the environment's own reward after this page (MiniWoB's: 1.0 once the task is done right,
            else 0.0); None where the environment has none or the browser failed.
        error: why the browser failed, if it did (the episode is then over and not scored).
    """

    text: str
    screenshot: Path | bytes | None
    step: int
    done: bool
    answer: str | None = None
    reward: float | None = None
    error: str | None = None

    def image(self, max_side: int = 0) -> Image.Image | None:
        """The screenshot decoded (for a VLM policy), shrunk to fit ``max_side`` pixels when given; through
        the protocol's decoder, so an image no screenshot can be (a replayed file) is refused, naming it
        (:class:`~keyshot.infer.protocol.decode.ImageError`), not decoded; transparency on white."""
        if self.screenshot is None:
            return None
        header = read_header(self.screenshot)
        with decoded(header, header.size, header.size) as rgb:
            image = Image.fromarray(rgb)
        if max_side > 0:
            image.thumbnail((max_side, max_side))
        return image


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
