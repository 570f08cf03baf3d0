"""Where trajectories come from: folders or JSONL files (any format :mod:`keyshot.infer.loaders` reads),
with the agent and benchmark their format may not name, and human labels joined from a file."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import TrajectoryRecord
from keyshot.data_synth.run_folder import store_image
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.human_labels import labels_for_agent
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError

logger = logging.getLogger(__name__)

#: What a fresh clone lacks to run the paper's recipe, and where it goes.
MISSING_DATA_HINT = (
    "download the Online-Mind2Web release (osunlp/Online-Mind2Web on the Hugging Face hub: one folder "
    "per agent of <task_id>/result.json + trajectory/, and human_label.json) into data/online_mind2web/, "
    "or point the config's sources[].path and human_labels at your copy (docs/trajectory-formats.md)"
)


@dataclass
class TrajectorySource:
    """A trajectory folder (or JSONL file) and what its format may not say: agent, benchmark and an
    optional human-label file (Online-Mind2Web ``human_label.json``, or ``{task_id: label}``)."""

    path: str
    format: str = "auto"
    agent: str | None = None
    benchmark: str | None = None
    human_labels: str | None = None


def load_human_labels(path: str | os.PathLike, agent: str | None) -> dict[str, str]:
    """``{task_id: human label}`` of ``agent`` from a label file of any shape the one reader takes
    (:func:`keyshot.infer.loaders.human_labels.labels_for_agent`)."""
    try:
        return labels_for_agent(path, agent)
    except TrajectoryError as exc:
        hint = f"; {MISSING_DATA_HINT}" if not Path(path).exists() else ""
        raise SynthError(f"{exc}{hint}") from None


def iter_trajectories(
    sources: list[TrajectorySource],
    errors: list[str],
    *,
    max_trajectories: int | None = None,
    on_error: str = "skip",
) -> Iterator[Trajectory]:
    """The trajectories of every source, human labels joined; unreadable ones are skipped (their
    errors appended to ``errors``) unless ``on_error="raise"``."""
    count = 0
    for source in sources:
        labels = load_human_labels(source.human_labels, source.agent) if source.human_labels else {}
        errs: list[TrajectoryError] = []
        try:
            trajs = load_trajectories(
                source.path,
                source.format,
                on_error=on_error,  # type: ignore[arg-type]
                agent=source.agent,
                benchmark=source.benchmark,
                errors=errs,
            )
            for traj in trajs:
                if max_trajectories is not None and count >= max_trajectories:
                    return
                if traj.human_label is None and traj.task_id in labels:
                    traj.human_label = labels[traj.task_id]
                count += 1
                yield traj
        except TrajectoryError as exc:
            hint = f"; {MISSING_DATA_HINT}" if not Path(source.path).exists() else ""
            raise SynthError(f"{exc}{hint}") from None
        finally:
            errors.extend(str(e) for e in errs)


def trajectory_record(run_dir: Path, traj: Trajectory) -> TrajectoryRecord:
    shots = [
        store_image(run_dir, traj.uid, s.index, s.data) if s.data is not None else str(Path(s.path).resolve())
        for s in traj.screenshots
    ]
    return TrajectoryRecord(
        uid=traj.uid,
        task_id=traj.task_id,
        task=traj.task,
        screenshots=shots,
        agent=traj.agent,
        benchmark=traj.benchmark,
        human_label=traj.human_label,
        source=str(traj.source) if traj.source else "",
    )
