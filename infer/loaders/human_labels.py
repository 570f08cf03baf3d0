"""Online-Mind2Web human labels (``human_label.json``) attached to trajectories.

The file is a list of ``{"task_id", "confirmed_task", "<Agent>_human_label": "0" | "1" | "2"}``
objects, one column per agent (``Operator``, ``Agent-E``, ``Browser_Use``, ``Claude_Computer_Use_3.5``,
``Claude_Computer_Use_3.7``, ``SeeAct``). ``"0"`` is failure, ``"1"`` success, ``"2"`` not executable.
Agent names match loosely: case, spaces, hyphens and underscores are ignored ("browser use" →
``Browser_Use``).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyshot.infer.loaders.common import read_json
from keyshot.infer.loaders.trajectory import (
    FAILURE,
    NOT_EXECUTABLE,
    SUCCESS,
    UNSURE,
    Trajectory,
    TrajectoryError,
)

logger = logging.getLogger(__name__)

LABEL_CODES = {"0": FAILURE, "1": SUCCESS, "2": NOT_EXECUTABLE}
COLUMN_SUFFIX = "_human_label"
_HUMAN_ALIASES = {
    **LABEL_CODES,
    "success": SUCCESS,
    "successful": SUCCESS,
    "true": SUCCESS,
    "failure": FAILURE,
    "unsuccessful": FAILURE,
    "false": FAILURE,
    "not_executable": NOT_EXECUTABLE,
    "not executable": NOT_EXECUTABLE,
    "unsure": UNSURE,
}


def normalize_human_label(value: Any) -> str | None:
    """Canonical human label from "0"/"1"/"2", 0/1/2, booleans, Successful/Unsuccessful/Unsure, …
    (None for no label; an unknown one raises ValueError)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return SUCCESS if value else FAILURE
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    key = str(value).strip().lower()
    if key == "":
        return None
    if key not in _HUMAN_ALIASES:
        raise ValueError(f"unknown human label {value!r}")
    return _HUMAN_ALIASES[key]


def normalize_agent(name: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "_", name.lower()).strip("_")


@dataclass(frozen=True)
class HumanLabels:
    """Labels by agent column then task id (values from ``HUMAN_LABELS``), and each task's text."""

    path: Path
    labels: dict[str, dict[str, str]]
    tasks: dict[str, str]

    @property
    def agents(self) -> list[str]:
        return list(self.labels)

    def resolve_agent(self, name: str) -> str:
        """The label column for an agent name (loose match); unknown names raise TrajectoryError."""
        wanted = normalize_agent(name)
        for agent in self.labels:
            if normalize_agent(agent) == wanted:
                return agent
        raise TrajectoryError(
            self.path, f"no human labels for agent {name!r}; agents in this file: {self.agents}"
        )

    def label(self, agent: str, task_id: str) -> str | None:
        return self.labels[self.resolve_agent(agent)].get(task_id)


def read_human_labels(path: Path | str) -> HumanLabels:
    """Parse an Online-Mind2Web ``human_label.json``; malformed entries raise TrajectoryError naming the file."""
    path = Path(path)
    data = read_json(path)
    if not isinstance(data, list):
        raise TrajectoryError(path, f"expected a JSON list of task objects, found a {type(data).__name__}")
    labels: dict[str, dict[str, str]] = {}
    tasks: dict[str, str] = {}
    for i, entry in enumerate(data):
        if not isinstance(entry, dict) or not isinstance(entry.get("task_id"), str):
            raise TrajectoryError(path, f"entry {i} must be an object with a string 'task_id'")
        task_id = entry["task_id"]
        if isinstance(entry.get("confirmed_task"), str):
            tasks[task_id] = entry["confirmed_task"]
        for key, value in entry.items():
            if not key.endswith(COLUMN_SUFFIX):
                continue
            code = str(value).strip()
            if code not in LABEL_CODES:
                raise TrajectoryError(
                    path,
                    f"entry {i} (task {task_id}): {key} is {value!r}, expected one of {sorted(LABEL_CODES)}",
                )
            labels.setdefault(key[: -len(COLUMN_SUFFIX)], {})[task_id] = LABEL_CODES[code]
    if not labels:
        raise TrajectoryError(path, f"no '<Agent>{COLUMN_SUFFIX}' columns found")
    return HumanLabels(path=path, labels=labels, tasks=tasks)


def attach_human_labels(
    trajectories: Iterable[Trajectory], labels: HumanLabels | Path | str, agent: str | None = None
) -> list[Trajectory]:
    """Copies of ``trajectories`` with ``human_label`` set from an Online-Mind2Web label file.

    ``agent`` names the label column (default: each trajectory's own ``agent``); a trajectory without
    an agent gets the column's name. Trajectories whose task is not in the file keep their label.
    """
    table = labels if isinstance(labels, HumanLabels) else read_human_labels(labels)
    out: list[Trajectory] = []
    unmatched: list[str] = []
    for trajectory in trajectories:
        name = agent or trajectory.agent
        if name is None:
            raise TrajectoryError(
                table.path,
                f"trajectory {trajectory.task_id} has no agent, so its label column is unknown; "
                f"pass agent= (one of {table.agents})",
            )
        column = table.resolve_agent(name)
        label = table.labels[column].get(trajectory.task_id)
        if label is None:
            unmatched.append(trajectory.task_id)
            out.append(trajectory)
            continue
        out.append(dataclasses.replace(trajectory, human_label=label, agent=trajectory.agent or column))
    if unmatched:
        logger.warning(
            "%s: %d trajectories have no human label (e.g. %s)",
            table.path,
            len(unmatched),
            ", ".join(unmatched[:3]),
        )
    return out
