"""Import existing WebJudge logs as teacher labels, without paying for a single call again: what the
two importers share (their report, the keep rule of the recorded scores, label records, idempotent appends).

* AgentRewardBench WebJudge records: :mod:`keyshot.data_synth.arb_import` (``keyshot synth import-arb``).
* The reference ``src/run.py`` results: :mod:`keyshot.data_synth.reference_import` (``keyshot synth import-reference``).

A label's score is the recorded ``Score``: 1-5 is a valid label; 0 (the original run could not read a
score) is an invalid label, dropped by aggregation. Its description is the one the record's own outcome
prompt showed, read by the rule of the prompt set that answered it, as judging reads the record. Importing
twice appends nothing new.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.data_synth.errors import RecordImportError
from keyshot.data_synth.labels import (
    KeyPointsRecord,
    LabelRecord,
    LabelStore,
    OutcomeRecord,
    TrajectoryRecord,
)
from keyshot.data_synth.run_folder import open_manifest
from keyshot.infer.loaders.judge_records import recorded_answers
from keyshot.infer.protocol.prompts import PromptSet
from keyshot.infer.protocol.verdicts import KEEP_THRESHOLD, ScreenshotRecord, select_kept

logger = logging.getLogger(__name__)


@dataclass
class ImportReport:
    records: int = 0
    trajectories: int = 0
    labels: int = 0
    labels_invalid: int = 0
    labels_already_present: int = 0
    steps_with_pixels: int = 0
    steps_without_pixels: int = 0
    image_count_mismatches: list[str] = field(default_factory=list)
    joined_trajectory_folders: int = 0
    errors: list[str] = field(default_factory=list)
    teachers: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        lines = [
            f"records read: {self.records} ({len(self.errors)} skipped with errors)",
            f"trajectories: {self.trajectories}; labels: {self.labels} new ({self.labels_invalid} invalid), "
            f"{self.labels_already_present} already present",
            f"screenshots with pixels: {self.steps_with_pixels}, without (dropped at build): {self.steps_without_pixels}",
            "teachers: " + ", ".join(f"{t} ({n})" for t, n in sorted(self.teachers.items())),
        ]
        if self.joined_trajectory_folders:
            lines.append(f"trajectory folders joined for pixels: {self.joined_trajectory_folders}")
        if self.image_count_mismatches:
            lines.append(
                f"records whose embedded images did not match their kept screenshots: {len(self.image_count_mismatches)}"
            )
        for err in self.errors[:10]:
            lines.append(f"  error: {err}")
        return "\n".join(lines)


# ---------------------------------------------------------------------------- shared pieces
def open_import(run: Path, prompts: PromptSet, *, kind: str, source: str) -> None:
    """The run folder's manifest for labels imported from released records (no image policy: the
    records' own screenshots; strict parsing)."""
    open_manifest(
        run,
        prompt_variant=prompts.variant,
        prompt_version=prompts.version,
        image_policy=None,
        parse_mode="strict",
        kind=kind,
        source=source,
    )


def kept_steps(scores: list[int | None]) -> list[int]:
    """Steps the reference sends to the outcome call: score >= 3, in order, at most 50."""
    records = [ScreenshotRecord(index=i, score=s) for i, s in enumerate(scores)]
    return select_kept(records, KEEP_THRESHOLD, mode="reference")


def append_new(store: LabelStore, record: object, report: ImportReport) -> None:
    """Append unless the store already holds exactly this record (so a re-import adds nothing)."""
    contents = store.contents
    if isinstance(record, LabelRecord):
        existing = contents.labels.get((record.uid, record.step, record.teacher))
        if existing == record:
            report.labels_already_present += 1
            return
        report.labels += 1
        report.labels_invalid += not record.valid
        report.teachers[record.teacher] = report.teachers.get(record.teacher, 0) + 1
    elif isinstance(record, KeyPointsRecord):
        if contents.key_points.get((record.uid, record.origin)) == record:
            return
    elif isinstance(record, OutcomeRecord):
        if contents.outcomes.get((record.uid, record.teacher)) == record:
            return
    elif isinstance(record, TrajectoryRecord) and contents.trajectories.get(record.uid) == record:
        return
    store.append(record)


def labels_for(
    uid: str, teacher: str, model: str, entries: list, where: str, source: str
) -> list[LabelRecord]:
    """A record's screenshot answers as labels, read as judging reads the record
    (:func:`~keyshot.infer.loaders.judge_records.recorded_answers`): the same scores and descriptions."""
    try:
        answers = recorded_answers(entries)
    except ValueError as exc:
        raise RecordImportError(f"{where}: {exc}") from None
    return [
        LabelRecord(
            uid=uid,
            step=step,
            teacher=teacher,
            score=answer.score,
            valid=answer.score is not None,
            error=answer.error,
            text=answer.text,
            thought=answer.thought,
            model=model,
            key_points_origin=teacher,
            prompt_version="",
            source=source,
        )
        for step, answer in enumerate(answers)
    ]


def require_field(record: dict, key: str, kind: type, where: str) -> object:
    value = record.get(key)
    if not isinstance(value, kind):
        found = "missing" if key not in record else type(value).__name__
        raise RecordImportError(f"{where}: field {key!r} must be a {kind.__name__}, found {found}")
    return value
