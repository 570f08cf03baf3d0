"""keyshot JSONL: one trajectory per line (documented in docs/trajectory-formats.md).

Each line is a JSON object with ``task_id``, ``task``, ``actions`` and ``screenshots`` (paths relative
to the JSONL file's folder, absolute paths, or ``data:image/...;base64,`` URLs) and optional
``thoughts``, ``agent``, ``benchmark``, ``human_label``, ``reward``, ``final_answer``, ``extra``.
Unknown keys are errors (a typo must not silently drop data). Errors name the file and line.
"""

from __future__ import annotations

import base64
import codecs
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from keyshot.infer.common.fileio import atomic_output
from keyshot.infer.loaders.common import (
    InputScope,
    account_for,
    check_counts,
    os_problem,
    parse_json,
    require_regular_file,
    require_str,
    screenshot_from_ref,
    string_list,
)
from keyshot.infer.loaders.trajectory import HUMAN_LABELS, OnError, SkippedEntry, Trajectory, TrajectoryError
from keyshot.infer.protocol.images import sniff_image_type

logger = logging.getLogger(__name__)

FORMAT = "jsonl"
REQUIRED_KEYS = ("task_id", "task", "actions", "screenshots")
OPTIONAL_KEYS = ("thoughts", "agent", "benchmark", "human_label", "reward", "final_answer", "extra", "run")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
LINE_KEY = "jsonl_line"  # set in Trajectory.extra: the line a trajectory was read from


def parse_line(
    record: Any,
    path: Path,
    line: int,
    *,
    agent: str | None,
    benchmark: str | None,
    scope: InputScope | None = None,
) -> Trajectory:
    """One parsed JSONL record → Trajectory (``agent``/``benchmark`` fill in missing values);
    screenshot paths must lie inside ``scope`` (default: the JSONL file's folder)."""
    if not isinstance(record, dict):
        raise TrajectoryError(path, f"expected a JSON object, found a {type(record).__name__}", line)
    missing = [key for key in REQUIRED_KEYS if key not in record]
    if missing:
        raise TrajectoryError(path, f"missing required field(s) {missing}", line)
    unknown = sorted(set(record) - set(REQUIRED_KEYS) - set(OPTIONAL_KEYS))
    if unknown:
        raise TrajectoryError(
            path,
            f"unknown field(s) {unknown}; allowed: {list(REQUIRED_KEYS + OPTIONAL_KEYS)} (put extras in 'extra')",
            line,
        )
    task_id = record["task_id"]
    if isinstance(task_id, int) and not isinstance(task_id, bool):
        task_id = str(task_id)
    if not isinstance(task_id, str) or not task_id.strip():
        raise TrajectoryError(
            path, f"field 'task_id' must be a non-empty string, found {record['task_id']!r}", line
        )
    task = require_str(record, "task", path, line)
    actions = string_list(record["actions"], "actions", path, line)
    thoughts = None
    if record.get("thoughts") is not None:
        thoughts = string_list(record["thoughts"], "thoughts", path, line, none_as_empty=True)
        if len(thoughts) != len(actions):
            raise TrajectoryError(
                path, f"{len(thoughts)} thoughts for {len(actions)} actions (must be equal)", line
            )
    refs = string_list(record["screenshots"], "screenshots", path, line)
    if not refs:
        raise TrajectoryError(path, "trajectory has no screenshots ('screenshots' is empty)", line)
    screenshots = [
        screenshot_from_ref(ref, i, [path.parent], path, line, scope=scope) for i, ref in enumerate(refs)
    ]

    label = record.get("human_label")
    if label is not None and label not in HUMAN_LABELS:
        raise TrajectoryError(
            path, f"human_label must be one of {list(HUMAN_LABELS)} or null, found {label!r}", line
        )
    reward = record.get("reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise TrajectoryError(path, f"reward must be a number or null, found {reward!r}", line)
    strings = {}
    for key in ("agent", "benchmark", "final_answer", "run"):
        value = record.get(key)
        if value is not None and not isinstance(value, str):
            raise TrajectoryError(path, f"field {key!r} must be a string or null, found {value!r}", line)
        strings[key] = value
    extra = record.get("extra") or {}
    if not isinstance(extra, dict):
        raise TrajectoryError(path, f"field 'extra' must be an object, found a {type(extra).__name__}", line)
    check_counts(actions, screenshots, Path(f"{path}:{line}"))
    return Trajectory(
        task_id=task_id,
        task=task,
        actions=actions,
        thoughts=thoughts,
        screenshots=screenshots,
        agent=strings["agent"] or agent,
        benchmark=strings["benchmark"] or benchmark,
        human_label=label,
        reward=float(reward) if reward is not None else None,
        source=path,
        format=FORMAT,
        final_answer=strings["final_answer"],
        extra={**extra, LINE_KEY: line},
        run=strings["run"],
    )


def iter_jsonl(
    path: Path,
    *,
    on_error: OnError = "raise",
    agent: str | None = None,
    benchmark: str | None = None,
    errors: list[TrajectoryError] | None = None,
    scope: InputScope | None = None,
) -> Iterator[Trajectory]:
    """Yield the trajectories of a JSONL file, one per non-blank line. A bad line (not UTF-8, not JSON,
    not a trajectory) is raised or skipped per ``on_error``; a file without a record is a skipped entry."""
    require_regular_file(path, "JSONL file")
    scope = scope or InputScope.of(path.parent)
    seen: dict[str, int] = {}
    records = 0
    for line_no, raw in _lines(path):
        records += 1
        try:
            record = parse_json(_decode(raw, path, line_no), path, line_no)
            trajectory = parse_line(record, path, line_no, agent=agent, benchmark=benchmark, scope=scope)
        except TrajectoryError as exc:
            account_for(exc, on_error, errors)
            continue
        if trajectory.uid in seen:
            logger.warning(
                "%s:%d: duplicate trajectory %s (first on line %d)",
                path,
                line_no,
                trajectory.uid,
                seen[trajectory.uid],
            )
        seen.setdefault(trajectory.uid, line_no)
        yield trajectory
    if not records:
        account_for(
            SkippedEntry(path, "empty JSONL file: no trajectory in it (one JSON object per line expected)"),
            on_error,
            errors,
        )


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes) of each non-blank line, a byte-order mark before the first dropped."""
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise TrajectoryError(path, f"cannot open JSONL file: {os_problem(exc)}") from exc
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            if line_no == 1:
                raw = raw.removeprefix(codecs.BOM_UTF8)
            if raw.strip():
                yield line_no, raw


def _decode(raw: bytes, path: Path, line: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TrajectoryError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})", line) from exc


def _screenshot_ref(shot, out_dir: Path) -> str:
    if shot.data is not None:
        mime, _ = sniff_image_type(shot.data)
        return f"data:{mime};base64," + base64.b64encode(shot.data).decode("ascii")
    return os.path.relpath(shot.path.resolve(), out_dir.resolve())


def trajectory_record(trajectory: Trajectory, out_dir: Path) -> dict[str, Any]:
    """The JSONL record of a trajectory, screenshot paths relative to ``out_dir``."""
    record: dict[str, Any] = {
        "task_id": trajectory.task_id,
        "task": trajectory.task,
        "actions": list(trajectory.actions),
        "screenshots": [_screenshot_ref(shot, out_dir) for shot in trajectory.screenshots],
    }
    optional = {
        "thoughts": trajectory.thoughts,
        "agent": trajectory.agent,
        "benchmark": trajectory.benchmark,
        "human_label": trajectory.human_label,
        "reward": trajectory.reward,
        "final_answer": trajectory.final_answer,
        "run": trajectory.run,
        "extra": {k: v for k, v in trajectory.extra.items() if k != LINE_KEY} or None,
    }
    record.update({key: value for key, value in optional.items() if value is not None})
    return record


def write_jsonl(trajectories: Iterable[Trajectory], path: Path | str) -> int:
    """Write trajectories as keyshot JSONL (atomically); returns the number written."""
    path = Path(path)
    count = 0
    with atomic_output(path, "w", encoding="utf-8") as out:
        for trajectory in trajectories:
            out.write(json.dumps(trajectory_record(trajectory, path.parent), ensure_ascii=False) + "\n")
            count += 1
    return count
