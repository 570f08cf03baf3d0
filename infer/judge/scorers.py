"""Key-screenshot scorers: step 2 of WebJudge, one 1-5 relevance score per screenshot.

Two back-ends behind one interface (:class:`KeyScreenshotScorer`):

* :class:`OpenAIScorer` calls any OpenAI-compatible endpoint through :class:`keyshot.infer.client.judge_client.JudgeClient`:
  a keyshot checkpoint served by vLLM (``keyshot serve``), or a large model used as the scorer (the
  reference configuration, where the judge scores every screenshot itself).
* :class:`keyshot.infer.judge.local_scorer.TransformersScorer` runs a checkpoint in-process with transformers
  (batched greedy generation; same messages, same answers for the same checkpoint in fp32).

Both read the answer with :func:`keyshot.infer.protocol.parsing.parse_score`. When log-probabilities are asked for,
``expected_score`` is Σ p(d)·d over the digits 1-5 among the alternatives at the position of the
score digit (:func:`keyshot.infer.protocol.parsing.score_digit_offset`: where the parser read it;
probabilities renormalised over those digits): a graded score that can be thresholded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.client.judge_client import JudgeCallError, JudgeClient
from keyshot.infer.client.pool import EndpointPool
from keyshot.infer.judge.answer_limits import JUDGE_LIMIT, SCORER_LIMIT, scorer_limit
from keyshot.infer.judge.calls import Protocol, ask_score
from keyshot.infer.judge.protocol_record import JUDGE_SCORES_BACKEND, ScorerFacts
from keyshot.infer.model.checkpoint import CheckpointDescription, describe_checkpoint
from keyshot.infer.protocol.images import REFERENCE_POLICY, ImagePolicy, PreparedImage
from keyshot.infer.protocol.logprobs import alternatives, token_index
from keyshot.infer.protocol.parsing import ScoreResult, score_digit_offset
from keyshot.infer.protocol.prompts import PromptSet

logger = logging.getLogger(__name__)

SCORE_DIGITS = "12345"


@dataclass
class ScreenshotScore:
    """A scorer's answer for one screenshot.

    ``score`` is 1..5, or None when the answer could not be read in strict mode (0 in reference
    mode, as the reference). ``error`` is set for unreadable answers and for failed calls;
    ``call_failed`` tells the two apart (a failed call has no answer: its trajectory is incomplete).
    ``cut``: the answer was cut by the token limit; strict mode reads no score from it.
    """

    score: int | None
    thought: str
    raw: str
    valid: bool
    error: str | None = None
    expected_score: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False
    cost_usd: float = 0.0
    finish_reason: str | None = None
    call_failed: bool = False
    cut: bool = False

    @classmethod
    def failed(cls, error: str) -> ScreenshotScore:
        return cls(score=None, thought="", raw="", valid=False, error=error, call_failed=True)


class KeyScreenshotScorer(ABC):
    """Scores screenshots for a task and its key points.

    Args:
        prompts: the prompt set the scorer was trained on (its ``key_screenshot`` step is used).
        parse_mode: ``strict`` or ``reference`` (see :mod:`keyshot.infer.protocol.parsing`).
    """

    #: what :class:`~keyshot.infer.protocol.verdicts.Verdict` usage records this scorer's calls under
    role: str = "scorer"
    #: the config setting that limits this scorer's answers (named when its answers are cut)
    max_tokens_setting: str = SCORER_LIMIT
    #: the longest answer (tokens) the scorer's checkpoint was trained on, when known (its description)
    trained_answer_tokens: int | None = None
    #: the back-end's name in a config (``scorer.backend``), as the protocol records it
    backend: str = ""
    #: the checkpoint this scorer runs or is served from, when known (its description)
    checkpoint: CheckpointDescription | None = None

    def __init__(self, prompts: PromptSet, *, parse_mode: str = "strict"):
        self.prompts = prompts
        self.parse_mode = parse_mode
        self.protocol = Protocol(prompts, parse_mode)

    @property
    @abstractmethod
    def name(self) -> str:
        """The model that scores (for records and summaries)."""

    @property
    def image_policy(self) -> ImagePolicy | None:
        """The image policy this scorer's model was trained with, when known."""
        return None

    @property
    def constrained(self) -> bool:
        """Whether this scorer's answers are held to the answer format."""
        return False

    def facts(self) -> ScorerFacts:
        """What a verdict's protocol says of this scorer (as the run's config says it:
        :func:`keyshot.infer.judge.scorer_factory.scorer_facts`)."""
        ckpt = self.checkpoint
        return ScorerFacts(
            self.backend,
            ckpt.model if ckpt is not None else self.name,
            ckpt.hash if ckpt is not None else None,
            self.constrained,
        )

    @abstractmethod
    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        """Score one screenshot. A failed call is returned as an invalid score with ``error``."""

    async def score_many(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[ScreenshotScore]:
        """Score several screenshots of one trajectory concurrently; results in input order.

        Identical images (an agent that waited on an unchanged page) are scored once; the copies
        are marked ``cached``.
        """
        first: dict[bytes, int] = {}
        unique: list[PreparedImage] = []
        slot = []
        for img in images:
            digest = hashlib.sha256(img.jpeg).digest()
            if digest not in first:
                first[digest] = len(unique)
                unique.append(img)
            slot.append(first[digest])
        scored = await self._score_unique(task, key_points, unique)
        out, seen = [], set()
        for i in slot:
            out.append(
                scored[i] if i not in seen else dataclasses.replace(scored[i], cached=True, cost_usd=0.0)
            )
            seen.add(i)
        return out

    async def _score_unique(
        self, task: str, key_points: str, images: Sequence[PreparedImage]
    ) -> list[ScreenshotScore]:
        # Let every call finish (and reach the cache) before an error such as a spent budget
        # propagates: a call abandoned in flight would be paid again on resume.
        results = await asyncio.gather(
            *(self.score(task, key_points, img) for img in images), return_exceptions=True
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results)

    def read(self, text: str, *, cut: bool = False) -> ScoreResult:
        return self.protocol.read_score(text, cut=cut)

    def to_score(
        self, text: str, logprobs: list[dict] | None, *, cut: bool = False, **usage
    ) -> ScreenshotScore:
        """One answer -> ScreenshotScore (parse, expected score from logprobs), for every back-end."""
        result = self.read(text, cut=cut)
        expected = None
        if self.logprobs:
            expected = expected_score_from_logprobs(
                text, logprobs, result.score, self.parse_mode, self.prompts.variant
            )
        return ScreenshotScore(
            score=result.score,
            thought=result.thought,
            raw=text,
            valid=result.valid,
            error=result.error,
            expected_score=expected,
            cut=cut,
            **usage,
        )

    async def aclose(self) -> None:  # noqa: B027 (optional hook; most scorers hold nothing)
        """Release resources (HTTP connections, models)."""


# ---------------------------------------------------------------------------- expected score
def expected_score_from_logprobs(
    text: str,
    logprobs: list[dict] | None,
    score: int | None,
    mode: str = "strict",
    variant: str = "online_mind2web",
) -> float | None:
    """Σ p(d)·d over the digits 1-5 offered at the score digit's position (renormalised), or None.

    ``logprobs`` is the OpenAI ``choices[0].logprobs.content`` list: per generated token its text,
    logprob and ``top_logprobs`` alternatives.
    """
    if not logprobs or score is None:
        return None
    offset = score_digit_offset(text, mode, variant)
    if offset is None or text[offset] != str(score):
        return None
    tokens = [str(item.get("token") or "") for item in logprobs]
    position = token_index(text, logprobs, offset)
    if position is None:  # the server's token strings do not concatenate to the text (partial UTF-8 bytes)
        digit_positions = [i for i, tok in enumerate(tokens) if tok.strip() == str(score)]
        if digit_positions:
            position = digit_positions[0] if mode == "reference" else digit_positions[-1]
    if position is None or tokens[position].strip() != str(score):
        return None  # the digit shares its token with other characters: no clean distribution
    probs: dict[int, float] = {}
    for tok, p in alternatives(logprobs[position]).items():
        tok = tok.strip()
        if len(tok) == 1 and tok in SCORE_DIGITS:
            probs[int(tok)] = max(probs.get(int(tok), 0.0), p)
    total = sum(probs.values())
    if total <= 0:
        return None
    return sum(d * p for d, p in probs.items()) / total


# ---------------------------------------------------------------------------- checkpoint policy
def checkpoint_image_policy(model: str | Path) -> ImagePolicy:
    """The image policy a scorer checkpoint (folder or hub id) was trained with
    (:meth:`keyshot.infer.model.checkpoint.CheckpointDescription.require_image_policy`)."""
    return describe_checkpoint(model).require_image_policy()


# ---------------------------------------------------------------------------- endpoint back-end
class OpenAIScorer(KeyScreenshotScorer):
    """Scores through an OpenAI-compatible endpoint (vLLM serving a checkpoint, or a large model).

    Args:
        client: the endpoint's client (its cache makes a re-run pay nothing).
        prompts: the prompt set.
        parse_mode: ``strict`` or ``reference``.
        logprobs: ask for this many top alternatives per token and fill ``expected_score``.
        max_tokens: answer length limit (default: the endpoint's ``max_tokens``).
        policy: the image policy of the served checkpoint (see :func:`checkpoint_image_policy`).
        retry_invalid: ask again when an answer has no readable score (useful for sampled large
            models; a greedy checkpoint would answer the same, so it is off by default).
        role: ``scorer``, or ``judge`` when the judge model scores (the reference configuration).
    """

    def __init__(
        self,
        client: JudgeClient,
        prompts: PromptSet,
        *,
        parse_mode: str = "strict",
        logprobs: int | None = None,
        max_tokens: int | None = None,
        policy: ImagePolicy | None = None,
        retry_invalid: bool = False,
        role: str = "scorer",
    ):
        super().__init__(prompts, parse_mode=parse_mode)
        self.client = client
        self.logprobs = logprobs
        self.max_tokens = max_tokens
        self._policy = policy
        self.retry_invalid = retry_invalid
        self.role = role

    @property
    def name(self) -> str:
        return self.client.endpoint.model

    @property
    def backend(self) -> str:
        return JUDGE_SCORES_BACKEND if self.role == "judge" else "openai"

    @property
    def image_policy(self) -> ImagePolicy | None:
        return self._policy

    @property
    def constrained(self) -> bool:
        return self.role == "scorer" and self.client.endpoint.constrained

    def facts(self) -> ScorerFacts:
        return ScorerFacts(JUDGE_SCORES_BACKEND) if self.role == "judge" else super().facts()

    @property
    def max_tokens_setting(self) -> str:
        if self.role == "judge":
            return JUDGE_LIMIT
        pool = isinstance(self.client, EndpointPool)
        return scorer_limit(self.max_tokens, f"scorer.endpoint{'s[]' if pool else ''}.max_tokens")

    async def score(self, task: str, key_points: str, image: PreparedImage) -> ScreenshotScore:
        try:
            completion, _ = await ask_score(
                self.client,
                self.protocol,
                task,
                key_points,
                image.data_url,
                max_tokens=self.max_tokens,
                logprobs=self.logprobs,
                ask_again=self.retry_invalid,
            )
        except JudgeCallError as exc:
            return ScreenshotScore.failed(str(exc))
        return self.to_score(
            completion.text,
            completion.logprobs,
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            cached=completion.cached,
            cost_usd=completion.cost_usd,
            finish_reason=completion.finish_reason,
            cut=completion.cut,
        )

    async def aclose(self) -> None:
        await self.client.aclose()


# ---------------------------------------------------------------------------- the judge as its scorer
@dataclass(frozen=True)
class JudgeScores:
    """The reference configuration, named by the caller (``scorer.backend: none``): the judge model scores
    every screenshot itself, through the judge's own client (N + 2 judge calls a trajectory), and sees each
    under the reference's image policy (its own size, :data:`~keyshot.infer.protocol.images.REFERENCE_POLICY`)."""

    def scorer(self, judge: JudgeClient, prompts: PromptSet, parse_mode: str) -> OpenAIScorer:
        return OpenAIScorer(judge, prompts, parse_mode=parse_mode, policy=REFERENCE_POLICY, role="judge")


#: Pass it as :class:`~keyshot.infer.judge.pipeline.WebJudge`'s scorer for the reference configuration.
JUDGE_SCORES = JudgeScores()
