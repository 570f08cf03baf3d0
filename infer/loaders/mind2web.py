"""Online-Mind2Web trajectory folders (schema v1 and ``online-mind2web-v2``).

v1: ``<task_id>/result.json`` (``task``, ``action_history: [str]``, optional ``thoughts``,
``final_result_response``, ``task_id``) and ``<task_id>/trajectory/*`` screenshots ordered by the
first integer in the file name (ties by name). Files without an image extension are skipped with a
warning; an image whose name has no digits is an error (its position cannot be known).

v2: ``"schema_version": "online-mind2web-v2"``; ``action_history`` is a list of
``{step, screenshot, url, action, thought}`` objects ordered by ``step``. Every step's screenshot is
judged; the last step's action is the agent's answer and is not an action (``agent_final_answer``
is kept as ``final_answer``). Screenshot references resolve against the task folder, then
``trajectory/``; data URLs and bare base64 are read inline.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from keyshot.infer.loaders.common import (
    InputScope,
    align_thoughts,
    check_counts,
    first_int,
    is_image_name,
    optional_str,
    read_json,
    require_str,
    screenshot_file,
    screenshot_from_ref,
    string_list,
)
from keyshot.infer.loaders.formats import FolderFormat, register_folder_format
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory, TrajectoryError

logger = logging.getLogger(__name__)

V1 = "online-mind2web-v1"
V2 = "online-mind2web-v2"
ANY_VERSION = "online-mind2web"  # either schema
SCHEMA_V2 = "online-mind2web-v2"
BENCHMARK = "online_mind2web"
RESULT_FILE = "result.json"
SCREENSHOT_DIR = "trajectory"
ANSWER_PREFIX = "TASK_COMPLETE"


def schema_of(result_path: Path, data: object) -> str:
    """``V1`` or ``V2`` for a parsed result.json; unknown schema versions raise TrajectoryError."""
    if not isinstance(data, dict):
        raise TrajectoryError(result_path, f"expected a JSON object, found a {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        return V1
    if version == SCHEMA_V2:
        return V2
    raise TrajectoryError(
        result_path, f"unknown schema_version {version!r} (known: {SCHEMA_V2!r}, or no schema_version for v1)"
    )


def load_online_mind2web(
    task_dir: Path,
    *,
    version: str | None = None,
    agent: str | None = None,
    benchmark: str | None = None,
    scope: InputScope | None = None,
) -> Trajectory:
    """Load one Online-Mind2Web task folder; ``version`` (``V1``/``V2``) insists on a schema.
    Screenshots must lie inside ``scope`` (default: the task folder)."""
    scope = scope or InputScope.of(task_dir)
    result_path = task_dir / RESULT_FILE
    if not (result_path.exists() or result_path.is_symlink()):
        raise TrajectoryError(
            task_dir,
            f"no {RESULT_FILE}: an Online-Mind2Web task folder holds {RESULT_FILE} and {SCREENSHOT_DIR}/",
        )
    data = read_json(result_path)
    found = schema_of(result_path, data)
    if version is not None and version != found:
        raise TrajectoryError(result_path, f"format {version} was requested but the file is {found}")
    loader = _load_v2 if found == V2 else _load_v1
    return loader(task_dir, result_path, data, agent=agent, benchmark=benchmark or BENCHMARK, scope=scope)


def _task_id(data: dict, task_dir: Path, result_path: Path) -> str:
    value = data.get("task_id")
    if value is None:
        return task_dir.name
    if isinstance(value, (str, int)) and str(value).strip():
        return str(value).strip()
    raise TrajectoryError(result_path, f"field 'task_id' must be a non-empty string, found {value!r}")


def ordered_screenshot_files(folder: Path) -> list[Path]:
    """Image files of a v1 ``trajectory/`` folder ordered by the first integer in their names."""
    if not folder.is_dir():
        raise TrajectoryError(folder, f"no {SCREENSHOT_DIR}/ folder with screenshots")
    numbered: list[tuple[int, str, Path]] = []
    with os.scandir(folder) as entries:
        for entry in entries:
            # an image-named entry that is not a regular file (a folder, FIFO, dangling link) is kept
            # here so that screenshot_file refuses it by name instead of it vanishing from the trajectory
            if not is_image_name(entry.name):
                logger.warning("%s: skipping %r, not an image file", folder, entry.name)
                continue
            number = first_int(entry.name)
            if number is None:
                raise TrajectoryError(
                    Path(entry.path),
                    "screenshot name has no number, so its position in the trajectory is unknown "
                    "(name screenshots by step, e.g. 0.png, 1_full_screenshot.png)",
                )
            numbered.append((number, entry.name, Path(entry.path)))
    if not numbered:
        raise TrajectoryError(folder, "trajectory has no screenshots (no image files in this folder)")
    numbered.sort()
    return [path for _, _, path in numbered]


def _load_v1(
    task_dir: Path, result_path: Path, data: dict, *, agent: str | None, benchmark: str, scope: InputScope
) -> Trajectory:
    task = require_str(data, "task", result_path)
    if "action_history" not in data:
        raise TrajectoryError(result_path, "field 'action_history' is missing")
    actions = string_list(data["action_history"], "action_history", result_path)
    raw_thoughts = data.get("thoughts")
    thoughts = None
    if raw_thoughts is not None:
        thoughts = string_list(raw_thoughts, "thoughts", result_path, none_as_empty=True)
    files = ordered_screenshot_files(task_dir / SCREENSHOT_DIR)
    screenshots = [screenshot_file(path, i, result_path, scope=scope) for i, path in enumerate(files)]
    check_counts(actions, screenshots, result_path)
    return Trajectory(
        task_id=_task_id(data, task_dir, result_path),
        task=task,
        actions=actions,
        thoughts=align_thoughts(thoughts, actions, result_path),
        screenshots=screenshots,
        agent=agent,
        benchmark=benchmark,
        source=task_dir,
        format=V1,
        final_answer=optional_str(data, "final_result_response", result_path),
    )


def _load_v2(
    task_dir: Path, result_path: Path, data: dict, *, agent: str | None, benchmark: str, scope: InputScope
) -> Trajectory:
    task = require_str(data, "task", result_path)
    steps = data.get("action_history")
    if not isinstance(steps, list) or not steps:
        raise TrajectoryError(result_path, "field 'action_history' must be a non-empty list of step objects")
    for i, step in enumerate(steps):
        if not isinstance(step, dict):
            raise TrajectoryError(
                result_path, f"action_history[{i}] must be an object, found a {type(step).__name__}"
            )
    numbers = [step.get("step", i) for i, step in enumerate(steps)]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise TrajectoryError(result_path, "every action_history[].step must be an integer")
    if len(set(numbers)) != len(numbers):
        raise TrajectoryError(result_path, "action_history has duplicate step numbers")
    steps = [step for _, step in sorted(zip(numbers, steps, strict=True), key=lambda pair: pair[0])]

    bases = [task_dir, task_dir / SCREENSHOT_DIR]
    screenshots: list[Screenshot] = []
    actions: list[str] = []
    thoughts: list[str] = []
    urls: list[str | None] = []
    for i, step in enumerate(steps):
        ref = step.get("screenshot")
        if isinstance(ref, str) and ref.strip():
            screenshots.append(screenshot_from_ref(ref, len(screenshots), bases, result_path, scope=scope))
        elif ref is not None:
            raise TrajectoryError(
                result_path, f"action_history[{i}].screenshot must be a string, found {ref!r}"
            )
        else:
            logger.warning("%s: step %d has no screenshot", result_path, step.get("step", i))
        action = step.get("action")
        thought = step.get("thought")
        if action is not None and not isinstance(action, str):
            raise TrajectoryError(result_path, f"action_history[{i}].action must be a string")
        if thought is not None and not isinstance(thought, str):
            raise TrajectoryError(result_path, f"action_history[{i}].thought must be a string or null")
        actions.append(action or "")
        thoughts.append(thought or "")
        url = step.get("url")
        urls.append(url if isinstance(url, str) else None)
    if not screenshots:
        raise TrajectoryError(result_path, "trajectory has no screenshots (no step names one)")

    last_action = actions.pop()
    thoughts.pop()
    if not last_action.lstrip().startswith(ANSWER_PREFIX):
        logger.info(
            "%s: last step %r is taken as the agent's answer and not judged as an action",
            result_path,
            last_action,
        )
    final_answer = optional_str(data, "agent_final_answer", result_path)
    if final_answer is None and "ANSWER:" in last_action:
        final_answer = last_action.split("ANSWER:", 1)[1].strip()
    check_counts(actions, screenshots, result_path)
    extra: dict = {"urls": urls}
    if "reference_length" in data:
        extra["reference_length"] = data["reference_length"]
    return Trajectory(
        task_id=_task_id(data, task_dir, result_path),
        task=task,
        actions=actions,
        thoughts=thoughts if any(thoughts) else None,
        screenshots=screenshots,
        agent=agent,
        benchmark=benchmark,
        source=task_dir,
        format=V2,
        final_answer=final_answer,
        extra=extra,
    )


def _detect(task_dir: Path) -> str | None:
    """``V1`` or ``V2`` for a folder with a result.json (which must parse), else None."""
    result_path = task_dir / RESULT_FILE
    if result_path.exists() or result_path.is_symlink():  # read_json refuses a FIFO, folder or dangling link
        return schema_of(result_path, read_json(result_path))
    return None


def _problem(task_dir: Path) -> str | None:
    if (task_dir / SCREENSHOT_DIR).is_dir():
        return f"no {RESULT_FILE}: an Online-Mind2Web task folder holds {RESULT_FILE} and {SCREENSHOT_DIR}/"
    return None


register_folder_format(
    FolderFormat(
        names=(V1, V2),
        any_name=ANY_VERSION,
        label="Online-Mind2Web",
        expects=RESULT_FILE,
        holds=lambda folder: (folder / RESULT_FILE).is_file() or (folder / SCREENSHOT_DIR).is_dir(),
        detect=_detect,
        problem=_problem,
        load=lambda folder, name=None, **where: load_online_mind2web(folder, version=name, **where),
    )
)
