"""Import the reference's results as teacher labels (``keyshot synth import-reference OUT.jsonl --trajectories DIR``): the
``src/run.py`` results file, one task per line (``task_id``, ``image_judge_record``,
``key_points``, ``predicted_label``); screenshots come from ``DIR/<task_id>`` (its ``trajectory/``
folder) and must be as many as the recorded scores. The teacher is named by ``--teacher`` or the
model in the file name (``<mode>_<model>_score_threshold_<n>_auto_eval_results.json``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from tqdm import tqdm

from keyshot.data_synth.errors import RecordImportError, SynthError
from keyshot.data_synth.importers import ImportReport, append_new, labels_for, open_import, require_field
from keyshot.data_synth.labels import KeyPointsRecord, LabelStore, OutcomeRecord
from keyshot.data_synth.sources import load_human_labels, trajectory_record
from keyshot.infer.loaders import load_trajectory
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.runs.lock import RunLock

logger = logging.getLogger(__name__)

_REFERENCE_NAME = re.compile(
    r"^(?P<mode>.+?_eval)_(?P<model>.+)_score_threshold_\d+_auto_eval_results\.jsonl?$"
)


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
        open_import(run, prompts, kind="import-reference", source=str(results))
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
    task_id = str(require_field(record, "task_id", str, where))
    entries = list(require_field(record, "image_judge_record", list, where))  # type: ignore[arg-type]
    key_points = str(require_field(record, "key_points", str, where))
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
    append_new(store, trajectory_record(run, traj), report)
    report.trajectories += 1
    report.steps_with_pixels += traj.num_screenshots
    append_new(store, KeyPointsRecord(uid, teacher, key_points, True, model=teacher), report)
    for label in labels_for(uid, teacher, teacher, entries, where, source):
        append_new(store, label, report)
    predicted = record.get("predicted_label")
    if predicted in (0, 1, True, False):
        append_new(store, OutcomeRecord(uid, teacher, bool(predicted), True, None, source), report)
