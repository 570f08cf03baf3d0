"""Import existing WebJudge logs as teacher labels, without paying for a single call again.

Two formats:

* **AgentRewardBench WebJudge records** (``keyshot synth import-arb DIR``): one JSON file per
  (judge, benchmark, agent, task) under ``DIR/<judge>/<benchmark>/<agent>/<task_id>.json``, with
  ``image_judge_record`` (the judge's answer and score for every screenshot, in order), the judge's
  ``key_points``, and the outcome call's ``chat_messages`` in which only the KEPT screenshots are
  embedded (base64). The judge (``judge_model_name``) becomes the teacher. Pixels are recovered by
  the reference keep rule: the screenshots scored >= 3, in trajectory order (at most 50), are the
  embedded images, in order. A record whose image count does not match its kept count contributes
  no pixels (a warning says so). Screenshots of one trajectory kept by any judge get pixels; the
  others have none and are dropped at build time, unless ``trajectories`` points at the AgentLab
  run folders (``<trajectories>/<benchmark>/<agent>/<task_id>``, ``<trajectories>/<agent>/<task_id>``
  or ``<trajectories>/<task_id>``) whose screenshot count matches: then every step gets its file.
  Human labels come from ``index.csv`` (found in DIR or a parent, or given).
* **Reference output JSONL** (``keyshot synth import-reference OUT.jsonl --trajectories DIR``): the
  ``src/run.py`` results file, one task per line (``task_id``, ``image_judge_record``,
  ``key_points``, ``predicted_label``); screenshots come from ``DIR/<task_id>`` (its ``trajectory/``
  folder) and must be as many as the recorded scores. The teacher is named by ``--teacher`` or the
  model in the file name (``<mode>_<model>_score_threshold_<n>_auto_eval_results.json``).

A label's score is the recorded ``Score``: 1-5 is a valid label; 0 (the original run could not read a
score) is an invalid label, dropped by aggregation. Importing twice appends nothing new.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from data_synth.errors import RecordImportError, SynthError
from data_synth.labels import KeyPointsRecord, LabelRecord, LabelStore, OutcomeRecord, TrajectoryRecord
from data_synth.run_folder import open_manifest, store_image
from data_synth.sources import load_human_labels, trajectory_record
from infer.loaders.human_labels import normalize_agent
from infer.loaders.judge_records import find_index, outcome_text, read_arb_index, recorded_score
from infer.parsing import parse_score, parse_status
from infer.prompts import load_prompt_set
from infer.runlock import RunLock
from infer.trajectory import TrajectoryError, load_trajectory
from infer.verdicts import KEEP_THRESHOLD, ScreenshotRecord, select_kept

logger = logging.getLogger(__name__)

_DATA_URL = re.compile(r"^data:[\w.+-]+/[\w.+-]+(?:;[^,;]*)*;base64,", re.DOTALL)
_REFERENCE_NAME = re.compile(
    r"^(?P<mode>.+?_eval)_(?P<model>.+)_score_threshold_\d+_auto_eval_results\.jsonl?$"
)


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
def kept_steps(scores: list[int | None]) -> list[int]:
    """Steps the reference sends to the outcome call: score >= 3, in order, at most 50."""
    records = [ScreenshotRecord(index=i, score=s) for i, s in enumerate(scores)]
    return select_kept(records, KEEP_THRESHOLD, mode="reference")


def _append_new(store: LabelStore, record: object, report: ImportReport) -> None:
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


def _labels_for(
    uid: str, teacher: str, model: str, entries: list, where: str, source: str
) -> Iterator[LabelRecord]:
    for step, entry in enumerate(entries):
        try:
            text, score, error = recorded_score(entry)
        except ValueError as exc:
            raise RecordImportError(f"{where}: image_judge_record[{step}]: {exc}") from None
        yield LabelRecord(
            uid=uid,
            step=step,
            teacher=teacher,
            score=score,
            valid=score is not None,
            error=error,
            text=text,
            thought=parse_score(text, "strict").thought,
            model=model,
            key_points_origin=teacher,
            prompt_version="",
            source=source,
        )


# ---------------------------------------------------------------------------- AgentRewardBench records
def _embedded_images(messages: object, where: str) -> list[bytes]:
    """The base64 images of the outcome call's user content, in order."""
    if not isinstance(messages, list):
        raise RecordImportError(f"{where}: 'chat_messages' must be a list")
    images: list[bytes] = []
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            url = part.get("image_url")
            url = url.get("url", "") if isinstance(url, dict) else str(url or "")
            match = _DATA_URL.match(url)
            if not match:
                raise RecordImportError(f"{where}: an image in chat_messages is not a base64 data URL")
            try:
                images.append(base64.b64decode(url[match.end() :], validate=False))
            except (binascii.Error, ValueError) as exc:
                raise RecordImportError(f"{where}: an embedded image is not valid base64 ({exc})") from None
    return images


def _require(record: dict, key: str, kind: type, where: str) -> object:
    value = record.get(key)
    if not isinstance(value, kind):
        found = "missing" if key not in record else type(value).__name__
        raise RecordImportError(f"{where}: field {key!r} must be a {kind.__name__}, found {found}")
    return value


def _trajectory_folder(root: Path, benchmark: str, agent: str, task_id: str) -> Path | None:
    for candidate in (root / benchmark / agent / task_id, root / agent / task_id, root / task_id):
        if candidate.is_dir():
            return candidate
    return None


@dataclass
class _ArbTrajectory:
    task_id: str
    task: str
    agent: str
    benchmark: str
    steps: int
    source: str
    pixels: dict[int, str] = field(default_factory=dict)


def import_arb(
    records_dir: str | os.PathLike,
    run_dir: str | os.PathLike,
    *,
    index_csv: str | os.PathLike | None = None,
    trajectories_dir: str | os.PathLike | None = None,
    judges: list[str] | None = None,
    prompt_variant: str = "online_mind2web",
) -> ImportReport:
    """Import every AgentRewardBench WebJudge record under ``records_dir`` into the run folder.

    ``judges`` keeps only records whose ``judge_model_name`` (or judge folder name) is listed.
    """
    root = Path(records_dir)
    run = Path(run_dir)
    if not root.is_dir():
        raise SynthError(f"{root}: not a folder of WebJudge records")
    files = sorted(p for p in root.rglob("*.json") if p.is_file())
    if not files:
        raise SynthError(f"{root}: no *.json WebJudge records found")
    index_path = Path(index_csv) if index_csv else find_index(root)
    try:
        human = {row.key: row.human for row in read_arb_index(index_path)} if index_path else {}
    except TrajectoryError as exc:
        raise SynthError(str(exc)) from None
    report = ImportReport()
    trajectories: dict[str, _ArbTrajectory] = {}
    prompts = load_prompt_set(prompt_variant)

    with RunLock(run):
        open_manifest(
            run,
            prompt_variant=prompts.variant,
            prompt_version=prompts.version,
            image_policy=None,
            parse_mode="strict",
            kind="import-arb",
            source=str(root),
        )
        with LabelStore(run) as store:
            for path in tqdm(files, desc="ARB records", unit="record", disable=None):
                rel = path.relative_to(root).as_posix()
                try:
                    _import_arb_record(path, rel, run, store, trajectories, judges, report)
                except RecordImportError as exc:
                    logger.warning("skipping record: %s", exc)
                    report.errors.append(str(exc))
            for uid, t in sorted(trajectories.items()):
                shots: list[str | None] = [t.pixels.get(i) for i in range(t.steps)]
                if trajectories_dir is not None:
                    joined = _join_folder(Path(trajectories_dir), t, uid)
                    if joined is not None:
                        shots = joined
                        report.joined_trajectory_folders += 1
                record = TrajectoryRecord(
                    uid=uid,
                    task_id=t.task_id,
                    task=t.task,
                    screenshots=shots,
                    agent=t.agent,
                    benchmark=t.benchmark,
                    human_label=human.get((t.benchmark, normalize_agent(t.agent), t.task_id)),
                    source=t.source,
                )
                _append_new(store, record, report)
                report.trajectories += 1
                report.steps_with_pixels += sum(s is not None for s in shots)
                report.steps_without_pixels += sum(s is None for s in shots)
    return report


def _join_folder(root: Path, t: _ArbTrajectory, uid: str) -> list[str | None] | None:
    folder = _trajectory_folder(root, t.benchmark, t.agent, t.task_id)
    if folder is None:
        return None
    try:
        traj = load_trajectory(folder, agent=t.agent, benchmark=t.benchmark)
    except TrajectoryError as exc:
        logger.warning("%s: cannot join the trajectory folder: %s", uid, exc)
        return None
    if traj.num_screenshots != t.steps:
        logger.warning(
            "%s: %s has %d screenshots but the records score %d; keeping the embedded ones only",
            uid,
            folder,
            traj.num_screenshots,
            t.steps,
        )
        return None
    return [
        str(Path(s.path).resolve()) if s.data is None else t.pixels.get(s.index) for s in traj.screenshots
    ]


def _import_arb_record(
    path: Path,
    rel: str,
    run: Path,
    store: LabelStore,
    trajectories: dict[str, _ArbTrajectory],
    judges: list[str] | None,
    report: ImportReport,
) -> None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordImportError(f"{path}: not a readable JSON record ({exc})") from None
    if not isinstance(record, dict):
        raise RecordImportError(f"{path}: expected a JSON object")
    report.records += 1
    teacher = str(_require(record, "judge_model_name", str, str(path)))
    judge_folder = rel.split("/")[0] if "/" in rel else ""
    if judges and teacher not in judges and judge_folder not in judges:
        report.records -= 1
        return
    task = str(_require(record, "goal", str, str(path))).strip()
    agent = str(_require(record, "agent", str, str(path)))
    benchmark = str(_require(record, "benchmark", str, str(path)))
    entries = list(_require(record, "image_judge_record", list, str(path)))  # type: ignore[arg-type]
    key_points = str(_require(record, "key_points", str, str(path)))
    task_id = path.stem
    uid = f"{benchmark}/{agent}/{task_id}"
    source = f"import:arb:{rel}"

    labels = list(_labels_for(uid, teacher, teacher, entries, str(path), source))
    images = _embedded_images(record.get("chat_messages", []), str(path))
    kept = kept_steps([lb.score for lb in labels])
    t = trajectories.setdefault(uid, _ArbTrajectory(task_id, task, agent, benchmark, len(entries), source))
    if t.steps != len(entries):
        raise RecordImportError(
            f"{path}: {len(entries)} scored screenshots, but another judge's record of {uid} has {t.steps}"
        )
    if len(images) == len(kept):
        for step, data in zip(kept, images, strict=True):
            if step not in t.pixels:
                t.pixels[step] = store_image(run, uid, step, data)
    else:
        msg = f"{path}: {len(images)} embedded images for {len(kept)} kept screenshots; no pixels taken"
        logger.warning("%s", msg)
        report.image_count_mismatches.append(msg)

    _append_new(store, KeyPointsRecord(uid, teacher, key_points, True, model=teacher), report)
    for label in labels:
        _append_new(store, label, report)
    text = outcome_text(record)
    if text is not None:
        status = parse_status(text, "strict")
        _append_new(
            store, OutcomeRecord(uid, teacher, status.success, status.valid, status.error, source), report
        )


# ---------------------------------------------------------------------------- reference run.py output
def teacher_from_filename(path: Path) -> str | None:
    match = _REFERENCE_NAME.match(path.name)
    return match.group("model") if match else None


def import_reference(
    results_path: str | os.PathLike,
    trajectories_dir: str | os.PathLike,
    run_dir: str | os.PathLike,
    *,
    teacher: str | None = None,
    agent: str | None = None,
    benchmark: str | None = None,
    human_labels: str | os.PathLike | None = None,
    fmt: str = "auto",
    prompt_variant: str = "online_mind2web",
) -> ImportReport:
    """Import the reference ``src/run.py`` results (JSON lines) joined with their trajectory folders."""
    results = Path(results_path)
    traj_root = Path(trajectories_dir)
    run = Path(run_dir)
    if not results.is_file():
        raise SynthError(f"{results}: results file not found")
    if not traj_root.is_dir():
        raise SynthError(f"{traj_root}: trajectory folder not found")
    name = teacher or teacher_from_filename(results)
    if not name:
        raise SynthError(
            f"{results}: cannot tell the teacher from the file name; pass --teacher (the judge model that wrote it)"
        )
    labels_by_task = load_human_labels(human_labels, agent) if human_labels else {}
    prompts = load_prompt_set(prompt_variant)
    report = ImportReport()
    with RunLock(run):
        open_manifest(
            run,
            prompt_variant=prompts.variant,
            prompt_version=prompts.version,
            image_policy=None,
            parse_mode="strict",
            kind="import-reference",
            source=str(results),
        )
        with LabelStore(run) as store, results.open(encoding="utf-8") as fh:
            for lineno, line in enumerate(tqdm(fh, desc="reference results", unit="task", disable=None), 1):
                if not line.strip():
                    continue
                where = f"{results}:{lineno}"
                try:
                    _import_reference_line(
                        line,
                        where,
                        traj_root,
                        run,
                        store,
                        name,
                        agent,
                        benchmark,
                        fmt,
                        labels_by_task,
                        report,
                    )
                except (RecordImportError, TrajectoryError) as exc:
                    logger.warning("skipping: %s", exc)
                    report.errors.append(str(exc))
    return report


def _import_reference_line(
    line: str,
    where: str,
    traj_root: Path,
    run: Path,
    store: LabelStore,
    teacher: str,
    agent: str | None,
    benchmark: str | None,
    fmt: str,
    human: dict[str, str],
    report: ImportReport,
) -> None:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise RecordImportError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict):
        raise RecordImportError(f"{where}: expected a JSON object")
    report.records += 1
    task_id = str(_require(record, "task_id", str, where))
    entries = list(_require(record, "image_judge_record", list, where))  # type: ignore[arg-type]
    key_points = str(_require(record, "key_points", str, where))
    folder = traj_root / task_id
    if not folder.is_dir():
        raise RecordImportError(f"{where}: no trajectory folder {folder} for task {task_id!r}")
    traj = load_trajectory(folder, fmt, agent=agent, benchmark=benchmark)
    if traj.num_screenshots != len(entries):
        raise RecordImportError(
            f"{where}: {folder} has {traj.num_screenshots} screenshots but the record scores {len(entries)}"
        )
    if traj.human_label is None and task_id in human:
        traj.human_label = human[task_id]
    uid = traj.uid
    source = f"import:reference:{Path(where).name}"
    _append_new(store, trajectory_record(run, traj), report)
    report.trajectories += 1
    report.steps_with_pixels += traj.num_screenshots
    _append_new(store, KeyPointsRecord(uid, teacher, key_points, True, model=teacher), report)
    for label in _labels_for(uid, teacher, teacher, entries, where, source):
        _append_new(store, label, report)
    predicted = record.get("predicted_label")
    if predicted in (0, 1, True, False):
        _append_new(store, OutcomeRecord(uid, teacher, bool(predicted), True, None, source), report)
