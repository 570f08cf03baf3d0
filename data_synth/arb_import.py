"""Import AgentRewardBench's WebJudge records as teacher labels (``keyshot synth import-arb DIR``): one JSON file per
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
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from keyshot.data_synth.errors import RecordImportError, SynthError
from keyshot.data_synth.importers import (
    ImportReport,
    append_new,
    kept_steps,
    labels_for,
    open_import,
    require_field,
)
from keyshot.data_synth.labels import KeyPointsRecord, LabelStore, OutcomeRecord, TrajectoryRecord
from keyshot.data_synth.run_folder import store_image
from keyshot.infer.loaders import load_trajectory
from keyshot.infer.loaders.common import data_url_bytes
from keyshot.infer.loaders.human_labels import normalize_agent
from keyshot.infer.loaders.judge_records import find_index, outcome_text, read_arb_index, record_task
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.protocol.images import ImageError, decode_image
from keyshot.infer.protocol.parsing import parse_status
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.runs.lock import RunLock

logger = logging.getLogger(__name__)


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
            data = data_url_bytes(url)  # keyshot's one reader of a data URL
            if data is None:
                raise RecordImportError(
                    f"{where}: an image in chat_messages is not a data URL with valid base64 data"
                )
            try:
                decode_image(data)
            except ImageError as exc:
                raise RecordImportError(
                    f"{where}: embedded image {len(images) + 1} in chat_messages: {exc.problem}"
                ) from None
            images.append(data)
    return images


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
        open_import(run, prompts, kind="import-arb", source=str(root))
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
                append_new(store, record, report)
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
    teacher = str(require_field(record, "judge_model_name", str, str(path)))
    judge_folder = rel.split("/")[0] if "/" in rel else ""
    if judges and teacher not in judges and judge_folder not in judges:
        report.records -= 1
        return
    require_field(record, "goal", str, str(path))
    task = record_task(record)  # as judging reads it: without the notes of the goal's images
    agent = str(require_field(record, "agent", str, str(path)))
    benchmark = str(require_field(record, "benchmark", str, str(path)))
    entries = list(require_field(record, "image_judge_record", list, str(path)))  # type: ignore[arg-type]
    key_points = str(require_field(record, "key_points", str, str(path)))
    task_id = path.stem
    uid = f"{benchmark}/{agent}/{task_id}"
    source = f"import:arb:{rel}"

    labels = labels_for(uid, teacher, teacher, entries, str(path), source)
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

    append_new(store, KeyPointsRecord(uid, teacher, key_points, True, model=teacher), report)
    for label in labels:
        append_new(store, label, report)
    text = outcome_text(record)
    if text is not None:
        status = parse_status(text, "strict")
        append_new(
            store, OutcomeRecord(uid, teacher, status.success, status.valid, status.error, source), report
        )
