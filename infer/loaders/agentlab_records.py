"""AgentLab's own step records, read without running them: for runs that have no ``experiment_analysis.md``.

BrowserGym saves every step as ``step_N.pkl.gz`` (a pickled ``StepInfo``: ``obs`` with the ``goal`` or
``goal_object``, the ``action`` taken, ``agent_info`` with the agent's ``think``) and the run's arguments
as ``exp_args.pkl`` (``agent_args.chat_model_args.model_name``). AgentLab's loop moves the goal object
(OpenAI-style content parts: text and images) to ``goal_object.pkl.gz``, once per run; the task is its
text parts, and ``obs["goal"]`` only where there is no goal object (for a goal with an image BrowserGym
writes a warning sentence there, not the goal: such a run without its goal object is an error). Unpickling an untrusted file normally
runs whatever it names, so these are read by :class:`RecordUnpickler`: every class or function a record
names becomes an inert :class:`Opaque` placeholder that keeps the arguments and state it is given and
calls nothing; only plain containers and numbers are built as themselves. Decompressed records are
capped at :data:`MAX_RECORD_BYTES`.
"""

from __future__ import annotations

import builtins
import collections
import gzip
import io
import pickle
import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.loaders.common import require_regular_file
from keyshot.infer.loaders.trajectory import TrajectoryError

STEP_RECORD = re.compile(r"^step_(?P<n>\d+)\.pkl(?:\.gz)?$")
EXP_ARGS_FILE = "exp_args.pkl"
GOAL_OBJECT_FILE = "goal_object.pkl.gz"
#: how BrowserGym's obs["goal"] starts where the goal has an image (the goal object holds the goal)
NO_TEXT_GOAL = "WARNING: This goal cannot be converted to a text-only goal format"
MAX_RECORD_BYTES = 256 * 1024 * 1024  # a step record without its screenshot is a few MiB

_BUILT_AS_THEMSELVES = {
    ("builtins", name): getattr(builtins, name)
    for name in ("dict", "list", "tuple", "set", "frozenset", "str", "bytes", "bytearray", "int", "float")
    + ("complex", "bool")
} | {("collections", "OrderedDict"): collections.OrderedDict}


@dataclass(frozen=True)
class AnalysisSteps:
    """What a run says about itself: its goal, its model and each step's thought and action."""

    goal: str
    model_name: str | None
    actions: list[str]
    thoughts: list[str]
    num_steps: int
    #: images in the goal (its goal object's image parts), which the judge is not shown
    goal_images: int = 0


class Opaque:
    """Stands in for any class or function a record names: keeps what it is given, runs nothing."""

    where = "?"

    def __new__(cls, *args, **kwargs):
        obj = object.__new__(cls)
        obj.args, obj.state, obj.items, obj.elements = args, None, {}, []
        return obj

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        self.state = state

    def __setitem__(self, key, value):  # a dict subclass's items
        self.items[key] = value

    def append(self, value):  # a list subclass's elements
        self.elements.append(value)

    def extend(self, values):
        self.elements.extend(values)

    def fields(self) -> dict:
        """The object's attributes (a dataclass's fields), from whichever form its state took."""
        state = self.state
        if isinstance(state, tuple) and len(state) == 2:  # (__dict__, __slots__ values)
            merged = {}
            for part in state:
                if isinstance(part, dict):
                    merged.update(part)
            state = merged
        out = dict(self.items)
        if isinstance(state, dict):
            out.update(state)
        return out

    def __repr__(self) -> str:
        return f"<opaque {self.where}>"


def _rebuild(cls, base, state):
    """``copyreg._reconstructor`` (protocol 0/1 objects) without calling ``base``."""
    obj = Opaque.__new__(cls if isinstance(cls, type) and issubclass(cls, Opaque) else Opaque)
    obj.state = state
    return obj


class RecordUnpickler(pickle.Unpickler):
    """Unpickles plain data as itself and everything else as :class:`Opaque` (see the module docstring)."""

    _stubs: dict[tuple[str, str], type] = {}

    def find_class(self, module: str, name: str):
        safe = _BUILT_AS_THEMSELVES.get((module, name))
        if safe is not None:
            return safe
        if (module, name) == ("copyreg", "_reconstructor"):
            return _rebuild
        key = (module, name)
        if key not in self._stubs:
            self._stubs[key] = type(name, (Opaque,), {"where": f"{module}.{name}", "__module__": __name__})
        return self._stubs[key]

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("persistent ids are not read")


def load_record(path: Path) -> object:
    """One record (gzip or plain pickle), under the size cap; TrajectoryError naming the file if unreadable."""
    try:
        require_regular_file(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as fh:
            data = fh.read(MAX_RECORD_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise TrajectoryError(path, f"cannot read the step record: {exc}") from None
    if len(data) > MAX_RECORD_BYTES:
        raise TrajectoryError(path, f"step record larger than {MAX_RECORD_BYTES >> 20} MiB once decompressed")
    try:
        return RecordUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # any malformed pickle: the file is named, nothing else is lost
        raise TrajectoryError(path, f"not a readable step record ({type(exc).__name__}: {exc})") from None


def _steps(numbers: list[int], shown: int = 5) -> str:
    names = ", ".join(f"step_{n}" for n in numbers[:shown])
    return names + (", ..." if len(numbers) > shown else "")


def _get(obj: object, name: str):
    if isinstance(obj, dict):
        return obj.get(name)
    if isinstance(obj, Opaque):
        return obj.fields().get(name)
    return None


def _text(value: object) -> str | None:
    return value.strip() if isinstance(value, str) and value.strip() else None


@dataclass(frozen=True)
class _Goal:
    text: str | None
    images: int = 0


def _goal_object(obs: object, run_dir: Path) -> tuple[object, Path | None]:
    """The goal object of a step: in its ``obs``, or (AgentLab's loop: ``obs["goal_object"]`` is None)
    in the run's ``goal_object.pkl.gz``; with the file it came from."""
    parts = _get(obs, "goal_object")
    if isinstance(parts, (list, tuple)):
        return parts, None
    path = run_dir / GOAL_OBJECT_FILE
    if path.exists() or path.is_symlink():
        return load_record(path), path
    return None, None


def _goal(obs: object, run_dir: Path) -> _Goal:
    """The task: the goal object's text parts, else ``obs["goal"]``."""
    parts, path = _goal_object(obs, run_dir)
    if isinstance(parts, (list, tuple)):  # [{"type": "text", "text": ...}, {"type": "image_url", ...}]
        texts = [_text(_get(p, "text")) for p in parts if _get(p, "type") in (None, "text")]
        images = sum(_get(p, "type") not in (None, "text") for p in parts)
        if any(texts):
            return _Goal("\n".join(t for t in texts if t), images)
        if images:
            raise TrajectoryError(
                path or run_dir,
                f"the goal is {images} image(s) and no text: WebJudge judges a task given in words",
            )
    goal = _text(_get(obs, "goal"))
    if goal and NO_TEXT_GOAL in goal:
        raise TrajectoryError(
            run_dir / GOAL_OBJECT_FILE,
            f"missing: the steps' obs.goal is BrowserGym's stand-in for a goal with images ({NO_TEXT_GOAL}...), "
            "the goal itself is in this file: copy the run folder whole",
        )
    return _Goal(goal)


def _model_name(run_dir: Path) -> str | None:
    path = run_dir / EXP_ARGS_FILE
    if not path.is_file():
        return None
    chat = _get(_get(load_record(path), "agent_args"), "chat_model_args")
    return _text(_get(chat, "model_name"))


def read_step_records(run_dir: Path, screenshot_steps: Iterable[int] = ()) -> AnalysisSteps:
    """Goal, model and per-step thought and action from a run's ``step_N.pkl.gz`` records: one for
    every step from 0 to the last, and for every ``screenshot_steps`` (BrowserGym saves a step's record
    with its screenshot); a missing one is an error naming it, as its action would be lost."""
    files = sorted(
        (int(m.group("n")), p) for p in run_dir.iterdir() if (m := STEP_RECORD.match(p.name)) and p.is_file()
    )
    if not files:
        raise TrajectoryError(run_dir, "no step_N.pkl.gz records")
    found = {n for n, _ in files}
    missing = sorted(set(range(files[-1][0] + 1)).union(screenshot_steps) - found)
    if missing:
        more = f" (and {len(missing) - 1} more: {_steps(missing[1:])})" if len(missing) > 1 else ""
        raise TrajectoryError(
            run_dir / f"step_{missing[0]}.pkl.gz",
            f"step record missing{more}: the run's step {missing[0]} (its action and thought) is read "
            "from it; copy the run folder whole",
        )
    goal = _Goal(None)
    actions: list[str] = []
    thoughts: list[str] = []
    for position, (_, path) in enumerate(files):
        record = load_record(path)
        goal = goal if goal.text else _goal(_get(record, "obs"), run_dir)
        action = _text(_get(record, "action"))
        if action is None:
            if position != len(files) - 1:
                raise TrajectoryError(path, "a step before the last has no action")
            continue  # the last step observes the final page; it takes no action
        actions.append(action)
        thoughts.append(_text(_get(_get(record, "agent_info"), "think")) or "")
    if not goal.text:
        raise TrajectoryError(
            files[0][1], f"no task goal in the step records (obs.goal, obs.goal_object or {GOAL_OBJECT_FILE})"
        )
    return AnalysisSteps(
        goal=goal.text,
        model_name=_model_name(run_dir),
        actions=actions,
        thoughts=thoughts,
        num_steps=len(files),
        goal_images=goal.images,
    )
