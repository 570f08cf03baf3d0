"""keyshot as a reward model: :class:`RewardModel` scores rollouts with the WebJudge pipeline of a
``keyshot judge`` config, one :class:`RewardResult` per rollout, in order.

Group-aware: every rollout of a batch is judged at once (at most the config's ``concurrency``), so all
their scorer calls are in flight together (bounded by the scorer endpoint's ``max_concurrency``), and
rollouts of one task share one key-point call, within a batch (the judge client sends identical requests
in flight once) and across batches (the call cache). A failed call is never a reward of 0: the reward
is None with the reason, unless ``on_failure="zero"`` (recorded in the result as ``on_failure_applied``).

A RewardModel runs its calls on an event loop of its own (:mod:`keyshot.reward.loop_thread`), whose thread
starts at its first score (building a model starts no thread) and ends in :meth:`RewardModel.close`, or at
exit if nobody closed it; a forked child cannot use its parent's model (it has no copy of the loop's
thread) and builds its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import ConfigError, config_from_data, load_config
from keyshot.infer.common.errors import RunStopError
from keyshot.infer.common.processes import PerProcess
from keyshot.infer.judge.config import REWARD_SECTION, JudgeRunConfig, RewardSettings  # the reward: section
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.scorer_factory import build_scorer, describe_scorer
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.runs.counts import call_split
from keyshot.reward.episode import Episode
from keyshot.reward.loop_thread import LoopThread
from keyshot.reward.rollouts import RolloutError, read_rollout

logger = logging.getLogger(__name__)

#: Why a rollout got no verdict (``RewardResult.kind``): ``input`` (the rollout cannot be read), ``stopped``
#: (an endpoint is down or a budget spent), ``judge`` (a key-point or outcome call failed, or the judge's
#: verdict could not be read), ``scorer`` (the screenshot scores: a call failed, none could be read, or the
#: scorer's endpoint did not answer), ``value`` (a verdict without the configured ``reward.value``).
FailureKind = Literal["input", "stopped", "judge", "scorer", "value", "deadline"]
#: The batch window's documented fallback when the config sets no ``reward.batch_window_s``.
WINDOW_ENV = "KEYSHOT_REWARD_WINDOW_S"
DEFAULT_WINDOW_S = 0.05


def batch_window_s(configured: float | None) -> float:
    """The reward's batch window, the one rule: ``reward.batch_window_s`` (``configured``) when set, else
    ``$KEYSHOT_REWARD_WINDOW_S`` (seconds), else :data:`DEFAULT_WINDOW_S`."""
    if configured is not None:
        return configured
    raw = os.environ.get(WINDOW_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_WINDOW_S
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(
            f"${WINDOW_ENV}={raw!r} is not a number of seconds: unset it or set reward.batch_window_s"
        ) from None


NO_LOGPROBS = "not available: the outcome call asks for no logprobs (set pipeline.outcome_logprobs, e.g. 5)"
STATUS_TOKEN = "the status word's token at 'Status:', P(success) over success/failure alternatives"


def p_success_of(verdict: Verdict, asked: bool) -> tuple[float | None, str]:
    """P(success) from the outcome calls' status tokens, and where it came from (or why there is none)."""
    if not asked:
        return None, NO_LOGPROBS
    if (value := verdict.p_success) is None:
        return None, "not available: the judge's answer gave no log-probabilities at its status word"
    if len(calls := verdict.outcome_calls) == 1:
        return value, STATUS_TOKEN
    return value, f"{STATUS_TOKEN}, multiplied over the {len(calls)} key points (taken as independent)"


@dataclass
class RewardResult:
    """The reward of one rollout.

    ``reward``: the configured value (``reward.value``: the verdict 1.0/0.0 by default, or ``p_success``
    or ``progress``), or None (no verdict: ``error`` says why in words, ``kind`` which kind of failure it
    is, :data:`FailureKind`). ``success`` is always the verdict. ``p_success``: the
    probability of success read at the status token, when the outcome call asks for log-probabilities
    (``pipeline.outcome_logprobs``) and the judge returns them; ``p_success_source`` says how it was read,
    or why there is none. ``progress``: the
    fraction of key points judged met, when the outcome was judged key point by key point
    (``outcome_mode: key_point`` or ``combined``), else None. ``step_scores``: the scorer's 1-5 score per
    screenshot (None where it gave none); ``kept``: the indices of the key screenshots. ``calls``: each
    role's answers, ``paid_calls`` those sent to its endpoint, ``cached_calls`` the others, which are
    ``cache_hits`` (read from the call cache) and ``same_image`` (an identical screenshot scored once):
    :func:`keyshot.infer.runs.counts.call_split`.

    With ``pipeline.step_rewards``: ``key_point_steps`` (the screenshot at which each key point was first
    met, None: never), ``step_progress`` (the share of key points met by each screenshot) and
    ``step_rewards``, one per screenshot (:func:`per_step_rewards`): entry t is the reward of the action that
    led to screenshot t (entry 0, the first page's, belongs to no action: an adapter adds it to the first
    one), and they sum to the episode's ``progress`` (mixed with the verdict by
    ``reward.step_outcome_weight``). None when not asked, or when the judge's answer could not be read
    (``step_error`` says why).
    """

    id: str
    task_id: str | None = None
    reward: float | None = None
    success: bool | None = None
    p_success: float | None = None
    p_success_source: str | None = NO_LOGPROBS
    progress: float | None = None
    key_points: list[str] = field(default_factory=list)
    step_scores: list[int | None] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    cached_calls: dict[str, int] = field(default_factory=dict)
    cache_hits: dict[str, int] = field(default_factory=dict)
    same_image: dict[str, int] = field(default_factory=dict)
    paid_calls: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)
    cost_usd: float = 0.0
    error: str | None = None
    kind: FailureKind | None = None
    on_failure_applied: bool = False
    seconds: float = 0.0
    key_point_steps: list[int | None] | None = None
    step_progress: list[float] | None = None
    step_rewards: list[float] | None = None
    step_error: str | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def failure(
        cls,
        rid: str,
        kind: FailureKind,
        problem: object,
        *,
        task_id: str | None = None,
        seconds: float = 0.0,
    ) -> RewardResult:
        """The result of a rollout given no verdict before any verdict was asked for (a rollout that
        cannot be read: ``input``; an endpoint down or a budget spent: ``stopped``; ...): ``error`` is
        ``"<kind>: <problem>"``. :meth:`RewardModel.failed` also counts and logs it."""
        return cls(id=rid, task_id=task_id, error=f"{kind}: {problem}", kind=kind, seconds=seconds)


def per_step_rewards(
    progress: Sequence[float], success: bool | None, outcome_weight: float = 0.0
) -> list[float]:
    """The reward of each step from the progress at each screenshot: r_t = P_t - P_(t-1) (P_(-1) = 0), so
    they sum to the last progress; with ``outcome_weight`` w, (1 - w) r_t and w times the verdict at the
    last step (they then sum to (1 - w) P + w success)."""
    rewards = [
        (1 - outcome_weight) * (p - before) for before, p in zip([0.0, *progress[:-1]], progress, strict=True)
    ]
    if rewards and outcome_weight:
        rewards[-1] += outcome_weight * float(bool(success))
    return rewards


def per_action_rewards(step_rewards: Sequence[float], actions: int) -> list[float]:
    """The per-screenshot rewards as ``actions`` actions earn them: screenshot t is the page action t - 1 led
    to, the first page's reward (no action led to it) goes to the first action, and a screenshot past the
    last action's page to the last action, so the sum is kept. No action: one entry, the sum."""
    if actions < 1:
        return [float(sum(step_rewards))]
    out = [0.0] * actions
    for t, reward in enumerate(step_rewards):
        out[min(max(t - 1, 0), actions - 1)] += reward
    return out


def rollout_id(rollout: Any, trajectory: Trajectory | None, position: int) -> str:
    """The id a result reports: the dict's ``id``, the episode's or folder's name, else the position."""
    if isinstance(rollout, dict) and rollout.get("id") is not None:
        return str(rollout["id"])
    if isinstance(rollout, Episode):
        return rollout.id
    if isinstance(rollout, (str, os.PathLike)):
        return str(rollout)
    if trajectory is not None:
        return trajectory.uid
    return str(position)


def failure_kind(verdict: Verdict) -> FailureKind:
    """Which part of a verdict without a success/failure failed: the screenshot scores (a scorer call
    failed, or none of its answers could be read) or the judge (key points, outcome, an unreadable
    verdict)."""
    if verdict.no_evidence is not None or any(s.call_failed for s in verdict.screenshots):
        return "scorer"
    return "judge"


def result_of(rid: str, verdict: Verdict, seconds: float, logprobs_asked: bool = False) -> RewardResult:
    """A verdict read as a reward."""
    error = verdict.error
    if error is None and verdict.success is None:
        error = "outcome: the judge's verdict could not be read" + (
            f" ({verdict.errors[-1]})" if verdict.errors else ""
        )
    splits = {role: call_split(verdict, role) for role in verdict.usage}
    progress = None
    if verdict.config.get("outcome_mode_used") == "key_point" and verdict.outcome_calls:
        met = sum(bool(c.valid and c.success) for c in verdict.outcome_calls)
        progress = met / len(verdict.outcome_calls)
    elif verdict.step_progress:  # cot with step_rewards: the share of key points the judge placed
        progress = verdict.step_progress[-1]
    p_success, source = (
        p_success_of(verdict, logprobs_asked)
        if verdict.success is not None
        else (None, "no verdict: see error")
    )
    return RewardResult(
        id=rid,
        task_id=verdict.task_id,
        reward=None if verdict.success is None else float(verdict.success),
        success=verdict.success,
        p_success=p_success,
        p_success_source=source,
        progress=progress,
        key_points=split_key_points(verdict.key_points or ""),
        step_scores=[r.score for r in verdict.screenshots],
        kept=list(verdict.kept),
        calls={role: split.answers for role, split in splits.items()},
        cached_calls={role: split.cache_hits + split.same_image for role, split in splits.items()},
        cache_hits={role: split.cache_hits for role, split in splits.items()},
        same_image={role: split.same_image for role, split in splits.items()},
        paid_calls={role: split.sent for role, split in splits.items()},
        tokens={
            "prompt": sum(u.prompt_tokens for u in verdict.usage.values()),
            "completion": sum(u.completion_tokens for u in verdict.usage.values()),
        },
        cost_usd=sum(u.cost_usd for u in verdict.usage.values()),
        error=error,
        kind=None if error is None else failure_kind(verdict),
        seconds=seconds,
        key_point_steps=verdict.key_point_steps,
        step_error=verdict.step_error,
        step_progress=verdict.step_progress,
        step_rewards=per_step_rewards(verdict.step_progress, verdict.success)
        if verdict.step_progress
        else None,
    )


def split_overrides(overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Keyword overrides → (reward settings, ``key.sub=value`` config overrides); ``judge__model`` is
    ``judge.model``."""
    names = {f.name for f in dataclasses.fields(RewardSettings)}
    settings = {k: v for k, v in overrides.items() if k in names}
    rest = [
        f"{k.replace('__', '.')}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
        for k, v in overrides.items()
        if k not in names
    ]
    return settings, rest


def reward_config(
    path: str | os.PathLike, *overrides: str, **settings: Any
) -> tuple[JudgeRunConfig, RewardSettings]:
    """The judge config and reward settings :meth:`RewardModel.from_config` builds a model of (the same
    arguments), read without building it: ``keyshot reward serve --serve-scorer`` starts vLLM from them
    first and builds the model with the served endpoint."""
    reward_kw, config_overrides = split_overrides(settings)
    cfg = load_config(JudgeRunConfig, path, [*overrides, *config_overrides])
    section = dataclasses.asdict(cfg.reward) if cfg.reward is not None else {}  # checked by load_config
    reward = config_from_data(RewardSettings, {**section, **reward_kw}, where=f"{path}: {REWARD_SECTION}")
    reward.check(cfg, str(path))
    reward.batch_window_s = batch_window_s(reward.batch_window_s)
    return cfg, reward


class RewardModel:
    """WebJudge as a reward: ``await rm.score(rollouts)`` or ``rm.score_sync(rollouts)``.

    Build it with :meth:`from_config` (a ``keyshot judge`` config). One RewardModel holds one call cache
    (``cache:`` of the config, else a file in a temporary folder of its own) and one client per endpoint,
    shared by every batch, so key points are asked once per task for its whole life.
    """

    def __init__(
        self, cfg: JudgeRunConfig, settings: RewardSettings | None = None, ledger: UsageLedger | None = None
    ):
        self.cfg = cfg
        self.settings = settings or RewardSettings()
        self.settings.check(cfg, cfg.out)
        self.checkpoint = describe_scorer(cfg.scorer)  # read once, handed to every scorer built here
        tmp = None if cfg.cache else tempfile.mkdtemp(prefix="keyshot-reward-")
        try:
            self.cache = CallCache(Path(cfg.cache) if cfg.cache else Path(tmp) / "calls.sqlite")
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.ledger = ledger if ledger is not None else UsageLedger()  # a cluster's, on Ray
        self.judge_client = JudgeClient(cfg.judge, self.cache, self.ledger)
        self._pipelines: dict[tuple[str | None, str | None], WebJudge] = {}
        self._down_since: dict[int, float] = {}
        self.failures = 0  # rollouts given no verdict (any cause), for metrics and logs
        self.applied_on_failure = 0
        #: every round of calls runs on this loop, whoever asks (:mod:`keyshot.reward.loop_thread`); its
        #: thread starts at the first call
        self.loop = LoopThread()
        # the one way this model's resources are released: close(), or at exit / when it is collected
        self._release = weakref.finalize(
            self,
            _release,
            self.loop,
            functools.partial(_close_clients, self.judge_client, self._pipelines),
            self.cache,
            tmp,
        )
        _live_models.items.add(self)

    @classmethod
    def from_config(cls, path: str | os.PathLike, *overrides: str, **settings: Any) -> RewardModel:
        """A RewardModel from a ``keyshot judge`` config (YAML). ``overrides`` are ``key.sub=value``
        strings; keyword ``on_failure``/``allow_root`` set the reward options (else the config's
        ``reward:`` section does), any other keyword overrides the config (``concurrency=8``,
        ``judge__model="gpt-4o"``)."""
        return cls(*reward_config(path, *overrides, **settings))

    # ------------------------------------------------------------------ pipelines
    def pipeline(self, scorer_url: str | None = None, scorer_model: str | None = None) -> WebJudge:
        """The WebJudge of this config, or with its scorer requests sent to ``scorer_url`` under the model
        name ``scorer_model`` (verl's reward router serves the scorer under its own name); the judge
        client (and so key-point coalescing) is shared."""
        key = (scorer_url, scorer_model)
        if key not in self._pipelines:
            endpoint = None
            if scorer_url is not None or scorer_model is not None:
                base = self.cfg.scorer.base_endpoint
                if base is None:
                    base = EndpointConfig(base_url=scorer_url or "", model="webjudge-7b", api_key_env=None)
                endpoint = dataclasses.replace(
                    base, base_url=scorer_url or base.base_url, model=scorer_model or base.model
                )
            scorer = build_scorer(self.cfg, self.cache, self.ledger, endpoint, self.checkpoint)
            self._pipelines[key] = WebJudge(self.judge_client, scorer, self.cfg.pipeline)
        return self._pipelines[key]

    def _revive(self, webjudge: WebJudge) -> None:
        """Give a tripped endpoint another chance once it has been down for ``reward.breaker_cooldown_s``."""
        clients = [webjudge.judge_client, getattr(webjudge.scorer, "client", None)]
        for client in filter(None, clients):
            breaker = getattr(client, "breaker", None)
            if breaker is None or breaker.down is None:
                self._down_since.pop(id(client), None)
                continue
            since = self._down_since.setdefault(id(client), time.monotonic())
            if time.monotonic() - since >= self.settings.breaker_cooldown_s:
                breaker.reset()
                self._down_since.pop(id(client), None)
        webjudge.stop_error = None

    def health(self) -> dict[str, Any]:
        """Breaker state of the judge and scorer endpoints (None: up)."""
        scorer = getattr(self.pipeline().scorer, "client", None)
        breaker = getattr(scorer, "breaker", None)
        return {
            "judge": {"url": self.cfg.judge.display_url, "down": str(self.judge_client.down or "") or None},
            "scorer": {"down": str(breaker.down) if breaker is not None and breaker.down else None},
        }

    # ------------------------------------------------------------------ scoring
    async def score(
        self, rollouts: Sequence[Any], *, scorer_url: str | None = None, scorer_model: str | None = None
    ) -> list[RewardResult]:
        """One result per rollout, in order. Never raises for a rollout: a rollout that cannot be read
        or judged gets ``reward=None`` (or 0.0 with ``on_failure="zero"``) and ``error``. Episodes are
        discarded (their temporary files removed) once scored. Awaitable from any event loop: the calls
        run on the model's own loop (:mod:`keyshot.reward.loop_thread`)."""
        return await self.loop.run(self._score(list(rollouts), scorer_url, scorer_model))

    def score_sync(self, rollouts: Sequence[Any], **kwargs: Any) -> list[RewardResult]:
        """:meth:`score` from synchronous code, in any thread (not from inside the model's own loop)."""
        return self.loop.run_sync(
            self._score(list(rollouts), kwargs.get("scorer_url"), kwargs.get("scorer_model"))
        )

    async def _score(
        self, rollouts: list[Any], scorer_url: str | None, scorer_model: str | None
    ) -> list[RewardResult]:
        webjudge = self.pipeline(scorer_url, scorer_model)
        self._revive(webjudge)
        slots = asyncio.Semaphore(self.cfg.concurrency)

        async def one(position: int, rollout: Any) -> RewardResult:
            t0 = time.perf_counter()
            trajectory = None
            try:
                trajectory = await asyncio.to_thread(
                    read_rollout, rollout, position, allow_root=self.settings.allow_root
                )
                async with slots:
                    verdict = await webjudge.judge(trajectory)
                result = self.valued(
                    result_of(
                        rollout_id(rollout, trajectory, position),
                        verdict,
                        time.perf_counter() - t0,
                        self.cfg.pipeline.outcome_logprobs is not None,
                    )
                )
            except (RolloutError, RunStopError) as exc:
                result = RewardResult.failure(
                    rollout_id(rollout, trajectory, position),
                    "input" if isinstance(exc, RolloutError) else "stopped",
                    exc,
                    task_id=trajectory.task_id if trajectory else None,
                    seconds=time.perf_counter() - t0,
                )
            finally:
                if isinstance(rollout, Episode):
                    rollout.discard()
            return self.settle(result)

        return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(rollouts))))

    def valued(self, result: RewardResult) -> RewardResult:
        """The result's reward as ``reward.value`` says (a verdict without that value is a failure), and
        its per-step rewards mixed with the verdict by ``reward.step_outcome_weight``."""
        weight = self.settings.step_outcome_weight
        if result.step_progress and weight:
            result.step_rewards = per_step_rewards(result.step_progress, result.success, weight)
        if result.reward is None or self.settings.value == "binary":
            return result
        if self.settings.value == "p_success":
            value, why = result.p_success, f"reward.value p_success: {result.p_success_source}"
        elif self.settings.value == "step_progress":
            value = sum(result.step_rewards) if result.step_rewards is not None else None
            why = f"reward.value step_progress: no steps ({result.step_error or 'pipeline.step_rewards is off'})"
        else:
            value, why = result.progress, "reward.value progress: the outcome gave no per-key-point verdicts"
        if value is None:
            result.reward, result.error, result.kind = None, why, "value"
        else:
            result.reward = float(value)
        return result

    def failed(self, rid: str, kind: FailureKind, problem: object) -> RewardResult:
        """:meth:`RewardResult.failure`, settled (counted, logged, given ``on_failure``'s number): an
        adapter's sample that never reached :meth:`score` (an unreadable label, an unanswered router)."""
        return self.settle(RewardResult.failure(rid, kind, problem))

    def settle(self, result: RewardResult) -> RewardResult:
        """Count and log a result given no verdict, and give it ``on_failure``'s number."""
        if result.reward is None:
            self.failures += 1
            if self.settings.on_failure == "zero":
                result.reward, result.on_failure_applied = 0.0, True
                self.applied_on_failure += 1
            logger.warning(
                "reward %s: %s%s", result.id, result.error, " (on_failure: zero)" * result.on_failure_applied
            )
        return result

    def close(self) -> None:
        """Close the clients, stop the model's loop, close the call cache and remove its temporary folder:
        the model cannot score after this. Idempotent and safe from any thread; called on the model's own
        loop, it hands the work to a thread of its own and returns."""
        if self.loop.owns_current():
            threading.Thread(target=self._release, name="keyshot-reward-close").start()
            return
        self._release()

    async def aclose(self) -> None:
        """:meth:`close` for async code: the caller's event loop keeps running meanwhile."""
        await asyncio.to_thread(self.close)


#: How long closing waits for the clients to close on the model's loop.
CLOSE_TIMEOUT_S = 10.0


async def _close_clients(judge_client: JudgeClient, pipelines: dict[Any, WebJudge]) -> None:
    for webjudge in list(pipelines.values()):
        await webjudge.scorer.aclose()
    await judge_client.aclose()


def _release(loop: LoopThread, close_clients: Any, cache: CallCache, tmp: str | None) -> None:
    """Release a RewardModel's resources (its finaliser: it holds no reference to the model)."""
    try:
        if loop.running:
            loop.run_sync(close_clients(), timeout=CLOSE_TIMEOUT_S)
    except (RuntimeError, TimeoutError) as exc:  # a stuck endpoint or interpreter shutdown: stop anyway
        logger.warning("reward model: its clients did not close cleanly (%s)", exc)
    finally:
        loop.stop()
        cache.close()
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _forget_after_fork(models: weakref.WeakSet[RewardModel]) -> None:
    """In a forked child: the models' loop threads did not come along, and their cache and folders are the
    parent's. Each model there becomes unusable (its calls say so) and releases nothing."""
    for model in list(models):
        model._release.detach()
        model.loop.abandon(
            f"this RewardModel was built in process {os.getppid()}, before a fork; build one in this process "
            "(RewardModel.from_config, or keyshot.reward.shared_model)"
        )


#: The models of this process (keyshot.infer.common.processes.PerProcess: forgotten in a forked child)
_live_models: PerProcess[weakref.WeakSet[RewardModel]] = PerProcess(
    weakref.WeakSet, forget=_forget_after_fork
)
