"""The recorder an RL environment keeps: one :class:`Episode` per rollout, scored at its end; and the
:class:`Page` an environment shows its agent after each action; :class:`EpisodeRecorder`, the mixin of an
environment that keeps one.

Screenshots are written to disk as they arrive (nothing decoded stays in memory): a temporary folder,
removed once the episode is scored, or ``keep_dir`` (kept). The folder is a keyshot JSONL trajectory set
that ``keyshot judge`` and ``keyshot report`` read as it is::

    KEEP_DIR/<episode id>.jsonl          one line: task, actions, thoughts, final answer, screenshots
    KEEP_DIR/<episode id>/step_000.png   the screenshots, in step order

so ``keyshot judge KEEP_DIR --config ...`` judges every kept episode (each its own ``run``).

An environment records through the episode's methods only: :meth:`Episode.add_step` (a screenshot, an
action, or both), :meth:`Episode.fail` (the environment failed: no reward, the reason named) and
:meth:`Episode.finish`. ``screenshots``, ``actions``, ``thoughts`` and ``problems`` are read-only views.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from keyshot.infer.loaders.jsonl import write_jsonl
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory
from keyshot.infer.protocol.decode import decoded, read_header
from keyshot.infer.protocol.images import sniff_image_type
from keyshot.reward.rollouts import RolloutError, encoded_image, is_path_like, task_key

_counter = itertools.count()


def _view(name: str, doc: str) -> property:
    """A read-only view (a tuple) of the list an Episode keeps as ``name``: nobody appends from outside."""
    return property(lambda self: tuple(getattr(self, name)), doc=doc)


@dataclass
class Page:
    """One page an agent is shown: what every environment's ``reset``/``act`` return
    (:class:`keyshot.env.page.Browser`; :mod:`keyshot.env.page` re-exports this class) and what an OpenRLHF
    agent's ``start``/``act`` return (:mod:`keyshot.frameworks.openrlhf.reward`, whose ``Observation`` is this class
    under its former name). It lives beside :class:`Episode`, the recorder of the pages, so that both floors
    share it (the reward floor imports nothing of the environment floor).

    Attributes:
        text: what the agent reads (the goal, the page's structure, the last action's error).
        screenshot: the page's image: a file path, or encoded bytes (PNG/JPEG); None when the page could
            not be shown (``error`` says why). An OpenRLHF agent's page may also hold what OpenRLHF's
            ``load_images`` reads (a PIL image, base64 text): it is recorded and shown as it is.
        step: the page's 0-based step in its episode.
        done: the episode is over (no action follows this page).
        answer: the final answer, on an episode's last page (the replay's recorded one, an agent's own).
        reward: the environment's own reward after this page (MiniWoB's: 1.0 once the task is done right,
            else 0.0); None where the environment has none or the browser failed.
        error: why the browser failed, if it did (the episode is then over and not scored).
        html: the page's pruned HTML (BrowserGym's ``prune_html`` of its DOM), where the environment reads
            it (the live MiniWoB browser does); None elsewhere.
    """

    text: str
    screenshot: Path | bytes | None = None
    step: int = 0
    done: bool = False
    answer: str | None = None
    reward: float | None = None
    error: str | None = None
    html: str | None = None

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


class Episode:
    """One rollout as the environment saw it.

    Args:
        task: the task the agent was given.
        start_url: where it started (recorded in the trajectory's ``extra``).
        task_id: the task's id (episodes of one task share one key-point call either way: the call
            depends on the task text); default: a hash of the task.
        keep_dir: keep the episode there after scoring (a folder ``keyshot judge`` reads).
    """

    def __init__(
        self,
        task: str,
        start_url: str | None = None,
        task_id: str | None = None,
        keep_dir: str | os.PathLike | None = None,
    ):
        self.task = task
        self.start_url = start_url
        self.task_id = task_id or task_key(task or "")
        self.id = f"{self.task_id}-{os.getpid()}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
        self.keep_dir = Path(keep_dir) if keep_dir is not None else None
        if self.keep_dir is not None:
            self.keep_dir.mkdir(parents=True, exist_ok=True)
        self.root = self.keep_dir or Path(tempfile.mkdtemp(prefix="keyshot-episode-"))
        self.folder = self.root / self.id
        self.folder.mkdir()
        self._screenshots: list[Path] = []
        self._actions: list[str] = []
        self._thoughts: list[str] = []
        self._problems: list[str] = []  # what could not be recorded, or failed: the episode is not scored
        self._shots_seen = 0  # screenshots offered to add_step, recorded or not (their file numbers)
        self.final_answer: str | None = None
        self.finished = False

    def __repr__(self) -> str:
        return f"Episode({self.id!r}, steps={len(self._screenshots)}, finished={self.finished})"

    screenshots = _view("_screenshots", "The recorded screenshots' files, in step order (:meth:`add_step`).")
    actions = _view("_actions", "The recorded actions, in step order (:meth:`add_step`).")
    thoughts = _view("_thoughts", 'The thought of each recorded action ("" where none was given).')
    problems = _view(
        "_problems", "Why the episode cannot be scored: non-images recorded, :meth:`fail` reasons."
    )

    @property
    def jsonl_path(self) -> Path:
        return self.root / f"{self.id}.jsonl"

    def add_step(self, screenshot: Any = None, action: str | None = None, thought: str | None = None) -> None:
        """Record one step, in the order an environment shows pages: the first page with no action (what
        reset showed), then each ``action`` with the page it led to (``screenshot``: the page *after* the
        action). Either may be missing: an action whose page could not be shown (None), a page without
        an action (the first).

        ``screenshot`` (PIL image, PNG/JPEG bytes, base64 or a path) is written to disk now; one that is
        not an image is recorded as a problem (the episode's reward is then None, naming it), never
        raised. ``action`` (and its ``thought``) is recorded whenever given, with or without a screenshot.
        """
        if action is not None:
            self._actions.append(str(action))
            self._thoughts.append(str(thought or ""))
        if screenshot is None:
            return
        step = self._shots_seen
        self._shots_seen += 1
        try:
            self._screenshots.append(self._spill(screenshot, step))
        except (RolloutError, OSError) as exc:
            self._problems.append(f"step {step}: {exc}")

    def fail(self, reason: str) -> None:
        """Mark the episode as not scoreable (the environment failed: a browser that died, a page that
        did not load): its reward is None with ``reason``, and the rest of its batch is scored."""
        self._problems.append(f"episode {self.id}: {reason}")

    def _spill(self, screenshot: Any, step: int) -> Path:
        what = f"episode {self.id}: step {step}"
        if isinstance(screenshot, Image.Image):
            path = self.folder / f"step_{step:03d}.png"
            screenshot.save(path, format="PNG", compress_level=1)
            return path
        if is_path_like(screenshot) and Path(screenshot).is_file():
            with open(screenshot, "rb") as f:
                _, ext = sniff_image_type(encoded_image(f.read(16), what))
            path = self.folder / f"step_{step:03d}{ext}"
            shutil.copyfile(screenshot, path)
            return path
        data = encoded_image(screenshot, what)
        path = self.folder / f"step_{step:03d}{sniff_image_type(data)[1]}"
        path.write_bytes(data)
        return path

    def finish(self, answer: str | None = None) -> None:
        """The episode is over; ``answer`` is the agent's final answer (recorded, never shown to the
        judge). Writes the trajectory file."""
        self.final_answer = answer
        self.finished = True
        write_jsonl([self._trajectory()], self.jsonl_path)

    def problem(self) -> str | None:
        """Why this episode cannot be scored, or None."""
        if not self.task or not self.task.strip():
            return f"episode {self.id}: no task"
        if self._problems:
            return "; ".join(self._problems)
        if not self._screenshots:
            return f"episode {self.id}: no screenshots (call add_step with each page the agent saw)"
        return None

    def _trajectory(self) -> Trajectory:
        return Trajectory(
            task_id=self.task_id,
            task=self.task,
            actions=list(self._actions),
            thoughts=list(self._thoughts) if any(self._thoughts) else None,
            screenshots=[Screenshot(path=p, index=i) for i, p in enumerate(self._screenshots)],
            agent="episode",
            final_answer=self.final_answer,
            extra={"start_url": self.start_url} if self.start_url else {},
            run=self.id,
            source=self.jsonl_path,
            format="jsonl",
        )

    def trajectory(self) -> Trajectory:
        """The episode as a Trajectory (lazy: screenshots stay files); raises RolloutError if it cannot
        be scored."""
        if problem := self.problem():
            raise RolloutError(problem)
        return self._trajectory()

    def discard(self) -> None:
        """Remove the spilled files unless the episode is kept (called once it is scored)."""
        if self.keep_dir is None:
            shutil.rmtree(self.root, ignore_errors=True)
        elif not self.jsonl_path.exists():
            write_jsonl([self._trajectory()], self.jsonl_path)


class EpisodeRecorder:
    """Mixin for an environment that records its :class:`Episode` (a TRL ``environment_factory`` class:
    ``keyshot.frameworks.trl.reward`` exports it; keyshot's own ``keyshot.frameworks.trl.env.WebEnv``): ``_start_episode`` in
    ``reset``, ``_record`` in each tool method::

        def click(self, bid: str) -> str:
            obs = self.browser.click(bid)
            return self._record(obs.screenshot, action=f"click({bid!r})", text=obs.text)

    ``keep_dir`` (a constructor argument: a subclass passes it on with ``super().__init__(keep_dir=...)``)
    keeps every episode there. The names start with ``_`` because TRL exposes every other public method of
    the environment to the policy as a tool.
    """

    episode: Episode | None = None
    episode_keep_dir: str | None = None  # set by the constructor

    def __init__(self, *, keep_dir: str | os.PathLike | None = None):
        self.episode = None
        self.episode_keep_dir = None if keep_dir is None else str(keep_dir)

    def _start_episode(self, task: str, start_url: str | None = None, task_id: str | None = None) -> Episode:
        self.episode = Episode(task, start_url=start_url, task_id=task_id, keep_dir=self.episode_keep_dir)
        return self.episode

    def _record(
        self, screenshot: Any, action: str | None = None, thought: str | None = None, text: Any = None
    ):
        """Record the step and return ``text`` (the tool's answer to the policy), else the screenshot."""
        if self.episode is None:
            raise RuntimeError("_record() before _start_episode(task): start the episode in reset()")
        self.episode.add_step(screenshot, action=action, thought=thought)
        return screenshot if text is None else text
