"""Parsers for the three WebJudge answers.

Two modes:

* ``reference`` reproduces the reference implementation choice for choice (docs/protocol.md): the
  score is the first ``[1-5]`` in the text between the first and the second ``Score``, a parse
  failure is score 0; the verdict is success iff ``"success"`` occurs in the lower-cased text after
  the first ``status:``.
* ``strict`` (default) reads the labelled answer (the last ``Score:`` / ``Status:`` label), so a
  "Credit Score 750" in the reasoning or an "unsuccessful" verdict is read correctly, and returns an
  explicit invalid result (``valid=False`` with an ``error``) instead of a silent 0 or failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from keyshot.infer.protocol.prompts import prompt_source

Mode = Literal["strict", "reference"]
MODES = ("strict", "reference")


class ParseError(ValueError):
    """An answer that cannot be read in strict mode."""


@dataclass(frozen=True)
class ScoreResult:
    score: int | None  # 1..5; None when invalid in strict mode, 0 when invalid in reference mode
    thought: str
    valid: bool
    error: str | None = None


@dataclass(frozen=True)
class StatusResult:
    success: bool | None  # None when invalid in strict mode; False when invalid in reference mode
    valid: bool
    error: str | None = None


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"unknown parse mode {mode!r}; choose 'strict' or 'reference'")


# ---------------------------------------------------------------- key points
_KP_LABEL = re.compile(r"\*{0,2}\s*key\s*points\s*\*{0,2}\s*:\s*\*{0,2}", re.IGNORECASE)


def parse_key_points(text: str, mode: Mode = "strict") -> str:
    """Extract the key-point list from the first step's answer.

    Reference: replace blank lines, take the text after ``**Key Points**:`` (else after the last
    ``Key Points:``, else everything) and strip each line's leading spaces. Strict does the same
    but also accepts ``**Key Points:**`` and case variants, and raises ParseError on an empty answer.
    """
    _check_mode(mode)
    text = text or ""
    text = text.replace("\n\n", "\n")
    if mode == "reference":
        parts = text.split("**Key Points**:")
        body = parts[1] if len(parts) > 1 else text.split("Key Points:")[-1]
        return "\n".join(line.lstrip() for line in body.splitlines())
    if "**Key Points**:" in text:
        body = text.split("**Key Points**:")[1]
    else:
        labels = list(_KP_LABEL.finditer(text))
        body = text[labels[-1].end() :] if labels else text
    body = "\n".join(line.lstrip() for line in body.splitlines())
    if not body.strip():
        raise ParseError("key-point answer is empty")
    return body


# ---------------------------------------------------------------- key-screenshot score
# The labels each prompt variant asks for ("1. **Reasoning**: ... 2. **Score**: N" for
# online_mind2web, "### Reasoning**: ... ### Score**: N" for general) and that its reference parser
# splits on are the prompt set's own (keyshot.infer.protocol.prompts.PromptSource). Checked against all
# 3,679 released scorer answers on AgentRewardBench (dev).
# Strict: a score label is a heading ("### Score"), bold ("**Score**") or "Score:" with a colon,
# followed by one digit 1-5 that is not part of a longer number.
_SCORE_LABEL = re.compile(
    r"(?:(?:^|\n)[ \t]*#+[ \t]*\**Score\b\**[\s:*]*"
    r"|\*\*Score\*\*[\s:*]*"
    r"|\bScore\b[ \t]*\**[ \t]*(?:\([^)\n]*\))?[ \t]*[:\uff1a][\s*]*)"
    r"\[?[ \t]*([1-5])(?![\d.]*\d)",
    re.IGNORECASE,
)
_DIGIT = re.compile(r"[1-5]")
_REASONING_LABEL = re.compile(r"(?:#+[ \t]*)?\**reasoning\**[ \t]*\**[ \t]*:?\**", re.IGNORECASE)


def carries_labels(text: str, variant: str) -> bool:
    """Whether a scorer answer carries ``variant``'s own reasoning or score label (``general``:
    ``### Reasoning:``, ``### Score``): which prompt set a released answer was asked with."""
    source = prompt_source(variant)
    return source.reasoning_label in text or source.score_label in text


def _reference_digit(text: str, variant: str) -> tuple[int | None, str | None]:
    """The offset of the first 1-5 between the first and the second score label, or the error."""
    score_label = prompt_source(variant).score_label
    at = text.find(score_label)
    if at < 0:
        return None, f"no {score_label!r} in answer"
    start = at + len(score_label)
    end = text.find(score_label, start)
    digit = _DIGIT.search(text, start, end if end >= 0 else len(text))
    if digit is None:
        return None, f"no digit 1-5 after {score_label!r}"
    return digit.start(), None


def _strict_label(text: str) -> re.Match[str] | None:
    """The last score label with its digit (group 1), or None."""
    labels = list(_SCORE_LABEL.finditer(text))
    return labels[-1] if labels else None


def _reference_score(text: str, variant: str) -> ScoreResult:
    source = prompt_source(variant)
    thought = text.split(source.reasoning_label)[-1].strip().lstrip("\n")
    if source.thought_is_first_paragraph:
        thought = thought.split("\n\n")[0]
    else:
        thought = thought.split(source.score_label)[0]
    thought = thought.replace("\n", " ")
    offset, error = _reference_digit(text, variant)
    if offset is None:
        return ScoreResult(0, thought, False, error)
    return ScoreResult(int(text[offset]), thought, True)


def _check_variant(variant: str) -> None:
    prompt_source(variant)  # PromptSetError (a ValueError) naming the known ones


def parse_score(text: str, mode: Mode = "strict", variant: str = "online_mind2web") -> ScoreResult:
    """Read the 1-5 relevance score and the description ("thought") of one screenshot.

    ``variant`` is the prompt set the answer was produced with: it fixes the labels the reference
    parser splits on. Strict mode reads either style.
    """
    _check_mode(mode)
    _check_variant(variant)
    text = text or ""
    if mode == "reference":
        return _reference_score(text, variant)
    last = _strict_label(text)
    if last is None:
        err = "answer has no score label ('Score: N')" if "score" in text.lower() else "answer has no score"
        return ScoreResult(None, _strict_thought(text, len(text), variant), False, err)
    return ScoreResult(int(last.group(1)), _strict_thought(text, last.start(), variant), True)


def score_digit_offset(text: str, mode: Mode = "strict", variant: str = "online_mind2web") -> int | None:
    """Character offset in ``text`` of the digit :func:`parse_score` reads as the score, or None when it
    reads none (where the score's log-probabilities are found)."""
    _check_mode(mode)
    _check_variant(variant)
    text = text or ""
    if mode == "reference":
        return _reference_digit(text, variant)[0]
    last = _strict_label(text)
    return last.start(1) if last else None


def _strict_thought(text: str, score_at: int, variant: str) -> str:
    """The reasoning before the score label: its first paragraph where the prompt set says so
    (online_mind2web, as the reference and as WebJudge-7B was trained), else all of it (general)."""
    head = text[:score_at]
    labels = list(_REASONING_LABEL.finditer(head))
    if labels:
        head = head[labels[-1].end() :]
    head = head.strip()
    if prompt_source(variant).thought_is_first_paragraph:
        head = head.split("\n\n")[0]
    head = re.sub(r"(?:\n|^)\s*(?:\d+\.|-)?\s*\**\s*$", "", head)  # a "2." that introduced the label
    return " ".join(head.split())


# ---------------------------------------------------------------- outcome status
_STATUS_LABEL = re.compile(r"status\s*\**\s*:", re.IGNORECASE)
#: What may stand between the status label and its word besides white space (quotes, markup): the parser
#: skips it, and the log-probability reader strips it from the token at the status word.
STATUS_MARKS = "\"'`*[(<"
_STATUS_PREFIX = re.compile(rf"[\s{re.escape(STATUS_MARKS)}]*")
#: The status words, each with what it says (True: success), in the order a status value is matched
#: against them: failure words first ("unsuccessful" holds "success", "incomplete" holds "complete", "not
#: successful" begins a phrase). The one table of the parser and of the log-probability reader
#: (:mod:`keyshot.infer.protocol.logprobs`), so a word the parser reads is a word p_success is read for.
STATUS_WORDS: dict[str, bool] = {
    "failure": False,
    "unsuccessful": False,
    "failed": False,
    "fail": False,
    "incomplete": False,
    "not successful": False,
    "not success": False,
    "success": True,
    "successful": True,
    "succeeded": True,
    "complete": True,
    "completed": True,
}


def parse_status(text: str, mode: Mode = "strict") -> StatusResult:
    """Read the outcome verdict ``Status: "success"`` / ``"failure"``."""
    _check_mode(mode)
    text = text or ""
    if mode == "reference":
        parts = text.lower().split("status:")
        if len(parts) < 2:
            return StatusResult(False, False, "no 'status:' in answer")
        return StatusResult("success" in parts[1], True)

    labels = list(_STATUS_LABEL.finditer(text))
    if not labels:
        return StatusResult(None, False, "answer has no 'Status:' label")
    value = text[labels[-1].end() :].strip().lower()
    value = value[_STATUS_PREFIX.match(value).end() :]
    for word, success in STATUS_WORDS.items():
        if re.match(rf"{re.escape(word)}\b", value):
            return StatusResult(success, True)
    shown = value.splitlines()[0][:40] if value else ""
    return StatusResult(None, False, f"status value {shown!r} is neither success nor failure")


def status_word_offset(text: str, mode: Mode = "strict") -> int | None:
    """Character offset in ``text`` of the status word :func:`parse_status` reads (after the label and
    any quotes or markup), or None when it reads none (where the status's log-probabilities are found)."""
    _check_mode(mode)
    text = text or ""
    if not parse_status(text, mode).valid:
        return None
    if mode == "reference":
        start = text.lower().index("status:") + len("status:")
    else:
        start = list(_STATUS_LABEL.finditer(text))[-1].end()
    return start + _STATUS_PREFIX.match(text, start).end() - start


_NUMBERED = re.compile(r"^\s*(?:\d+[.)]|[-*•])\s*(.+?)\s*$")


def split_key_points(key_points: str) -> list[str]:
    """The individual key points of a key-point answer (its numbered or bulleted lines)."""
    lines = [line for line in key_points.splitlines() if line.strip()]
    items = [m.group(1) for m in map(_NUMBERED.match, lines) if m]
    return items or [line.strip() for line in lines]


# ---------------------------------------------------------------- when each key point was first met
@dataclass(frozen=True)
class StepsResult:
    """When each key point was first met: one screenshot index (or None: not met) per key point; ``steps``
    is None when the answer cannot be read, ``error`` says why (never a silent "not met")."""

    steps: list[int | None] | None
    valid: bool
    error: str | None = None


_KP_STEP_LINE = re.compile(
    r"^[ \t>*_#-]*key[ \t]*point[ \t]*(\d+)[ \t*_]*[:\uff1a][ \t*_]*(.*?)[ \t*_.]*$", re.IGNORECASE | re.M
)
_FIRST_MET_LINE = re.compile(
    r"^[ \t>*_#-]*first[ \t]*met[ \t*_]*[:\uff1a][ \t*_]*(.*?)[ \t*_.]*$", re.I | re.M
)
_STEP_VALUE = re.compile(r"(?:screenshot[ \t]*)?#?[ \t]*(\d+)", re.IGNORECASE)
_NOT_MET = ("none", "not met", "never", "null")


def _step_value(value: str, indices: frozenset[int]) -> tuple[int | None, str | None]:
    """A screenshot index, None for "none", or the error."""
    value = value.strip().strip("\"'`").strip()
    if value.lower() in _NOT_MET:
        return None, None
    found = _STEP_VALUE.fullmatch(value)
    if found is None:
        return None, f"{value[:40]!r} is neither 'Screenshot N' nor 'none'"
    index = int(found.group(1))
    if index not in indices:
        return None, f"screenshot {index} is not one of the trajectory's ({min(indices)}..{max(indices)})"
    return index, None


def parse_key_point_steps(text: str, n_key_points: int, indices: set[int] | frozenset[int]) -> StepsResult:
    """Read the follow-up's answer: ``Key Point k: Screenshot N`` or ``Key Point k: none``, one line for
    every key point 1..``n_key_points``, N one of ``indices`` (the trajectory's screenshots). A missing,
    repeated or unknown key point, or a value that is neither, makes the answer unreadable."""
    indices = frozenset(indices)
    if not indices:
        return StepsResult(None, False, "the trajectory has no screenshots to name")
    found: dict[int, int | None] = {}
    for line in _KP_STEP_LINE.finditer(text or ""):
        k = int(line.group(1))
        if not 1 <= k <= n_key_points:
            return StepsResult(None, False, f"key point {k} named, but there are {n_key_points}")
        if k in found:
            return StepsResult(None, False, f"key point {k} answered twice")
        step, error = _step_value(line.group(2), indices)
        if error is not None:
            return StepsResult(None, False, f"key point {k}: {error}")
        found[k] = step
    missing = [k for k in range(1, n_key_points + 1) if k not in found]
    if missing:
        return StepsResult(None, False, f"no line for key point(s) {missing} ('Key Point k: Screenshot N')")
    return StepsResult([found[k] for k in range(1, n_key_points + 1)], True)


def parse_first_met(text: str, success: bool | None, indices: set[int] | frozenset[int]) -> StepsResult:
    """Read a per-key-point outcome answer's ``First Met: Screenshot N`` (or ``none``) line, against the
    status it gave (``success``): a met key point names its screenshot, an unmet one names none; a
    status that could not be read gives no step either."""
    if success is None:
        return StepsResult(None, False, "no status read, so no first step")
    lines = list(_FIRST_MET_LINE.finditer(text or ""))
    if len(lines) != 1:
        return StepsResult(None, False, f"{len(lines)} 'First Met:' lines (one is asked for)")
    if not indices:
        return StepsResult(None, False, "the trajectory has no screenshots to name")
    step, error = _step_value(lines[0].group(1), frozenset(indices))
    if error is not None:
        return StepsResult(None, False, f"First Met: {error}")
    if success and step is None:
        return StepsResult(None, False, "status success, but First Met: none")
    if not success and step is not None:
        return StepsResult(None, False, f"status failure, but First Met: screenshot {step}")
    return StepsResult([step], True)
