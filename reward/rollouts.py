"""What a reward model scores: a rollout, read into a :class:`~keyshot.infer.loaders.trajectory.Trajectory`.

A rollout is a trajectory folder or JSONL file (any format ``keyshot judge`` reads), a ``Trajectory``, an
:class:`~keyshot.reward.episode.Episode`, or a dict::

    {"task": "...", "screenshots": [PNG/JPEG bytes | base64 | data URL | path | PIL image, ...],
     "actions": ["click(...)", ...], "final_answer": "...", "task_id": "...", "id": "..."}

Screenshot paths in a dict must lie inside ``allow_root`` (the service's ``--allow-root``; the Python
API's default is the current folder). Bytes are checked by their signature only (nothing is decoded here).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

from PIL import Image

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.loaders import load_trajectory
from keyshot.infer.loaders.common import InputScope, embedded_data, ref_file, screenshot_from_ref
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory, TrajectoryError
from keyshot.infer.protocol.images import sniff_image_type

#: The keys a dict rollout may have.
ROLLOUT_KEYS = ("task", "screenshots", "actions", "thoughts", "final_answer", "task_id", "id", "agent")


class RolloutError(KeyshotError):
    """A rollout that cannot be scored; the message names the rollout and the field. ``status`` is the
    HTTP status the reward service answers with (403: a path outside the allowed root)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def encoded_image(value: Any, where: str) -> bytes:
    """The encoded image (PNG, JPEG, ...) of bytes, a PIL image, or text that embeds one (a data URL or
    base64, read by :func:`~keyshot.infer.loaders.common.screenshot_from_ref`'s rule); never a file."""
    if isinstance(value, Image.Image):
        buffer = io.BytesIO()
        value.save(buffer, format="PNG", compress_level=1)
        return buffer.getvalue()
    if isinstance(value, str):
        value = _embedded(value, where)
    if not isinstance(value, (bytes, bytearray)):
        raise RolloutError(
            f"{where}: a {type(value).__name__} is not a screenshot (bytes, base64, path, PIL)"
        )
    if sniff_image_type(bytes(value))[0] == "application/octet-stream":
        raise RolloutError(f"{where}: not an image (expected PNG, JPEG, WebP or GIF bytes)")
    return bytes(value)


def _embedded(text: str, where: str) -> bytes:
    """The image bytes ``text`` embeds (a data URL or base64: no file is looked up)."""
    try:
        data = embedded_data(text, 0, Path(where))
    except TrajectoryError as exc:
        raise RolloutError(f"{where}: {exc.problem}") from None
    if data is None:
        raise RolloutError(
            f"{where}: {_shown(text)} is not an image: not base64 image data (PNG, JPEG, WebP or GIF)"
        )
    return data


def is_path_like(value: Any) -> bool:
    """A path, or text that names an existing file (relative to the current folder): the rule of
    :func:`~keyshot.infer.loaders.common.ref_file`."""
    if isinstance(value, os.PathLike):
        return True
    return isinstance(value, str) and ref_file(value.strip(), [Path.cwd()]) is not None


def _shown(value: Any) -> str:
    """A value as an error may quote it: at most 60 characters (base64 data is never echoed whole)."""
    text = str(value)
    return text if len(text) <= 60 else f"{text[:40]}... ({len(text):,} characters)"


def _screenshot(value: Any, index: int, where: str, scope: InputScope) -> Screenshot:
    """A dict rollout's screenshot, by :func:`~keyshot.infer.loaders.common.screenshot_from_ref`'s rule:
    an existing file (inside ``scope``: else a 403), else the image the text embeds."""
    what = f"{where}: screenshot {index}"
    if not isinstance(value, (str, os.PathLike)):
        return Screenshot(path=Path(where), index=index, data=encoded_image(value, what))
    ref = os.fspath(value).strip()
    found = ref_file(ref, [Path.cwd()])
    if found is None:
        try:
            data = None if isinstance(value, os.PathLike) else embedded_data(ref, index, Path(where))
        except TrajectoryError as exc:
            raise RolloutError(f"{what}: {exc.problem}") from None
        if data is None:
            raise RolloutError(
                f"{what}: {_shown(value)} is not an image: neither an existing file nor base64 image data "
                "(PNG, JPEG, WebP or GIF)"
            )
        return Screenshot(path=Path(where), index=index, data=encoded_image(data, what))
    if not scope.contains(found):
        roots = ", ".join(map(str, scope.roots))
        raise RolloutError(f"{what}: {value} is outside the allowed root ({roots})", status=403)
    try:
        shot = screenshot_from_ref(ref, index, [Path.cwd()], Path(where), scope=scope)
        with open(shot.path, "rb") as f:
            encoded_image(f.read(16), what)  # the signature only: the file stays on disk
    except (TrajectoryError, OSError) as exc:
        raise RolloutError(f"{what}: {getattr(exc, 'problem', None) or exc}") from None
    return Screenshot(path=shot.path, index=index)


def _strings(record: dict, key: str, where: str) -> list[str]:
    value = record.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RolloutError(f"{where}: field {key!r} must be a list of strings")
    return value


def task_key(task: str) -> str:
    """A short stable id for a task text (rollouts of one task share it, and their key points)."""
    return "task-" + hashlib.sha256(task.encode()).hexdigest()[:12]


def from_dict(record: dict, where: str, allow_root: Path | str | None = None) -> Trajectory:
    """A dict rollout as a Trajectory; raises RolloutError naming the field."""
    unknown = sorted(set(record) - set(ROLLOUT_KEYS))
    if unknown:
        raise RolloutError(f"{where}: unknown field(s) {unknown}; allowed: {list(ROLLOUT_KEYS)}")
    task = record.get("task")
    if not isinstance(task, str) or not task.strip():
        raise RolloutError(f"{where}: field 'task' is missing or empty")
    shots = record.get("screenshots")
    if not isinstance(shots, list) or not shots:
        raise RolloutError(f"{where}: field 'screenshots' must be a non-empty list")
    scope = InputScope.of(allow_root or Path.cwd())
    actions = _strings(record, "actions", where)
    thoughts = _strings(record, "thoughts", where) or None
    if thoughts is not None and len(thoughts) != len(actions):
        raise RolloutError(f"{where}: {len(thoughts)} thoughts for {len(actions)} actions (must be equal)")
    answer = record.get("final_answer")
    if answer is not None and not isinstance(answer, str):
        raise RolloutError(f"{where}: field 'final_answer' must be a string")
    return Trajectory(
        task_id=str(record.get("task_id") or task_key(task)),
        task=task,
        actions=actions,
        thoughts=thoughts,
        screenshots=[_screenshot(s, i, where, scope) for i, s in enumerate(shots)],
        agent=record.get("agent"),
        final_answer=answer,
        run=str(record["id"]) if record.get("id") is not None else None,
    )


def label_rollout(label: Any, position: int = 0) -> Any:
    """An OpenRLHF label (``reward_func``'s ``labels``, the service's ``/get_reward``) as a rollout: a dict
    as it is; text that starts like JSON (``{`` or ``[``) is parsed, never read as a path; other text is a
    trajectory folder's path. Raises RolloutError naming label ``position`` when such text is not JSON."""
    if not isinstance(label, str):
        return label
    text = label.strip()
    if not text.startswith(("{", "[")):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise RolloutError(
            f"label {position}: {_shown(text)} starts like JSON but is not JSON ({exc.msg} at character "
            f"{exc.pos}); a label is a trajectory folder's path or a JSON dict rollout"
        ) from None


def read_rollout(
    value: Any,
    position: int,
    *,
    allow_root: Path | str | None = None,
    scope: InputScope | None = None,
    max_screenshots: int | None = None,
) -> Trajectory:
    """Any rollout as a Trajectory: the one reader of the API, the service and the adapters.

    ``value``: a trajectory folder or JSONL file, a ``Trajectory``, an ``Episode`` or a dict. ``scope``
    (the service's ``--allow-root``) confines paths, folders included; without it a folder is read where
    the caller says and a dict's screenshot paths must lie inside ``allow_root`` (default: the current
    folder). Raises RolloutError naming the rollout (``rollout N``) and the field, with its HTTP status.
    """
    where = f"rollout {position}"
    if isinstance(value, Trajectory):
        trajectory = value
    elif callable(getattr(value, "trajectory", None)):  # an Episode (which imports this module)
        trajectory = value.trajectory()
    elif isinstance(value, dict):
        shots = value.get("screenshots")
        if max_screenshots is not None and isinstance(shots, list) and len(shots) > max_screenshots:
            raise RolloutError(
                f"{where}: {len(shots):,} screenshots, over the limit of {max_screenshots}", status=413
            )
        trajectory = from_dict(value, where, scope.roots[0] if scope is not None else allow_root)
    elif isinstance(value, (str, os.PathLike)):
        path = Path(value)
        if scope is not None and not scope.contains(path):
            raise RolloutError(
                f"{where}: {_shown(value)} is outside the allowed root ({scope.roots[0]})", 403
            )
        try:
            trajectory = load_trajectory(path)
        except TrajectoryError as exc:
            raise RolloutError(f"{where}: {exc}") from None
    else:
        raise RolloutError(
            f"{where}: a {type(value).__name__} is not a rollout "
            "(a trajectory folder, a Trajectory, an Episode or a dict)"
        )
    if max_screenshots is not None and trajectory.num_screenshots > max_screenshots:
        raise RolloutError(
            f"{where}: {trajectory.num_screenshots:,} screenshots, over the limit of {max_screenshots}",
            status=413,
        )
    return trajectory
