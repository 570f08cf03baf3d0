"""Web-agent trajectories: a task, the agent's actions (and thoughts) and its screenshots.

Screenshots are lazy: a trajectory holds paths (or, for inline screenshots, the encoded bytes) and
decodes an image only when :meth:`Screenshot.load` or :meth:`Screenshot.prepare` is called, so a
300-trajectory folder does not sit in memory.

Formats are read by :mod:`keyshot.infer.loaders` and documented in ``docs/trajectory-formats.md``.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from PIL import Image

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.protocol.images import (
    DEFAULT_POLICY,
    ImageError,
    ImagePolicy,
    PreparedImage,
    decode_image,
    prepare_image,
)

logger = logging.getLogger(__name__)

HumanLabel = Literal["success", "failure", "unsure", "not_executable"]
#: The canonical human labels: success, failure, unsure (AgentRewardBench's; dropped by the metrics) and
#: not executable (Online-Mind2Web's "2"). Readers map their files' spellings to these
#: (:func:`keyshot.infer.loaders.human_labels.normalize_human_label`).
SUCCESS, FAILURE, UNSURE, NOT_EXECUTABLE = "success", "failure", "unsure", "not_executable"
HUMAN_LABELS: tuple[str, ...] = (SUCCESS, FAILURE, UNSURE, NOT_EXECUTABLE)
OnError = Literal["raise", "skip"]


class TrajectoryError(KeyshotError):
    """Bad trajectory input. The message starts with the file (and line, for JSONL) it is about."""

    def __init__(self, path: Path | str, problem: str, line: int | None = None):
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {problem}")
        self.path = Path(path)
        self.line = line
        self.problem = problem


class SkippedEntry(TrajectoryError):
    """An entry of the input that holds no trajectory (an archive, a stray file, an empty JSONL file):
    not judged, listed with the reason. ``on_error="raise"`` warns of it instead of stopping."""


@dataclass(frozen=True)
class Screenshot:
    """One screenshot of a trajectory.

    ``index`` is the position in the trajectory (0-based, after ordering). ``path`` is the image file;
    for a screenshot embedded in the trajectory file (a data URL in JSONL or Online-Mind2Web v2),
    ``path`` is that file and ``data`` holds the encoded image.
    """

    path: Path
    index: int
    data: bytes | None = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        return f"{self.path}#screenshot{self.index}" if self.data is not None else str(self.path)

    @property
    def recorded_name(self) -> str:
        """:attr:`name` with the file's absolute path: what a verdict records, so that the screenshot is
        found again from any working folder."""
        path = os.path.abspath(self.path)
        return f"{path}#screenshot{self.index}" if self.data is not None else path

    def read_bytes(self) -> bytes:
        """The encoded image as stored (PNG, JPEG, ...)."""
        if self.data is not None:
            return self.data
        try:
            return self.path.read_bytes()
        except OSError as exc:
            raise TrajectoryError(self.path, f"cannot read screenshot: {exc.strerror or exc}") from exc

    def load(self) -> Image.Image:
        """Open and fully decode the screenshot; a corrupt, truncated or empty file raises TrajectoryError."""
        try:
            return decode_image(self._source())
        except ImageError as exc:
            raise TrajectoryError(self.name, exc.problem) from exc

    def prepare(self, policy: ImagePolicy = DEFAULT_POLICY) -> PreparedImage:
        """The screenshot under the image policy (see :func:`keyshot.infer.protocol.images.prepare_image`)."""
        try:
            return prepare_image(self._source(), policy)
        except ImageError as exc:
            raise TrajectoryError(self.name, exc.problem) from exc

    def _source(self) -> Path | bytes:
        if self.data is not None:
            return self.data
        if not self.path.is_file():
            raise TrajectoryError(self.path, "screenshot file is missing")
        return self.path


@dataclass
class Trajectory:
    """One agent run on one task.

    ``actions`` are the actions the agent executed (its final answer is not an action, see
    ``final_answer``); ``thoughts``, when the format has them, align one-to-one with ``actions``.
    ``human_label`` is one of :data:`HUMAN_LABELS`; ``reward`` is a benchmark's rule-based reward.
    ``run`` tells apart runs of one task by one agent (AgentLab: the run's timestamp; JSONL: ``run``):
    identity is benchmark + task + agent + run, so distinct runs are never merged.
    ``final_answer`` is recorded but never shown to the judge (agents' answers hallucinate).
    """

    task_id: str
    task: str
    actions: list[str]
    thoughts: list[str] | None = None
    screenshots: list[Screenshot] = field(default_factory=list)
    agent: str | None = None
    benchmark: str | None = None
    human_label: str | None = None
    reward: float | None = None
    source: Path | None = None
    format: str = "memory"
    final_answer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    run: str | None = None

    def __post_init__(self) -> None:
        if self.human_label is not None and self.human_label not in HUMAN_LABELS:
            raise ValueError(f"human_label must be one of {HUMAN_LABELS} or None, got {self.human_label!r}")
        if self.thoughts is not None and len(self.thoughts) != len(self.actions):
            raise ValueError(
                f"trajectory {self.task_id!r}: {len(self.thoughts)} thoughts for {len(self.actions)} actions "
                "(thoughts must align one-to-one with actions)"
            )

    @property
    def uid(self) -> str:
        """A key that stays unique across agents, benchmarks and runs: ``benchmark/agent/task_id[@run]``."""
        uid = "/".join(part for part in (self.benchmark, self.agent, self.task_id) if part)
        return f"{uid}@{self.run}" if self.run else uid

    @property
    def num_screenshots(self) -> int:
        return len(self.screenshots)
