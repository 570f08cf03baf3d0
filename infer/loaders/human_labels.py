"""Human labels: the one reader of label files (:func:`read_label_file`) and their join to trajectories.

A label file is one of :data:`ACCEPTED_SHAPES`:

* Online-Mind2Web's ``human_label.json``: a list of ``{"task_id", "confirmed_task",
  "<Agent>_human_label": "0" | "1" | "2"}`` objects, one column per agent (``Operator``, ``Agent-E``,
  ``Browser_Use``, ``Claude_Computer_Use_3.5``, ``Claude_Computer_Use_3.7``, ``SeeAct``). ``"0"`` is
  failure, ``"1"`` success, ``"2"`` not executable.
* a JSON object ``{task_id: label}`` or ``{task_id: {"label": label, "agent": name}}``;
* a CSV file with the header ``task_id,label[,agent]``.

Labels without an agent go to the any-agent column (:data:`ANY_AGENT`): they hold for every agent.
Agent names match loosely: case, spaces, hyphens and underscores are ignored ("browser use" →
``Browser_Use``).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import logging
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyshot.infer.loaders.common import read_json, require_regular_file
from keyshot.infer.loaders.trajectory import (
    FAILURE,
    HUMAN_LABELS,
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


#: The column of label files that name no agent: its labels hold for every agent.
ANY_AGENT = ""

#: What a label file may look like (said when a file has another shape).
ACCEPTED_SHAPES = (
    'accepted label files: a JSON object {task_id: 0|1} or {task_id: {"label": 0|1, "agent": NAME}}; '
    "a .csv file with the header task_id,label[,agent]; Online-Mind2Web's human_label.json "
    '(a list of {"task_id": ..., "<Agent>_human_label": "0"|"1"|"2"} objects); '
    "labels are 0/1/2, true/false, success/failure, not_executable or unsure"
)


@dataclass(frozen=True, eq=False)
class LabelTable(Mapping[tuple[str, str], str]):
    """The labels of one label file by agent column (:data:`ANY_AGENT` for labels without an agent)
    then task id, each task's text where the file has it, and the file's shape.

    As a mapping it is keyed ``(task_id, normalize_agent(agent))``: the agent's own column first, then
    the any-agent column, so a verdict finds its label whatever the file's shape.
    """

    path: Path
    labels: dict[str, dict[str, str]]
    tasks: dict[str, str] = field(default_factory=dict)
    shape: str = "Online-Mind2Web human_label.json"

    @property
    def agents(self) -> list[str]:
        """The named agent columns (the any-agent column left out)."""
        return [agent for agent in self.labels if agent != ANY_AGENT]

    def resolve_agent(self, name: str) -> str:
        """The label column of an agent name (loose match), else the any-agent column; an agent the
        file has no labels for raises TrajectoryError."""
        wanted = normalize_agent(name)
        for agent in self.agents:
            if normalize_agent(agent) == wanted:
                return agent
        if ANY_AGENT in self.labels:
            return ANY_AGENT
        raise TrajectoryError(
            self.path, f"no human labels for agent {name!r}; agents in this file: {self.agents}"
        )

    def label(self, agent: str, task_id: str) -> str | None:
        return self.for_agent(agent).get(task_id)

    def for_agent(self, agent: str | None) -> dict[str, str]:
        """``{task_id: label}`` of one agent (loose match): its column over the any-agent column. A
        file with per-agent columns needs the agent's name."""
        if agent is None:
            if self.agents:
                raise TrajectoryError(
                    self.path,
                    f"this label file has one column per agent ({', '.join(self.agents)}): "
                    "name the agent whose labels to use",
                )
            return dict(self.labels[ANY_AGENT])
        column = self.resolve_agent(agent)
        return {**self.labels.get(ANY_AGENT, {}), **self.labels[column]}

    def _keyed(self) -> dict[tuple[str, str], str]:
        return {
            (task_id, normalize_agent(agent)): label
            for agent, column in self.labels.items()
            for task_id, label in column.items()
        }

    def __getitem__(self, key: tuple[str, str]) -> str:
        task_id, agent = key
        for column in (normalize_agent(agent), ANY_AGENT):
            for name in self.labels:
                if normalize_agent(name) == column and task_id in self.labels[name]:
                    return self.labels[name][task_id]
        raise KeyError(key)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(self._keyed())

    def __len__(self) -> int:
        return len(self._keyed())


#: The name of :class:`LabelTable` from when it held Online-Mind2Web files only.
HumanLabels = LabelTable


def read_label_file(path: Path | str) -> LabelTable:
    """The one reader of human-label files, every shape of :data:`ACCEPTED_SHAPES`. Another shape, or
    a value that is no label, raises TrajectoryError naming the file (and the task or line)."""
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return _read_label_csv(path)
    data = read_json(path)
    if isinstance(data, list):
        return read_human_labels(path, data)
    if isinstance(data, dict):
        return _read_label_map(path, data)
    kind = {str: "string", bool: "true/false", int: "number", float: "number"}.get(type(data), "null")
    raise TrajectoryError(path, f"a JSON {kind} is not a label file; {ACCEPTED_SHAPES}")


def labels_for_agent(path: str | os.PathLike, agent: str | None) -> dict[str, str]:
    """``{task_id: label}`` of ``agent`` (matched loosely) from a label file of any accepted shape
    (:meth:`LabelTable.for_agent`): what ``keyshot synth`` joins to one source's trajectories."""
    return read_label_file(Path(path)).for_agent(agent)


def _label(path: Path, task_id: str, value: Any, line: int | None = None) -> str:
    try:
        label = normalize_human_label(value)
    except ValueError:
        label = None
    if label is None:
        raise TrajectoryError(
            path, f"task {task_id!r} has label {value!r}, not one of {list(HUMAN_LABELS)} or 0/1/2", line
        )
    return label


def _read_label_map(path: Path, data: dict) -> LabelTable:
    """``{task_id: label}`` or ``{task_id: {"label": label, "agent": name}}``."""
    labels: dict[str, dict[str, str]] = {}
    for task_id, value in data.items():
        agent = ANY_AGENT
        if isinstance(value, dict):
            if "label" not in value:
                raise TrajectoryError(
                    path, f'task {task_id!r} is an object without "label"; {ACCEPTED_SHAPES}'
                )
            agent = str(value.get("agent") or ANY_AGENT)
            value = value["label"]
        elif isinstance(value, list):
            raise TrajectoryError(path, f"task {task_id!r} has a list, not a label; {ACCEPTED_SHAPES}")
        labels.setdefault(agent, {})[str(task_id)] = _label(path, str(task_id), value)
    if not labels:
        raise TrajectoryError(path, f"an empty JSON object holds no labels; {ACCEPTED_SHAPES}")
    return LabelTable(path=path, labels=labels, shape="{task_id: label} JSON")


def _read_label_csv(path: Path) -> LabelTable:
    """A CSV with the header ``task_id,label[,agent]`` (an empty agent cell: any agent)."""
    require_regular_file(path, "label file")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TrajectoryError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except OSError as exc:
        raise TrajectoryError(path, f"cannot read file: {exc.strerror or exc}") from exc
    reader = csv.DictReader(io.StringIO(text))
    header = [name.strip() for name in reader.fieldnames or []]
    if not {"task_id", "label"} <= set(header) or not set(header) <= {"task_id", "label", "agent"}:
        raise TrajectoryError(path, f"the header is {','.join(header) or '(empty)'}; {ACCEPTED_SHAPES}", 1)
    reader.fieldnames = header
    labels: dict[str, dict[str, str]] = {}
    for row in reader:
        task_id = (row["task_id"] or "").strip()
        if not task_id:
            raise TrajectoryError(path, "a row without task_id", reader.line_num)
        agent = (row.get("agent") or "").strip() or ANY_AGENT
        label = _label(path, task_id, (row["label"] or "").strip(), reader.line_num)
        column = labels.setdefault(agent, {})
        if column.setdefault(task_id, label) != label:
            raise TrajectoryError(
                path,
                f"task {task_id!r} ({agent or 'any agent'}) is labelled twice: {column[task_id]}, then {label}",
                reader.line_num,
            )
    if not labels:
        raise TrajectoryError(path, "no rows under the header task_id,label[,agent]")
    return LabelTable(path=path, labels=labels, shape="task_id,label CSV")


def read_human_labels(path: Path | str, data: Any = None) -> LabelTable:
    """Parse an Online-Mind2Web ``human_label.json`` (``data``: its JSON, when already parsed); malformed
    entries raise TrajectoryError naming the file. Other shapes: :func:`read_label_file`."""
    path = Path(path)
    if data is None:
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
    return LabelTable(path=path, labels=labels, tasks=tasks)


def attach_human_labels(
    trajectories: Iterable[Trajectory], labels: LabelTable | Path | str, agent: str | None = None
) -> list[Trajectory]:
    """Copies of ``trajectories`` with ``human_label`` set from a label file (any accepted shape).

    ``agent`` names the label column (default: each trajectory's own ``agent``); a trajectory without
    an agent gets the column's name. Trajectories whose task is not in the file keep their label.
    """
    table = labels if isinstance(labels, LabelTable) else read_label_file(labels)
    out: list[Trajectory] = []
    unmatched: list[str] = []
    for trajectory in trajectories:
        name = agent or trajectory.agent
        if name is None and table.agents:
            raise TrajectoryError(
                table.path,
                f"trajectory {trajectory.task_id} has no agent, so its label column is unknown; "
                f"pass agent= (one of {table.agents})",
            )
        column = table.resolve_agent(name) if name is not None else ANY_AGENT
        label = table.for_agent(name).get(trajectory.task_id)
        if label is None:
            unmatched.append(trajectory.task_id)
            out.append(trajectory)
            continue
        out.append(
            dataclasses.replace(trajectory, human_label=label, agent=trajectory.agent or column or None)
        )
    if unmatched:
        logger.warning(
            "%s: %d trajectories have no human label (e.g. %s)",
            table.path,
            len(unmatched),
            ", ".join(unmatched[:3]),
        )
    return out
