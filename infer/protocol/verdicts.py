"""WebJudge results: one :class:`Verdict` per trajectory, one JSONL line each.

Writing is crash-safe: :class:`VerdictWriter` appends each verdict as ONE complete line with a single
``os.write`` on an ``O_APPEND`` descriptor and ``fsync``\\ s it, so a killed run leaves at most one torn
last line. :func:`read_verdicts` skips such a torn line with a warning and the writer cuts it off before
appending, so a resumed run continues a clean file.

Resume (:class:`ResumeIndex`): a trajectory whose ``(task_id, agent)`` already has a *finished* verdict
(``error is None``) is skipped. A verdict with ``error`` set (its judge calls failed for good) is
judged again on resume; its earlier calls come back from the call cache at no cost, and the newer
line supersedes the older one (:func:`latest_verdicts`).

Verdicts of released judge records (the reference's outputs) are read by :mod:`keyshot.infer.runs.verdict_sources`,
which also holds :func:`~keyshot.infer.runs.verdict_sources.load_verdicts`, the one reader of any of them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import cut_torn_tail, make_folder, output_problem
from keyshot.infer.protocol.messages import MAX_KEPT_IMAGES

logger = logging.getLogger(__name__)

ROLES = ("judge", "scorer")
FORMAT_KEYSHOT = "keyshot"
VERDICTS_FILE = "verdicts.jsonl"  # in a run folder


class VerdictFileError(KeyshotError, ValueError):
    """A verdict or reference-output file that cannot be read; the message names the file and line."""


#: How a screenshot whose image could not be read is recorded: ``ScreenshotRecord.error`` starts so.
UNREADABLE_IMAGE = "screenshot unreadable: "


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
    cut: bool = False  # the answer was cut by max_tokens
    #: the index of an identical earlier screenshot of the trajectory whose answer this one copies (scored once)
    same_as: int | None = None

    @property
    def image_problem(self) -> str | None:
        """Why the screenshot's image could not be read (its file and the reason), or None."""
        if self.error and self.error.startswith(UNREADABLE_IMAGE):
            return self.error[len(UNREADABLE_IMAGE) :]
        return None


@dataclass
class OutcomeCall:
    """One outcome call: the whole verdict (``cot``) or one key point (``key_point``)."""

    text: str | None = None
    success: bool | None = None
    valid: bool = False
    error: str | None = None
    key_point: str | None = None
    cached: bool = False
    cut: bool = False  # the answer was cut by max_tokens
    #: P(success) read from the status token's log-probabilities (``pipeline.outcome_logprobs``), else None
    p_success: float | None = None
    #: how many status words among the tokens returned at the status word p_success rests on
    p_success_alternatives: int | None = None
    #: set when p_success rests on one side only (no failure, or no success, word among those tokens)
    p_success_note: str | None = None
    #: with ``pipeline.step_rewards`` in ``key_point`` mode: the screenshot at which this key point was
    #: first met (None: not met, or not read: ``step_error`` says why)
    step: int | None = None
    step_error: str | None = None


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


def missing_evidence(records: list[ScreenshotRecord]) -> str | None:
    """Why none of a trajectory's screenshot scores could be read, or None when one was (or there are
    no screenshots: the trajectory is judged on its actions). No verdict rests on such a trajectory in
    strict mode (docs/architecture.md, "A verdict needs evidence")."""
    if not records or any(r.valid for r in records):
        return None
    failed = sum(r.call_failed for r in records)
    images = sum(not r.call_failed and r.visual_tokens is None for r in records)
    answers = len(records) - failed - images
    reason = (
        f"no readable scores: {answers} of {answers} answers had no score "
        f"({sum(r.cut for r in records)} cut by max_tokens)"
    )
    if images:
        reason += f"; {images} screenshot(s) could not be read"
    if failed:
        reason += f"; {failed} call(s) failed"
    return reason


def step_progress(records: list[ScreenshotRecord], key_point_steps: list[int | None]) -> list[float]:
    """The share of key points met by each screenshot (trajectory order), from the screenshot each was
    first met at (None: never): non-decreasing, its last entry the share met in the whole trajectory."""
    position = {r.index: pos for pos, r in enumerate(records)}
    firsts = [position[step] for step in key_point_steps if step is not None]
    total = len(key_point_steps)
    return [sum(first <= pos for first in firsts) / total for pos in range(len(records))]


def empty_usage() -> dict[str, RoleUsage]:
    return {role: RoleUsage() for role in ROLES}


@dataclass
class Verdict:
    """The WebJudge result for one trajectory.

    ``success`` is None when no verdict could be reached. A verdict is *incomplete* when a call it
    needs failed for good (``error`` says why, ``incomplete`` names the calls): it holds no verdict
    and is judged again on resume, every answered call coming from the cache. ``status_valid=False``
    with ``error=None`` means the judge answered but its verdict could not be read (``errors`` says
    how). ``partial`` lists the failed calls a run with ``allow_partial`` went on without (the
    reference's behaviour: such a screenshot counts as score 0). ``cut`` names the calls whose answers
    were cut by max_tokens. ``no_evidence`` says why no screenshot score could be read
    (:func:`missing_evidence`): in strict mode such a verdict is incomplete (``error`` says the same;
    the next run judges it again), in reference mode it is judged anyway, as the reference does.

    With ``pipeline.step_rewards`` (off by default), ``key_point_steps`` holds, for each key point, the
    screenshot index at which the judge says it was first met (None: not met), and ``step_progress`` for each
    screenshot the share of key points met so far (:func:`step_progress`); both stay None when the judge's
    answer could not be read, ``step_error`` saying why.
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
    usage: dict[str, RoleUsage] = field(default_factory=empty_usage)
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
    cut: list[str] = field(default_factory=list)
    no_evidence: str | None = None
    key_point_steps: list[int | None] | None = None
    step_progress: list[float] | None = None
    step_error: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return verdict_key(self.task_id, self.agent, self.run)

    @property
    def finished(self) -> bool:
        """True when every call went through (the verdict itself may still be unreadable)."""
        return self.error is None and not self.incomplete

    @property
    def p_success(self) -> float | None:
        """P(success) read at the outcome calls' status words: the one call's, or the product over the key
        points' calls (taken as independent); None when a call gave none (no log-probabilities asked for
        or returned) or there was no outcome call."""
        calls = self.outcome_calls
        if not calls or any(c.p_success is None for c in calls):
            return None
        return math.prod(c.p_success for c in calls)

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
        usage = empty_usage()
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
        make_folder(self.path.parent)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise output_problem(self.path, exc) from exc
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
def iter_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
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
    for number, obj in iter_json_lines(p):
        try:
            out.append(Verdict.from_dict(obj))
        except (TypeError, ValueError) as exc:
            raise VerdictFileError(f"{p}:{number}: not a keyshot verdict ({exc})") from None
    return out


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
