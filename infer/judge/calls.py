"""The three WebJudge calls, one implementation shared by judging (``keyshot.infer.judge.pipeline``), the scorer
back-ends (``keyshot.infer.judge.scorers``) and synthesis (``keyshot.data_synth.labelling_run``).

A :class:`Protocol` is a prompt set (variant and version) and a parse mode: it reads every answer with
the parser of its own variant, so no caller can pair a request with the wrong reading. Each ``ask_*``
builds the request (:mod:`keyshot.infer.protocol.messages`), sends it through a client (``JudgeClient`` or a pool: cache,
retries, and in strict mode a validator that asks again for an unreadable answer) and returns the
completion with its reading. What a caller records (verdicts, label records) stays the caller's.

An answer cut by its token limit (``Completion.cut``) is a failed call, not an answer (docs/architecture.md,
"A verdict needs evidence"): strict mode reads nothing from it (an invalid reading that says so); reference mode reads it as the
reference does, and the caller still sees ``cut``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from keyshot.infer.client.judge_client import Completion
from keyshot.infer.protocol.answer_format import AnswerFormat, answer_format
from keyshot.infer.protocol.messages import (
    ListedShot,
    key_point_steps_messages,
    key_points_messages,
    outcome_messages,
    scorer_messages,
    with_first_met_question,
)
from keyshot.infer.protocol.parsing import (
    ParseError,
    ScoreResult,
    StatusResult,
    StepsResult,
    parse_first_met,
    parse_key_point_steps,
    parse_key_points,
    parse_score,
    parse_status,
)
from keyshot.infer.protocol.prompts import PromptSet, load_step_prompts


def cut_reading(what: str) -> str:
    """The error of a strict reading of a cut answer."""
    return f"no {what} read: the answer was cut by max_tokens"


@dataclass(frozen=True)
class Protocol:
    """A prompt set and a parse mode (``strict`` or ``reference``): how requests are built and read."""

    prompts: PromptSet
    mode: str = "strict"

    def _ignores(self, cut: bool) -> bool:
        """Whether an answer is left unread: a cut one, in strict mode."""
        return cut and self.mode == "strict"

    def read_key_points(self, text: str, *, cut: bool = False) -> str:
        """The key points of an answer; raises ParseError."""
        if self._ignores(cut):
            raise ParseError(cut_reading("key points"))
        return parse_key_points(text, mode=self.mode)

    def read_score(self, text: str, *, cut: bool = False) -> ScoreResult:
        if self._ignores(cut):
            return ScoreResult(None, "", False, cut_reading("score"))
        return parse_score(text, mode=self.mode, variant=self.prompts.variant)

    def read_status(self, text: str, *, cut: bool = False) -> StatusResult:
        if self._ignores(cut):
            return StatusResult(None, False, cut_reading("status"))
        return parse_status(text, mode=self.mode)

    # validators for the client: an error string makes it ask again (strict mode only)
    def key_points_error(self, text: str) -> str | None:
        try:
            self.read_key_points(text)
        except ParseError as exc:
            return str(exc)
        return None

    def score_error(self, text: str) -> str | None:
        result = self.read_score(text)
        return None if result.valid else (result.error or "no score")

    def status_error(self, text: str) -> str | None:
        result = self.read_status(text)
        return None if result.valid else (result.error or "no status")

    def _validator(self, check):
        return check if self.mode == "strict" else None

    def answer_format(self, step: str) -> AnswerFormat:
        """The answer format of ``step`` in this prompt set (what a ``constrained`` endpoint holds to)."""
        return answer_format(self.prompts.variant, step)


async def ask_key_points(
    client: Any, protocol: Protocol, task: str, *, max_tokens: int | None = None
) -> tuple[Completion, str | None, str | None]:
    """Step 1: ``(completion, key points, None)``, or ``(completion, None, why unreadable)``."""
    completion = await client.complete(
        key_points_messages(protocol.prompts, task),
        prompt_version=protocol.prompts.version,
        max_tokens=max_tokens,
        validate=protocol._validator(protocol.key_points_error),
        answer_format=protocol.answer_format("key_points"),
    )
    try:
        return completion, protocol.read_key_points(completion.text, cut=completion.cut), None
    except ParseError as exc:
        return completion, None, str(exc)


async def ask_score(
    client: Any,
    protocol: Protocol,
    task: str,
    key_points: str,
    image_url: str,
    *,
    max_tokens: int | None = None,
    logprobs: int | None = None,
    ask_again: bool = True,
) -> tuple[Completion, ScoreResult]:
    """Step 2, one screenshot: the completion and its score reading. ``ask_again`` asks again for an
    answer without a readable score (``scorer.retry_invalid``; synthesis always does)."""
    completion = await client.complete(
        scorer_messages(protocol.prompts, task, key_points, image_url),
        prompt_version=protocol.prompts.version,
        max_tokens=max_tokens,
        logprobs=logprobs,
        validate=protocol.score_error if ask_again else None,
        answer_format=protocol.answer_format("key_screenshot"),
    )
    return completion, protocol.read_score(completion.text, cut=completion.cut)


def outcome_request(protocol: Protocol, *request: Any) -> list[dict]:
    """The outcome call's messages (what :func:`ask_outcome` sends, and what the step question follows);
    ``request`` is :func:`ask_outcome`'s: task, key points, actions, thoughts, images, image thoughts."""
    return outcome_messages(protocol.prompts, *request, mode=protocol.mode)


def steps_version(protocol: Protocol) -> str:
    """The prompt version of a call that asks when key points were first met: the prompt set's and the
    step question's (:class:`~keyshot.infer.protocol.prompts.StepPrompts`)."""
    return f"{protocol.prompts.version}+{load_step_prompts().version}"


async def ask_outcome(
    client: Any,
    protocol: Protocol,
    task: str,
    key_points: str,
    actions: Sequence[str],
    thoughts: Sequence[str] | None,
    images: Sequence[str] | None,
    image_thoughts: Sequence[str],
    *,
    max_tokens: int | None = None,
    logprobs: int | None = None,
) -> tuple[Completion, StatusResult]:
    """Step 3: the outcome call over the key screenshots (data URLs) and their descriptions
    (``images=None``: the descriptions alone, a deviation; see :func:`keyshot.infer.protocol.messages.outcome_messages`)."""
    completion = await client.complete(
        outcome_request(protocol, task, key_points, actions, thoughts, images, image_thoughts),
        prompt_version=protocol.prompts.version,
        max_tokens=max_tokens,
        logprobs=logprobs,
        validate=protocol._validator(protocol.status_error),
        answer_format=protocol.answer_format("outcome"),
    )
    return completion, protocol.read_status(completion.text, cut=completion.cut)


async def ask_outcome_first_met(
    client: Any,
    protocol: Protocol,
    messages: list[dict],
    shots: Sequence[ListedShot],
    *,
    max_tokens: int | None = None,
    logprobs: int | None = None,
) -> tuple[Completion, StatusResult, StepsResult]:
    """A per-key-point outcome call (``messages``: :func:`outcome_request`'s) that also asks at which of
    the trajectory's screenshots (``shots``) its key point was first met, at no call more (step rewards in
    ``key_point`` mode): the completion, its status and its step."""
    indices = frozenset(index for index, _, _ in shots)

    def validate(text: str) -> str | None:
        status = protocol.read_status(text)
        return protocol.status_error(text) or parse_first_met(text, status.success, indices).error

    completion = await client.complete(
        with_first_met_question(load_step_prompts(), messages, shots),
        prompt_version=steps_version(protocol),
        max_tokens=max_tokens,
        logprobs=logprobs,
        validate=protocol._validator(validate),
    )
    status = protocol.read_status(completion.text, cut=completion.cut)
    if protocol._ignores(completion.cut):
        return completion, status, StepsResult(None, False, cut_reading("first step"))
    return completion, status, parse_first_met(completion.text, status.success, indices)


async def ask_key_point_steps(
    client: Any,
    protocol: Protocol,
    outcome: list[dict],
    outcome_answer: str,
    key_points: Sequence[str],
    shots: Sequence[ListedShot],
    *,
    max_tokens: int | None = None,
) -> tuple[Completion, StepsResult]:
    """The step question, a follow-up of the outcome conversation (``outcome``: its messages as sent,
    ``outcome_answer``: the judge's answer): the screenshot at which each key point was first met."""
    indices = frozenset(index for index, _, _ in shots)

    def validate(text: str) -> str | None:
        return parse_key_point_steps(text, len(key_points), indices).error

    completion = await client.complete(
        key_point_steps_messages(load_step_prompts(), outcome, outcome_answer, key_points, shots),
        prompt_version=steps_version(protocol),
        max_tokens=max_tokens,
        validate=protocol._validator(validate),
    )
    if protocol._ignores(completion.cut):
        return completion, StepsResult(None, False, cut_reading("key point steps"))
    return completion, parse_key_point_steps(completion.text, len(key_points), indices)
