"""WebJudge results: one :class:`Verdict` per trajectory, one JSONL line each.

Writing is crash-safe: :class:`VerdictWriter` appends each verdict as ONE complete line with a single
``os.write`` on an ``O_APPEND`` descriptor and ``fsync``\\ s it, so a killed run leaves at most one torn
last line. :func:`read_verdicts` skips such a torn line with a warning and the writer cuts it off before
appending, so a resumed run continues a clean file.

Resume (:class:`ResumeIndex`): a trajectory whose ``(task_id, agent)`` already has a *finished* verdict
(``error is None``) is skipped. A verdict with ``error`` set (its judge calls failed for good) is
judged again on resume; its earlier calls come back from the call cache at no cost, and the newer
line supersedes the older one (:func:`latest_verdicts`).

Reference outputs (:func:`read_reference_records`) are the files the reference implementation
writes, converted to verdicts so that a run can resume from them and metrics can read them:

* Online-Mind2Web ``src/run.py`` output (``<mode>_<model>_score_threshold_<δ>_auto_eval_results.json``,
  one JSON object per line): the trajectory's ``result.json`` fields (``task``, ``action_history``,
  ...) plus ``task_id``, ``key_points``, ``image_judge_record`` (``[{"Response", "Score"}]``, one per
  screenshot in order), ``input_text`` / ``system_msg`` (the outcome prompt), ``evaluation_details``
  (``{"response": <outcome text>, "predicted_label": 0|1}``) and ``predicted_label``.
* AgentRewardBench WebJudge records (one JSON object per file, ``<benchmark>/<agent>/<task_id>.json``):
  ``goal``, ``benchmark``, ``agent``, ``judge_model_name``, ``key_points``, ``image_judge_record``,
  ``response`` (the outcome call's full chat-completion object, ``usage`` included) and
  ``trajectory_info.summary_info.cum_reward``. The task id is the file name.

Read from both: task id, task, agent, benchmark, key points, every screenshot's raw answer and score
(``thought`` re-derived with the reference parser), the kept screenshots (score ≥ δ, first 50, as the
reference keeps them), the outcome text and its verdict (``predicted_label`` when present, else the
reference status parser on the outcome text), the outcome call's token usage (ARB only) and the
rule-based reward (ARB only). Screenshot paths and judge-call counts are not in these files.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infer.fileio import cut_torn_tail
from infer.loaders.judge_records import outcome_text, recorded_score
from infer.messages import MAX_KEPT_IMAGES
from infer.parsing import parse_score, parse_status

logger = logging.getLogger(__name__)

ROLES = ("judge", "scorer")
FORMAT_KEYSHOT = "keyshot"
VERDICTS_FILE = "verdicts.jsonl"  # in a run folder
FORMAT_REFERENCE = "online_mind2web_run"
FORMAT_ARB = "agentrewardbench_webjudge"


class VerdictFileError(ValueError):
    """A verdict or reference-output file that cannot be read; the message names the file and line."""


@dataclass
class ScreenshotRecord:
    """What the scorer said about one screenshot (``index`` is the screenshot's trajectory index)."""

    index: int
    path: str = ""
    score: int | None = None
    thought: str = ""
    valid: bool = False
    error: str | None = None
    expected_score: float | None = None
    raw: str | None = None
    cached: bool = False
    visual_tokens: int | None = None
    call_failed: bool = False


@dataclass
class OutcomeCall:
    """One outcome call: the whole verdict (``cot``) or one key point (``key_point``)."""

    text: str | None = None
    success: bool | None = None
    valid: bool = False
    error: str | None = None
    key_point: str | None = None
    cached: bool = False


@dataclass
class RoleUsage:
    """Calls, tokens and cost of one role (``judge`` or ``scorer``) for one trajectory.

    Tokens count every call, cached ones included; ``cost_usd`` is what was paid in this run
    (a cache hit costs nothing).
    """

    calls: int = 0
    cached: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    def add_call(self, prompt_tokens: int, completion_tokens: int, cost_usd: float, cached: bool) -> None:
        self.calls += 1
        self.cached += int(cached)
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.cost_usd += cost_usd

    def merge(self, other: RoleUsage) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


#: The reference's delta: screenshots scored at least this go to the outcome call.
KEEP_THRESHOLD = 3


def select_kept(
    records: list[ScreenshotRecord],
    threshold: float,
    max_kept: int = MAX_KEPT_IMAGES,
    *,
    mode: str = "strict",
    threshold_on: str = "score",
) -> list[int]:
    """Indices of the key screenshots, in trajectory order: the one keep rule of judging, synthesis and
    imports. A screenshot is key when its score (or expected score) is at least ``threshold``; of more
    than ``max_kept``, ``reference`` mode keeps the first ones (the reference implementation), ``strict``
    the best-scored ones."""

    def value(r: ScreenshotRecord) -> float | None:
        return r.expected_score if threshold_on == "expected_score" else r.score

    eligible = [r for r in records if value(r) is not None and value(r) >= threshold]
    if mode == "reference" or len(eligible) <= max_kept:
        return [r.index for r in eligible[:max_kept]]
    order = {r.index: pos for pos, r in enumerate(records)}
    best = sorted(eligible, key=lambda r: (-value(r), order[r.index]))[:max_kept]
    return sorted((r.index for r in best), key=order.__getitem__)


def _usage_factory() -> dict[str, RoleUsage]:
    return {role: RoleUsage() for role in ROLES}


@dataclass
class Verdict:
    """The WebJudge result for one trajectory.

    ``success`` is None when no verdict could be reached. A verdict is *incomplete* when a call it
    needs failed for good (``error`` says why, ``incomplete`` names the calls): it holds no verdict
    and is judged again on resume, every answered call coming from the cache. ``status_valid=False``
    with ``error=None`` means the judge answered but its verdict could not be read (``errors`` says
    how). ``partial`` lists the failed calls a run with ``allow_partial`` went on without (the
    reference's behaviour: such a screenshot counts as score 0).
    """

    task_id: str
    task: str
    agent: str | None = None
    benchmark: str | None = None
    source: str | None = None
    success: bool | None = None
    status_valid: bool = False
    key_points: str | None = None
    outcome_text: str | None = None
    outcome_calls: list[OutcomeCall] = field(default_factory=list)
    screenshots: list[ScreenshotRecord] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    usage: dict[str, RoleUsage] = field(default_factory=_usage_factory)
    error: str | None = None
    errors: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)
    human_label: str | None = None
    reward: float | None = None
    timing: dict[str, float] = field(default_factory=dict)
    record_format: str = FORMAT_KEYSHOT
    run: str | None = None
    incomplete: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str, str]:
        return verdict_key(self.task_id, self.agent, self.run)

    @property
    def finished(self) -> bool:
        """True when every call went through (the verdict itself may still be unreadable)."""
        return self.error is None and not self.incomplete

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Verdict:
        known = _field_names(cls)
        kwargs = {k: v for k, v in data.items() if k in known}
        if "task_id" not in kwargs or "task" not in kwargs:
            raise ValueError("a verdict needs 'task_id' and 'task'")
        kwargs["screenshots"] = [_build(ScreenshotRecord, s) for s in data.get("screenshots") or []]
        kwargs["outcome_calls"] = [_build(OutcomeCall, c) for c in data.get("outcome_calls") or []]
        usage = _usage_factory()
        for role, counts in (data.get("usage") or {}).items():
            usage[role] = _build(RoleUsage, counts)
        kwargs["usage"] = usage
        return cls(**kwargs)


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


def _build(cls: type, data: dict[str, Any]) -> Any:
    known = _field_names(cls)
    if known.issuperset(data):  # the usual case, fast: a line this version wrote
        return cls(**data)
    return cls(**{k: v for k, v in data.items() if k in known})


def verdict_key(task_id: str, agent: str | None, run: str | None = None) -> tuple[str, str, str]:
    """Identity of a judged trajectory: the same task run by two agents, or twice by one agent (two
    AgentLab runs), is two trajectories."""
    return (str(task_id), agent or "", run or "")


# ---------------------------------------------------------------------------- writing
class VerdictWriter:
    """Appends verdicts to a JSONL file, one durable line per call of :meth:`append`.

    Safe against ``kill -9`` at any moment: a line is written whole by one ``os.write`` on an
    ``O_APPEND`` descriptor, then ``fsync``\\ ed. Opening the writer cuts off a torn last line left
    by an earlier crash (with a warning), so new lines never glue onto a fragment.
    """

    def __init__(self, path: str | os.PathLike, *, fsync: bool = True):
        self.path = Path(path)
        self.fsync = fsync
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        cut_torn_tail(self.path, "that trajectory is judged again, its calls come from the cache")

    def append(self, verdict: Verdict) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path}: writer is closed")
        line = (verdict.to_json() + "\n").encode("utf-8")
        written = os.write(self._fd, line)
        if written != len(line):
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes); disk full?")
        if self.fsync:
            os.fsync(self._fd)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> VerdictWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------- reading
def _iter_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) per line; a torn last line is skipped with a warning."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise VerdictFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n") and bool(data)
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if torn_tail and number == len(lines):
                logger.warning("%s:%d: ignoring an incomplete last line (an interrupted run)", path, number)
                continue
            if isinstance(exc, UnicodeDecodeError):
                raise VerdictFileError(
                    f"{path}:{number}: not UTF-8 text (byte {exc.start} of the line); is it a keyshot verdict file?"
                ) from None
            raise VerdictFileError(f"{path}:{number}: not a JSON line ({exc})") from None
        if not isinstance(obj, dict):
            raise VerdictFileError(f"{path}:{number}: expected a JSON object per line")
        yield number, obj


def read_verdicts(path: str | os.PathLike) -> list[Verdict]:
    """All verdict lines of a keyshot ``verdicts.jsonl``, in file order (a torn last line is skipped)."""
    p = Path(path)
    if not p.exists():
        return []
    out = []
    for number, obj in _iter_json_lines(p):
        try:
            out.append(Verdict.from_dict(obj))
        except (TypeError, ValueError) as exc:
            raise VerdictFileError(f"{p}:{number}: not a keyshot verdict ({exc})") from None
    return out


def load_verdicts(path: str | os.PathLike) -> tuple[list[Verdict], str]:
    """The latest verdict of each trajectory in a run folder, a ``verdicts.jsonl`` or released judge
    records (the reference implementation's outputs), and which kind it was (``keyshot`` or
    ``released records``). The one reader of verdicts for metrics and reports."""
    p = Path(path)
    if p.is_dir() and (p / VERDICTS_FILE).is_file():
        p = p / VERDICTS_FILE
    not_keyshot = None
    if p.is_file() and p.suffix == ".jsonl":
        try:
            verdicts = latest_verdicts(read_verdicts(p))
        except VerdictFileError as exc:
            not_keyshot = exc  # perhaps the reference implementation's output: read below
        else:
            if not verdicts:
                raise VerdictFileError(f"{p}: no verdicts in this file")
            return verdicts, "keyshot"
    try:
        verdicts = latest_verdicts(read_reference_records(p))
    except VerdictFileError:
        if not_keyshot is not None:  # neither: say what is wrong with it as keyshot's own file
            raise not_keyshot from None
        raise
    if not verdicts:
        raise VerdictFileError(
            f"{p}: no verdicts (expected a keyshot run folder, a verdicts.jsonl or judge records)"
        )
    return verdicts, "released records"


def latest_verdicts(verdicts: Iterable[Verdict]) -> list[Verdict]:
    """One verdict per trajectory: the last line wins (a re-judged failure supersedes the failure)."""
    latest: dict[tuple[str, str], Verdict] = {}
    for v in verdicts:
        latest[v.key] = v  # an update keeps the key's first position
    return list(latest.values())


class ResumeIndex:
    """Which trajectories already have a finished verdict.

    A verdict without an agent (e.g. converted from an Online-Mind2Web reference output, which does
    not record the agent) matches any agent's trajectory with the same task id.
    """

    def __init__(self, verdicts: Iterable[Verdict] = ()):
        self._keys: set[tuple[str, str]] = set()
        self._agentless: set[str] = set()
        for v in verdicts:
            self.add(v)

    def add(self, verdict: Verdict) -> None:
        if not verdict.finished:
            return
        if verdict.agent:
            self._keys.add(verdict.key)
        else:
            self._agentless.add(verdict.task_id)

    def done(self, task_id: str, agent: str | None, run: str | None = None) -> bool:
        return verdict_key(task_id, agent, run) in self._keys or str(task_id) in self._agentless

    def __len__(self) -> int:
        return len(self._keys) + len(self._agentless)


# ---------------------------------------------------------------------------- reference outputs
def read_reference_records(
    path: str | os.PathLike, *, threshold: int = 3, max_kept: int = MAX_KEPT_IMAGES
) -> list[Verdict]:
    """Convert the reference implementation's outputs (see the module docstring) to verdicts.

    ``path`` is an Online-Mind2Web ``run.py`` output (JSON lines), one AgentRewardBench record
    (a JSON object) or a folder searched recursively for ``*.json`` / ``*.jsonl`` files of either kind.
    ``threshold`` is the δ the run used (the kept set is recomputed from the recorded scores).
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl"))
        if not files:
            raise VerdictFileError(f"{p}: no .json/.jsonl files in this folder")
    elif p.is_file():
        files = [p]
    else:
        raise VerdictFileError(f"{p}: no such file or folder")
    out: list[Verdict] = []
    for f in files:
        out.extend(_reference_file(f, threshold, max_kept))
    return out


def _reference_file(path: Path, threshold: int, max_kept: int) -> Iterator[Verdict]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerdictFileError(f"{path}: cannot read ({exc})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        records: Iterable[tuple[int | None, dict]] = [(None, whole)]
    else:
        records = _iter_json_lines(path)
    for number, record in records:
        where = f"{path}:{number}" if number is not None else str(path)
        try:
            yield _convert_reference(record, path, threshold, max_kept)
        except (KeyError, TypeError, ValueError) as exc:
            raise VerdictFileError(f"{where}: not a WebJudge reference record ({exc})") from None


def _convert_reference(record: dict, path: Path, threshold: int, max_kept: int) -> Verdict:
    if "image_judge_record" not in record or "key_points" not in record:
        raise KeyError("needs 'image_judge_record' and 'key_points'")
    is_arb = "goal" in record and "task_id" not in record
    task_id = str(record["task_id"]) if "task_id" in record else path.stem
    task = record.get("task") or record.get("confirmed_task") or record.get("goal")
    if not isinstance(task, str):
        raise KeyError("no task text ('task', 'confirmed_task' or 'goal')")

    shots = []
    for i, item in enumerate(record["image_judge_record"]):
        try:
            text, score, error = recorded_score(item)
        except ValueError as exc:
            raise ValueError(f"image_judge_record[{i}]: {exc}") from None
        shots.append(
            ScreenshotRecord(
                index=i,
                score=score,
                thought=parse_score(text, mode="reference").thought,  # as the reference reads it
                valid=score is not None,
                error=error,
                raw=text,
            )
        )
    kept = select_kept(shots, threshold, max_kept, mode="reference")

    outcome = outcome_text(record)
    label = record.get("predicted_label")
    if label is None and isinstance(record.get("evaluation_details"), dict):
        label = record["evaluation_details"].get("predicted_label")
    if label is not None:
        success: bool | None = bool(int(label))
        status_valid = True
    elif outcome is not None:
        status = parse_status(outcome, mode="reference")
        success, status_valid = status.success, status.valid
    else:
        success, status_valid = None, False

    usage = _usage_factory()
    response = record.get("response")
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        u = response["usage"]
        usage["judge"].add_call(
            int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0), 0.0, False
        )

    info = record.get("trajectory_info") or {}
    reward = (info.get("summary_info") or {}).get("cum_reward") if isinstance(info, dict) else None
    return Verdict(
        task_id=task_id,
        task=task,
        agent=record.get("agent"),
        benchmark=record.get("benchmark") or (None if is_arb else "online_mind2web"),
        source=str(path),
        success=success,
        status_valid=status_valid,
        key_points=record["key_points"],
        outcome_text=outcome,
        outcome_calls=[OutcomeCall(text=outcome, success=success, valid=status_valid)] if outcome else [],
        screenshots=shots,
        kept=kept,
        usage=usage,
        config={
            "source_format": FORMAT_ARB if is_arb else FORMAT_REFERENCE,
            "judge_model": record.get("judge_model_name")
            or (response.get("model") if isinstance(response, dict) else None),
            "threshold": threshold,
            "parse_mode": "reference",
        },
        reward=float(reward) if isinstance(reward, int | float) else None,
        record_format=FORMAT_ARB if is_arb else FORMAT_REFERENCE,
    )
