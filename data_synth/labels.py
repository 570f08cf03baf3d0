"""The label store of a synthesis run: one JSON line per trajectory, key-point answer, teacher label
and teacher outcome, appended as soon as each is known.

The store is what makes a run resumable: a restarted run skips every (trajectory, step, teacher)
that already has a label. Lines are flushed one by one, so a killed process loses at most the line
it was writing; a torn last line is cut off when the store is next opened. A later record for the
same key replaces an earlier one (a retried failure appends its new result). Calls whose label line
was lost are still free on resume: the client's SQLite cache holds every well-formed answer.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from keyshot.data_synth.errors import LabelStoreError
from keyshot.infer.common.fileio import cut_torn_tail

logger = logging.getLogger(__name__)

LABELS_FILE = "labels.jsonl"
#: the origin of key points written by the run's own key-point judge
JUDGE_ORIGIN = "judge"


@dataclass
class TrajectoryRecord:
    """What the dataset needs of a trajectory. ``screenshots[i]`` is the image file of step ``i``,
    or None when no pixels are known for that step (imported logs keep only some screenshots)."""

    uid: str
    task_id: str
    task: str
    screenshots: list[str | None]
    agent: str | None = None
    benchmark: str | None = None
    human_label: str | None = None
    source: str = ""


@dataclass
class KeyPointsRecord:
    """Key points of a trajectory from one origin (the run's judge, or an imported teacher's own)."""

    uid: str
    origin: str
    key_points: str | None
    valid: bool
    error: str | None = None
    model: str = ""
    cost_usd: float = 0.0
    cached: bool = False


@dataclass
class LabelRecord:
    """One teacher's answer for one screenshot. ``score`` is 1..5 when ``valid``; a failed call or an
    answer without a readable score has ``valid=False`` and the reason in ``error``."""

    uid: str
    step: int
    teacher: str
    score: int | None
    valid: bool
    error: str | None = None
    text: str = ""
    thought: str = ""
    model: str = ""
    key_points_origin: str = JUDGE_ORIGIN
    prompt_version: str = ""
    source: str = "api"
    cost_usd: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


@dataclass
class OutcomeRecord:
    """A teacher's WebJudge verdict on a whole trajectory (used to filter by human labels)."""

    uid: str
    teacher: str
    success: bool | None
    valid: bool
    error: str | None = None
    source: str = "api"


_KINDS: dict[str, type] = {
    "trajectory": TrajectoryRecord,
    "key_points": KeyPointsRecord,
    "label": LabelRecord,
    "outcome": OutcomeRecord,
}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


@dataclass
class StoreContents:
    """Everything in a label store, the latest record per key."""

    trajectories: dict[str, TrajectoryRecord] = field(default_factory=dict)
    key_points: dict[tuple[str, str], KeyPointsRecord] = field(default_factory=dict)
    labels: dict[tuple[str, int, str], LabelRecord] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], OutcomeRecord] = field(default_factory=dict)

    def add(self, record: Any) -> None:
        if isinstance(record, TrajectoryRecord):
            self.trajectories[record.uid] = record
        elif isinstance(record, KeyPointsRecord):
            self.key_points[(record.uid, record.origin)] = record
        elif isinstance(record, LabelRecord):
            self.labels[(record.uid, record.step, record.teacher)] = record
        elif isinstance(record, OutcomeRecord):
            self.outcomes[(record.uid, record.teacher)] = record
        else:
            raise TypeError(f"not a label-store record: {type(record).__name__}")

    def teachers(self) -> list[str]:
        return sorted({teacher for _, _, teacher in self.labels})

    def labels_by_step(self) -> dict[tuple[str, int], list[LabelRecord]]:
        """``{(uid, step): [label, ...]}`` with labels in teacher-name order."""
        out: dict[tuple[str, int], list[LabelRecord]] = {}
        for key in sorted(self.labels):
            uid, step, _ = key
            out.setdefault((uid, step), []).append(self.labels[key])
        return out


def _decode(line: str, path: Path, lineno: int) -> Any:
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise LabelStoreError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, dict) or data.get("kind") not in _KINDS:
        raise LabelStoreError(
            f"{path}:{lineno}: not a label-store record (kind must be one of {sorted(_KINDS)})"
        )
    cls = _KINDS[data.pop("kind")]
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise LabelStoreError(f"{path}:{lineno}: incomplete {cls.__name__} ({exc})") from None


def iter_records(path: Path) -> Iterator[Any]:
    """Records of a store file in order, read line by line; a torn last line (a killed writer) is
    skipped with a warning."""
    if not path.exists():
        return
    with path.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.endswith("\n"):  # only the last line can lack it: the writer was killed mid-line
                logger.warning(
                    "%s: ignoring a torn last line (%d chars) left by an interrupted run", path, len(line)
                )
                return
            if line.strip():
                yield _decode(line, path, lineno)


def read_store(path: Path) -> StoreContents:
    contents = StoreContents()
    for record in iter_records(path):
        contents.add(record)
    return contents


class LabelStore:
    """Append-only JSONL store with an in-memory view (``contents``) of the latest records."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / LABELS_FILE
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LabelStoreError(f"{self.path.parent}: cannot create the run folder ({exc})") from None
        cut_torn_tail(self.path, "those labels are asked again, their calls come from the cache")
        self.contents = read_store(self.path)
        self._fh: IO[str] | None = None

    def append(self, record: Any) -> None:
        kind = _KIND_OF.get(type(record))
        if kind is None:
            raise TypeError(f"not a label-store record: {type(record).__name__}")
        line = json.dumps({"kind": kind, **dataclasses.asdict(record)}, ensure_ascii=False)
        if self._fh is None:
            try:
                self._fh = self.path.open("a", encoding="utf-8")
            except OSError as exc:
                raise LabelStoreError(f"{self.path}: cannot open for appending ({exc})") from None
        self._fh.write(line + "\n")
        self._fh.flush()  # a killed process loses nothing that was flushed
        self.contents.add(record)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    def __enter__(self) -> LabelStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: How a record made from a call that failed (no answer) starts its ``error``.
CALL_FAILED = "call failed"


def call_failed(record: object | None) -> bool:
    """True for a record whose call got no answer: it is no label, and every run asks again."""
    return record is not None and (getattr(record, "error", None) or "").startswith(CALL_FAILED)
