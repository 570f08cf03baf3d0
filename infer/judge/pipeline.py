"""The WebJudge pipeline: key points → key screenshots → outcome, one :class:`Verdict` per trajectory.

1. **Key points**: one judge call.
2. **Key screenshots**: every screenshot goes through the image policy (the scorer checkpoint's) and
   is scored concurrently by the scorer. With a scorer (WebJudge-7B style) this costs no judge call;
   in the reference configuration (``scorer=JUDGE_SCORES``) the judge scores each screenshot itself: N calls.
   A screenshot is kept if its score is ≥ δ (``threshold``, default 3). At most 50 are kept: strict
   mode keeps the 50 highest scores (ties: earlier first), shown in trajectory order; reference mode
   keeps the first 50, as the reference does.
3. **Outcome** (App. B.1 of the paper), ``outcome_mode``:

   * ``cot`` (default, the only mode the reference releases): one call; the judge reasons and answers
     ``Status: "success"`` or ``"failure"``.
   * ``key_point``: one outcome call per key point, the outcome prompt's ``Key Points`` field holding
     only that key point; the task succeeds iff every key point is judged met.
   * ``combined``: ``key_point`` when the task has at most ``combined_max_key_points`` (3) key points,
     ``cot`` otherwise. This is the split of the paper's Table B.1: key-point-wise is better on tasks
     with ≤ 3 key points (87.9 vs 86.1 agreement), CoT on the others (81.4 vs 76.3); choosing per task
     by that rule gives 0.489·87.9 + 0.511·81.4 = 84.6, the Combined agreement the paper reports
     (0.489 being the share of ≤ 3-key-point tasks implied by the CoT rows: 86.1p + 81.4(1-p) = 83.7).

So with a scorer a trajectory costs exactly 2 judge calls in ``cot`` mode whatever its length, and
N + 2 in the reference configuration.

Complete or not at all: a verdict is only computed when every call it needs answered. A call that
fails for good (after the client's retries) makes the trajectory *incomplete*: ``success=None``,
``error`` and ``incomplete`` name the failed calls, no outcome call is paid on partial scores, and a
re-run judges it again with every answered call from the cache. ``allow_partial=True`` keeps the
reference's behaviour instead (a failed screenshot call counts as score 0), recorded in
``Verdict.partial``. A screenshot whose *image* cannot be read is not a failed call: it is recorded
as an error on that screenshot and the rest is judged. A spent budget or an endpoint that is down
(:class:`~keyshot.infer.common.errors.RunStopError`) stops the run; the trajectories in flight are judged on resume.

A verdict needs evidence (docs/architecture.md, "A verdict needs evidence"). An answer cut by max_tokens is a failed call, not an
answer: in strict mode (the default) a cut key-point or outcome answer makes the trajectory incomplete, a
cut scorer answer gives no score, and a trajectory none of whose screenshot scores could be read gets no
verdict, only the reason (``Verdict.no_evidence``; incomplete, so the next run judges it again). When the
first answers under one token limit are all cut, the run stops (:class:`~keyshot.infer.client.breaker.CutWatch`, a
configuration error). Reference mode reads every answer as the reference does and only counts and warns.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
import weakref
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Literal

from keyshot.infer.client.breaker import CUT_WATCH_FIRST, CutWatch
from keyshot.infer.client.judge_client import JudgeCallError, JudgeClient
from keyshot.infer.common.errors import RunStopError, raise_advice
from keyshot.infer.judge.answer_limits import judge_step_limit
from keyshot.infer.judge.calls import (
    Protocol,
    ask_key_point_steps,
    ask_key_points,
    ask_outcome,
    ask_outcome_first_met,
    outcome_request,
)
from keyshot.infer.judge.protocol_record import protocol_record
from keyshot.infer.judge.scorers import JudgeScores, KeyScreenshotScorer, ScreenshotScore
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.protocol.images import DEFAULT_POLICY, REFERENCE_POLICY, ImagePolicy, PreparedImage
from keyshot.infer.protocol.logprobs import read_status_probability
from keyshot.infer.protocol.messages import MAX_KEPT_IMAGES, ListedShot
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.prompts import PromptSet, load_prompt_set
from keyshot.infer.protocol.verdicts import (
    KEEP_THRESHOLD,
    UNREADABLE_IMAGE,
    OutcomeCall,
    RoleUsage,
    ScreenshotRecord,
    Verdict,
    missing_evidence,
    select_kept,
    step_progress,
)

logger = logging.getLogger(__name__)

OutcomeMode = Literal["cot", "key_point", "combined"]
OUTCOME_MODES = ("cot", "key_point", "combined")


@dataclass
class PipelineConfig:
    """How WebJudge judges a trajectory.

    ``threshold`` is δ; ``threshold_on="expected_score"`` keeps a screenshot when its expected score
    (from log-probabilities; the scorer must be asked for them) is ≥ δ instead of its greedy score.
    ``outcome_images="scorer"`` shows the judge the kept screenshots exactly as the scorer saw them;
    ``"original"`` re-encodes them at their own size (the reference's behaviour). ``"none"`` is a
    DEVIATION from the paper: the judge reads the kept screenshots' descriptions (the scorer's reasons)
    without the images, which costs ~1,000 fewer tokens per kept screenshot; whether its verdicts agree
    with the protocol's as often has not been measured with real judges (README, bench/RESULTS.md).
    """

    prompt_variant: str = "online_mind2web"
    outcome_mode: OutcomeMode = "cot"
    parse_mode: Literal["strict", "reference"] = "strict"
    threshold: float = KEEP_THRESHOLD
    threshold_on: Literal["score", "expected_score"] = "score"
    max_kept: int = MAX_KEPT_IMAGES
    combined_max_key_points: int = 3
    outcome_images: Literal["scorer", "original", "none"] = "scorer"
    key_points_max_tokens: int | None = None
    outcome_max_tokens: int | None = None
    #: Ask the outcome call for this many top log-probabilities per token (the endpoint must return
    #: them): each outcome call then has ``p_success``, read at the status word. None: not asked.
    outcome_logprobs: int | None = None
    #: The verdict is success iff p_success >= this (an operating point chosen on labelled data: keyshot
    #: metrics, docs/operating-point.md); needs ``outcome_logprobs``. None: the status word decides.
    p_success_threshold: float | None = None
    #: Threads preparing screenshots, shared by all the trajectories in flight (first come, first served).
    image_workers: int = 4
    allow_partial: bool = False
    #: Ask when each key point was first met (``Verdict.key_point_steps``, ``step_progress``: the reward per
    #: step, docs/reward.md): in ``cot`` mode one call more, a follow-up of the outcome conversation (the
    #: verdict is unchanged); in ``key_point`` mode each key point's outcome call also names its step, at no
    #: call more. Off: the reference's calls only.
    step_rewards: bool = False

    def __post_init__(self) -> None:
        if self.outcome_mode not in OUTCOME_MODES:
            raise ValueError(f"outcome_mode must be one of {OUTCOME_MODES}, got {self.outcome_mode!r}")
        if not 1 <= self.threshold <= 5:
            raise ValueError(f"threshold must be within the score scale [1, 5], got {self.threshold}")
        if not 1 <= self.max_kept <= MAX_KEPT_IMAGES:
            raise ValueError(f"max_kept must be within [1, {MAX_KEPT_IMAGES}], got {self.max_kept}")
        if self.image_workers < 1:
            raise ValueError(f"image_workers must be >= 1, got {self.image_workers}")
        if self.combined_max_key_points < 0:
            raise ValueError(f"combined_max_key_points must be >= 0, got {self.combined_max_key_points}")
        if self.outcome_logprobs is not None and not 1 <= self.outcome_logprobs <= 20:
            raise ValueError(
                f"outcome_logprobs must be within [1, 20] (or null), got {self.outcome_logprobs}"
            )
        if self.p_success_threshold is not None:
            if not 0 <= self.p_success_threshold <= 1:
                raise ValueError(
                    f"p_success_threshold must be within [0, 1] (or null), got {self.p_success_threshold}"
                )
            if self.outcome_logprobs is None:
                raise ValueError(
                    "p_success_threshold needs the outcome call's log-probabilities: set pipeline.outcome_logprobs "
                    "(such as 5), or p_success_threshold=null"
                )
        if self.step_rewards and self.parse_mode == "reference":
            raise ValueError(
                "step_rewards asks a question the reference does not: use parse_mode=strict, or step_rewards=false"
            )
        for name in ("key_points_max_tokens", "outcome_max_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 (or null for the endpoint's), got {value}")


def outcome_plan(key_points: str, config: PipelineConfig) -> tuple[str, list[str]]:
    """The outcome mode a trajectory with ``key_points`` is judged in (``combined`` chooses by how many it has)
    and its key points one by one; in ``key_point`` mode one outcome call each (one ``cot`` call when there
    are none)."""
    items = split_key_points(key_points)
    mode = config.outcome_mode
    if mode == "combined":
        mode = "key_point" if 0 < len(items) <= config.combined_max_key_points else "cot"
    return mode, items


def outcome_calls(key_points: str, config: PipelineConfig) -> int:
    """How many outcome calls a trajectory with ``key_points`` asks (:func:`outcome_plan`)."""
    mode, items = outcome_plan(key_points, config)
    return len(items) if mode == "key_point" and items else 1


class WebJudge:
    """Judges trajectories: key points (judge) → screenshot scores (scorer) → outcome (judge).

    Args:
        judge: the judge endpoint's client.
        scorer: the key-screenshot scorer, or :data:`~keyshot.infer.judge.scorers.JUDGE_SCORES` for the
            reference configuration (the judge scores every screenshot itself, under the reference's image
            policy).
        config: pipeline settings.
        image_policy: overrides the scorer's image policy (normally the checkpoint's).
    """

    def __init__(
        self,
        judge: JudgeClient,
        scorer: KeyScreenshotScorer | JudgeScores,
        config: PipelineConfig | None = None,
        *,
        image_policy: ImagePolicy | None = None,
    ):
        self.config = config or PipelineConfig()
        self.judge_client = judge
        self.prompts: PromptSet = load_prompt_set(self.config.prompt_variant)
        if isinstance(scorer, JudgeScores):
            scorer = scorer.scorer(judge, self.prompts, self.config.parse_mode)
        elif not isinstance(scorer, KeyScreenshotScorer):
            raise TypeError(
                f"WebJudge's scorer is a KeyScreenshotScorer, or JUDGE_SCORES for the reference configuration "
                f"(the judge scores every screenshot); got {scorer!r}"
            )
        if scorer.prompts.version != self.prompts.version:
            raise ValueError(
                f"scorer uses prompt set {scorer.prompts.version} but the pipeline uses {self.prompts.version}"
            )
        if scorer.parse_mode != self.config.parse_mode:
            raise ValueError(
                f"scorer parse mode {scorer.parse_mode!r} != pipeline's {self.config.parse_mode!r}"
            )
        self.scorer = scorer
        self.protocol = Protocol(self.prompts, self.config.parse_mode)
        self._slots_by_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.stop_error: RunStopError | None = None  # a spent budget, an endpoint that is down, cut answers
        self.concurrency = 8  # trajectories judge_sync judges at once (webjudge_from_config: the config's)
        self.cut_watches: dict[str, CutWatch] = {}  # per token-limit setting, this run's answers
        self.policy = image_policy or scorer.image_policy or DEFAULT_POLICY
        if image_policy is None and scorer.image_policy is None and scorer.role == "scorer":
            logger.warning(
                "the scorer does not say which image policy it was trained with; using %s", self.policy
            )

    def describe(self) -> dict:
        """The protocol recorded in every verdict: what this judge, scorer and pipeline send
        (:func:`~keyshot.infer.judge.protocol_record.protocol_record`, as the run's ``run.json``)."""
        return protocol_record(self.config, self.judge_client.endpoint, self.scorer.facts(), self.policy)

    # ------------------------------------------------------------------ cut answers
    @property
    def strict(self) -> bool:
        return self.config.parse_mode == "strict"

    def _judge_setting(self, step: str) -> str:
        """The setting that limits a judge step's answers (``key_points`` or ``outcome``)."""
        return judge_step_limit(step, getattr(self.config, f"{step}_max_tokens"))

    def _answered(self, setting: str, verdict: Verdict, what: str, cut: bool, tokens: int) -> None:
        """Count an answer under ``setting``; a cut one is named in the verdict."""
        watch = self.cut_watches.get(setting)
        if watch is None:
            first = CUT_WATCH_FIRST if self.strict else None
            trained = self.scorer.trained_answer_tokens if setting == self.scorer.max_tokens_setting else None
            watch = self.cut_watches[setting] = CutWatch(setting, first, trained)
        watch.answered(cut, tokens)
        if cut:
            verdict.cut.append(f"{what}: cut at {tokens} tokens ({setting})")

    def _check_cuts(self) -> None:
        """Stop (CutAnswersError) once the first answers under some token limit were all cut."""
        for watch in self.cut_watches.values():
            watch.check()

    def cut_report(self) -> list[dict]:
        """This run's answers per token-limit setting that cut some of them."""
        return [w.report() for w in self.cut_watches.values() if w.cut]

    # ------------------------------------------------------------------ judge calls
    def _record_call(self, verdict: Verdict, role: str, completion) -> None:
        verdict.usage.setdefault(role, RoleUsage()).add_call(
            completion.prompt_tokens, completion.completion_tokens, completion.cost_usd, completion.cached
        )

    async def _asked(self, verdict: Verdict, what: str, step: str, call: Awaitable[tuple]) -> tuple:
        """A judge call's answer (``call``, whose first item is the completion), counted in the verdict under
        ``what``: its usage and any cut (under ``step``'s token limit); a call that failed for good makes the
        verdict incomplete and is raised."""
        try:
            answer = await call
        except JudgeCallError as exc:
            verdict.usage["judge"].errors += 1
            verdict.incomplete.append(f"{what}: {exc}")
            raise
        completion = answer[0]
        self._record_call(verdict, "judge", completion)
        self._answered(self._judge_setting(step), verdict, what, completion.cut, completion.completion_tokens)
        self._check_cuts()
        return answer

    async def _key_points(self, trajectory: Trajectory, verdict: Verdict) -> str:
        max_tokens = self.config.key_points_max_tokens
        call = ask_key_points(self.judge_client, self.protocol, trajectory.task, max_tokens=max_tokens)
        completion, points, error = await self._asked(verdict, "key points", "key_points", call)
        setting = self._judge_setting("key_points")
        if points is None and completion.cut:
            raise _StepError(f"{completion.error}; {raise_advice(setting)}")
        if points is None:
            raise _StepError(f"key points: {error} (answer: {completion.text[:200]!r})")
        return points

    async def _outcome_call(
        self,
        trajectory: Trajectory,
        key_points: str,
        images: list[str] | None,
        thoughts: list[str],
        verdict: Verdict,
        key_point: str | None = None,
    ) -> OutcomeCall:
        points = key_point if key_point is not None else key_points
        request = (trajectory.task, points, trajectory.actions, trajectory.thoughts, images, thoughts)
        limits = {"max_tokens": self.config.outcome_max_tokens, "logprobs": self.config.outcome_logprobs}
        what = "outcome" if key_point is None else f"outcome for key point {key_point!r}"
        first_met = None
        if key_point is not None and self.config.step_rewards:
            messages = outcome_request(self.protocol, *request)
            call = ask_outcome_first_met(
                self.judge_client, self.protocol, messages, listed_shots(verdict), **limits
            )
            completion, status, first_met = await self._asked(verdict, what, "outcome", call)
        else:
            call = ask_outcome(self.judge_client, self.protocol, *request, **limits)
            completion, status = await self._asked(verdict, what, "outcome", call)
        setting = self._judge_setting("outcome")
        if completion.cut and self.strict:
            raise _StepError(f"{completion.error}; {raise_advice(setting)}")
        reading = read_status_probability(
            completion.text, completion.logprobs, status.success, self.protocol.mode
        )
        if reading is not None and reading.note:
            verdict.errors.append(f"{what}: {reading.note}")
        return OutcomeCall(
            text=completion.text,
            success=status.success,
            valid=status.valid,
            error=status.error,
            key_point=key_point,
            cached=completion.cached,
            cut=completion.cut,
            p_success=reading.p_success if reading else None,
            p_success_alternatives=reading.alternatives if reading else None,
            p_success_note=reading.note if reading else None,
            step=first_met.steps[0] if first_met is not None and first_met.valid else None,
            step_error=first_met.error if first_met is not None else None,
        )

    # ------------------------------------------------------------------ screenshots
    def _image_slots(self) -> asyncio.Semaphore:
        """The threads preparing screenshots, shared by every trajectory in flight on this event loop.
        Waiters are served first come, first served, so the screenshots of the trajectory that asked
        first are ready first and its scorer calls start while the next one's are prepared."""
        loop = asyncio.get_running_loop()
        slots = self._slots_by_loop.get(loop)
        if slots is None:
            slots = self._slots_by_loop[loop] = asyncio.Semaphore(self.config.image_workers)
        return slots

    async def _prepare(self, trajectory: Trajectory, policy: ImagePolicy) -> list[PreparedImage | str]:
        """Each screenshot under ``policy``, or the error message if it cannot be read."""
        slots = self._image_slots()

        async def one(shot) -> PreparedImage | str:
            async with slots:
                try:
                    return await asyncio.to_thread(shot.prepare, policy)
                except TrajectoryError as exc:
                    return str(exc)

        return list(await asyncio.gather(*(one(s) for s in trajectory.screenshots)))

    async def _score_screenshots(
        self, trajectory: Trajectory, key_points: str, verdict: Verdict
    ) -> dict[int, PreparedImage]:
        prepared = await self._prepare(trajectory, self.policy)
        readable = [
            (shot, img)
            for shot, img in zip(trajectory.screenshots, prepared, strict=True)
            if not isinstance(img, str)
        ]
        scores: list[ScreenshotScore] = await self.scorer.score_many(
            trajectory.task, key_points, [img for _, img in readable]
        )
        by_index = {shot.index: (img, s) for (shot, img), s in zip(readable, scores, strict=True)}
        setting = self.scorer.max_tokens_setting
        role = self.scorer.role
        usage = verdict.usage.setdefault(role, RoleUsage())
        first_of: dict[bytes, int] = {}  # an image's first screenshot: identical ones are scored once
        for shot, img in zip(trajectory.screenshots, prepared, strict=True):
            record = ScreenshotRecord(index=shot.index, path=shot.recorded_name)
            if isinstance(img, str):
                record.error = f"{UNREADABLE_IMAGE}{img}"
            else:
                _, s = by_index[shot.index]
                record.visual_tokens = img.visual_tokens
                record.score, record.thought, record.valid = s.score, s.thought, s.valid
                record.error, record.expected_score, record.raw = s.error, s.expected_score, s.raw or None
                record.cached, record.call_failed, record.cut = s.cached, s.call_failed, s.cut
                first = first_of.setdefault(hashlib.sha256(img.jpeg).digest(), shot.index)
                record.same_as = first if first != shot.index else None
                if s.call_failed:  # no answer: the call failed after retries
                    usage.errors += 1
                    failed = f"screenshot {shot.index}: {s.error}"
                    if self.config.allow_partial:
                        record.score = 0  # the reference's reading of a failed call
                        verdict.partial.append(failed)
                    else:
                        verdict.incomplete.append(failed)
                else:
                    usage.add_call(s.prompt_tokens, s.completion_tokens, s.cost_usd, s.cached)
                    self._answered(setting, verdict, f"screenshot {shot.index}", s.cut, s.completion_tokens)
            if record.error:
                verdict.errors.append(f"screenshot {shot.index}: {record.error}")
            verdict.screenshots.append(record)
        self._check_cuts()
        return {index: img for index, (img, _) in by_index.items()}

    def _check_evidence(self, verdict: Verdict) -> None:
        """No verdict without a readable screenshot score (strict); reference mode judges anyway, warned."""
        reason = missing_evidence(verdict.screenshots)
        if reason is None:
            return
        verdict.no_evidence = reason
        if self.strict:
            raise _StepError(f"{reason}; no verdict without evidence, the next run judges it again")
        logger.warning(
            "%s: %s; judged anyway (parse_mode=reference keeps the reference's behaviour)",
            verdict.task_id,
            reason,
        )
        verdict.errors.append(f"{reason} (judged anyway: parse_mode=reference)")

    # ------------------------------------------------------------------ one trajectory
    async def judge(self, trajectory: Trajectory) -> Verdict:
        """Judge one trajectory. Call failures make the verdict incomplete; a spent budget or an
        endpoint that is down raises (:class:`~keyshot.infer.common.errors.RunStopError`): the run stops and the
        trajectory is judged on resume."""
        started = time.time()
        t0 = time.perf_counter()
        verdict = Verdict(
            task_id=trajectory.task_id,
            task=trajectory.task,
            agent=trajectory.agent,
            benchmark=trajectory.benchmark,
            run=trajectory.run,
            source=os.path.abspath(trajectory.source) if trajectory.source is not None else None,
            human_label=trajectory.human_label,
            reward=trajectory.reward,
            config=self.describe(),
        )
        timing = {"started": started}
        step = "key points"
        try:
            self._check_cuts()
            verdict.key_points = await self._key_points(trajectory, verdict)
            timing["key_points_s"] = time.perf_counter() - t0

            step = "key screenshots"
            t1 = time.perf_counter()
            images = await self._score_screenshots(trajectory, verdict.key_points, verdict)
            timing["scoring_s"] = time.perf_counter() - t1
            if verdict.incomplete:  # no outcome is paid for on partial scores
                failed = [r.index for r in verdict.screenshots if r.call_failed]
                raise _StepError(
                    f"incomplete: the scorer call failed for screenshot(s) {failed} "
                    f"({verdict.incomplete[-1].split(': ', 1)[-1]}); re-run to retry them"
                )
            self._check_evidence(verdict)
            verdict.kept = select_kept(
                verdict.screenshots,
                self.config.threshold,
                self.config.max_kept,
                mode=self.config.parse_mode,
                threshold_on=self.config.threshold_on,
            )

            step = "outcome"
            t2 = time.perf_counter()
            await self._outcome(trajectory, verdict, images)
            timing["outcome_s"] = time.perf_counter() - t2
        except RunStopError as exc:
            self.stop_error = self.stop_error or exc
            raise
        except (JudgeCallError, _StepError) as exc:
            verdict.success, verdict.status_valid = None, False
            verdict.error = f"{step}: {exc}"
            verdict.errors.append(verdict.error)
            logger.warning("%s: %s", trajectory.task_id, verdict.error)
        except Exception as exc:  # a bug or an unexpected input must not drop the trajectory
            logger.exception("%s: unexpected failure during %s", trajectory.task_id, step)
            verdict.success, verdict.status_valid = None, False
            verdict.error = f"{step}: {type(exc).__name__}: {exc}"
            verdict.errors.append(verdict.error)
        timing["total_s"] = time.perf_counter() - t0
        verdict.timing = timing
        return verdict

    async def aclose(self) -> None:
        await self.scorer.aclose()
        await self.judge_client.aclose()

    def judge_sync(self, trajectories: Iterable[Trajectory], concurrency: int | None = None) -> list[Verdict]:
        """Judge ``trajectories`` (at most ``concurrency`` at once, else the config's), in order, in an
        event loop of its own, the clients closed after; a spent budget or an endpoint that is down
        raises (:class:`~keyshot.infer.common.errors.RunStopError`)."""
        items = list(trajectories)
        slots_n = max(1, concurrency or self.concurrency)

        async def judge_all() -> list[Verdict]:
            slots = asyncio.Semaphore(slots_n)

            async def one(t: Trajectory) -> Verdict:
                async with slots:
                    return await self.judge(t)

            try:
                return list(await asyncio.gather(*(one(t) for t in items)))
            finally:
                await self.aclose()

        return asyncio.run(judge_all())

    async def _outcome_images(
        self, trajectory: Trajectory, verdict: Verdict, images: dict[int, PreparedImage]
    ) -> list[str] | None:
        if self.config.outcome_images == "none":
            return None  # descriptions only (a deviation, see PipelineConfig)
        if self.config.outcome_images == "scorer":
            return [images[i].data_url for i in verdict.kept]
        shots = {s.index: s for s in trajectory.screenshots}
        kept = [shots[i] for i in verdict.kept]
        prepared = await asyncio.gather(*(asyncio.to_thread(s.prepare, REFERENCE_POLICY) for s in kept))
        return [p.data_url for p in prepared]

    async def _outcome(
        self, trajectory: Trajectory, verdict: Verdict, images: dict[int, PreparedImage]
    ) -> None:
        records = {r.index: r for r in verdict.screenshots}
        kept_images = await self._outcome_images(trajectory, verdict, images)
        kept_thoughts = [records[i].thought for i in verdict.kept]
        key_points = verdict.key_points or ""
        mode, items = outcome_plan(key_points, self.config)
        verdict.config["outcome_mode_used"] = mode
        if mode == "key_point" and not items:
            verdict.errors.append("key_point mode: no key points to judge one by one; used cot")
            mode = "cot"
        if mode == "cot":
            call = await self._outcome_call(trajectory, key_points, kept_images, kept_thoughts, verdict)
            verdict.outcome_calls = [call]
            verdict.outcome_text = call.text
            verdict.success, verdict.status_valid = call.success, call.valid
            if call.error:
                verdict.errors.append(f"outcome: {call.error}")
            self._operating_point(verdict)
            if self.config.step_rewards:
                messages = outcome_request(
                    self.protocol,
                    trajectory.task,
                    key_points,
                    trajectory.actions,
                    trajectory.thoughts,
                    kept_images,
                    kept_thoughts,
                )
                await self._key_point_steps(verdict, messages, call, items)
            return
        results = await asyncio.gather(
            *(
                self._outcome_call(
                    trajectory, key_points, kept_images, kept_thoughts, verdict, key_point=item
                )
                for item in items
            ),
            return_exceptions=True,  # every call finishes (and is cached) before a failure propagates
        )
        for r in results:
            if isinstance(r, BaseException):
                raise r
        calls: list[OutcomeCall] = list(results)
        verdict.outcome_calls = calls
        for call in calls:
            if call.error:
                verdict.errors.append(f"outcome for key point {call.key_point!r}: {call.error}")
        if any(c.valid and c.success is False for c in calls):
            verdict.success, verdict.status_valid = False, True
        elif all(c.valid and c.success for c in calls):
            verdict.success, verdict.status_valid = True, True
        else:
            verdict.success, verdict.status_valid = None, False
        self._operating_point(verdict)
        if self.config.step_rewards:
            problems = [f"key point {c.key_point!r}: {c.step_error}" for c in calls if c.step_error]
            if problems:
                verdict.step_error = "; ".join(problems)
                verdict.errors.append(f"key point steps: {verdict.step_error}")
            else:
                self._set_steps(verdict, [c.step for c in calls])

    async def _key_point_steps(
        self, verdict: Verdict, messages: list[dict], outcome: OutcomeCall, items: list[str]
    ) -> None:
        """The step question after a ``cot`` outcome (one call more): when each key point was first met."""
        if not items or not verdict.screenshots:
            verdict.step_error = (
                "no key points to place" if not items else "no screenshots to place key points at"
            )
            return
        if not outcome.valid or outcome.text is None:
            verdict.step_error = "the outcome could not be read, so the step question was not asked"
            return
        what = "key point steps"
        call = ask_key_point_steps(
            self.judge_client,
            self.protocol,
            messages,
            outcome.text,
            items,
            listed_shots(verdict),
            max_tokens=self.config.outcome_max_tokens,
        )
        completion, steps = await self._asked(verdict, what, "outcome", call)
        if steps.valid:
            self._set_steps(verdict, steps.steps)
        else:
            advice = f"; {raise_advice(self._judge_setting('outcome'))}" if completion.cut else ""
            verdict.step_error = f"{steps.error} (answer: {completion.text[:200]!r}){advice}"
            verdict.errors.append(f"{what}: {verdict.step_error}")

    @staticmethod
    def _set_steps(verdict: Verdict, steps: list[int | None]) -> None:
        verdict.key_point_steps = list(steps)
        verdict.step_progress = step_progress(verdict.screenshots, verdict.key_point_steps)

    def _operating_point(self, verdict: Verdict) -> None:
        """With ``p_success_threshold``, the verdict is success iff p_success reaches it; a verdict without
        p_success keeps its status word's reading, said in its errors."""
        threshold = self.config.p_success_threshold
        if threshold is None or verdict.success is None:
            return
        p = verdict.p_success
        if p is None:
            verdict.errors.append(
                f"p_success_threshold {threshold}: no p_success read; the status word decides"
            )
            return
        verdict.success = p >= threshold


def listed_shots(verdict: Verdict) -> list[ListedShot]:
    """Every screenshot of a verdict as the step question lists it: its index, score and description."""
    return [(r.index, r.score, r.thought) for r in verdict.screenshots]


class _StepError(RuntimeError):
    """A judge answer the pipeline cannot go on from (strict mode)."""
