"""A ``keyshot judge`` run's configuration (judge, scorer, pipeline, run); the scorer it describes is
built by :mod:`keyshot.infer.judge.scorer_factory`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import ClassVar, Literal

from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.client.pool import DEFAULT_COOLDOWN_S, member_configs
from keyshot.infer.common.config import ConfigError
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.judge.answer_limits import JUDGE_LIMIT, judge_step_limit, scorer_limit
from keyshot.infer.judge.local_scorer import on_cuda
from keyshot.infer.judge.pipeline import PipelineConfig
from keyshot.infer.judge.protocol_record import JUDGE_SCORES_BACKEND
from keyshot.infer.protocol.answer_format import answer_format
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy
from keyshot.infer.serve.plan import ServeConfig

logger = logging.getLogger(__name__)


@dataclass
class ScorerConfig:
    """The key-screenshot scorer.

    ``backend``: ``openai`` (an OpenAI-compatible endpoint, e.g. ``keyshot serve``, or ``endpoints``:
    several replicas of it, each call to the least-loaded live one), ``transformers``
    (in-process, ``checkpoint`` is the model folder), ``none`` (reference configuration: the judge
    scores every screenshot) or another registered back-end
    (:data:`keyshot.infer.judge.scorer_factory.SCORER_BACKENDS`, which names the known ones for an
    unknown name). ``checkpoint`` (a folder, or a hub id such as ``osunlp/WebJudge-7B``) also
    fixes the image policy (its training pixel bounds; ``min_pixels``/``max_pixels`` set beside it must
    equal them); without it, ``min_pixels``/``max_pixels`` do (one of them alone: keyshot's default for the
    other, said in one line), else keyshot's default policy. A checkpoint that records
    the answer length it was trained on also fixes the least answer limit (:func:`keyshot.infer.judge.scorer_factory.scorer_max_tokens`).
    """

    backend: str = "openai"
    endpoint: EndpointConfig | None = None
    endpoints: list[EndpointConfig] | None = (
        None  # a pool of replicas of one model (keyshot.infer.client.pool)
    )
    cooldown_s: float = DEFAULT_COOLDOWN_S  # how long a failed pool endpoint is left out
    checkpoint: str | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    logprobs: int | None = None
    max_tokens: int | None = None
    retry_invalid: bool = False
    device: str = "cpu"
    dtype: str = "auto"  # bfloat16 on CUDA, float32 on CPU
    batch_size: int = 4
    #: backend transformers on CUDA: replay the vision tower from a CUDA graph for up to this many screenshot
    #: grids (a grid is a batch's screenshot sizes after the pixel bounds: screenshots of one size at one
    #: batch size share one; each is captured the first time it is seen). 0: off.
    tower_cuda_graphs: int = 0
    serve: ServeConfig | None = None  # settings for --serve-scorer

    @property
    def base_endpoint(self) -> EndpointConfig | None:
        """The configured endpoint, or the pool's first: the settings (model, answer limit, timeout,
        concurrency) a scorer pointed elsewhere keeps (``--scorer-url``, verl's reward router)."""
        return self.endpoint or (self.endpoints or [None])[0]

    @property
    def judge_scores(self) -> bool:
        """The reference configuration: no scorer, the judge scores every screenshot itself."""
        return self.backend == JUDGE_SCORES_BACKEND

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.endpoints:
            raise ValueError("set scorer.endpoint (one) or scorer.endpoints (a pool), not both")
        if self.endpoints:
            member_configs(self.endpoints)  # one model, no endpoint twice
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.tower_cuda_graphs < 0:
            raise ValueError(f"tower_cuda_graphs must be >= 0, got {self.tower_cuda_graphs}")
        if self.tower_cuda_graphs and (self.backend != "transformers" or not on_cuda(self.device)):
            raise ValueError(
                "tower_cuda_graphs needs the in-process scorer on a GPU (backend: transformers, device: cuda); "
                "set it to 0"
            )
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be within [0, 20] (or null), got {self.logprobs}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (or null), got {self.max_tokens}")
        bounds = self.pixel_bounds()
        if bounds is not None:
            try:
                ImagePolicy(min_pixels=bounds[0], max_pixels=bounds[1])
            except ValueError as exc:
                raise ValueError(f"{self._bounds_words()}: {exc}; correct them") from None
            if (self.min_pixels is None or self.max_pixels is None) and not self.checkpoint:
                logger.info("%s: images are scaled within %d..%d px", self._bounds_words(), *bounds)

    def pixel_bounds(self) -> tuple[int, int] | None:
        """``(min_pixels, max_pixels)`` as configured, keyshot's default standing in for the one not set;
        None when neither is set."""
        if self.min_pixels is None and self.max_pixels is None:
            return None
        lo = DEFAULT_POLICY.min_pixels if self.min_pixels is None else self.min_pixels
        hi = DEFAULT_POLICY.max_pixels if self.max_pixels is None else self.max_pixels
        return lo, hi

    def _bounds_words(self) -> str:
        def one(key: str, value: int | None, default: int) -> str:
            return f"scorer.{key}={value}" if value is not None else f"keyshot's default {key} {default}"

        return (
            f"{one('min_pixels', self.min_pixels, DEFAULT_POLICY.min_pixels)} with "
            f"{one('max_pixels', self.max_pixels, DEFAULT_POLICY.max_pixels)}"
        )


OnFailure = Literal["none", "zero"]
ON_FAILURE = ("none", "zero")
RewardValue = Literal["binary", "p_success", "progress", "step_progress"]
REWARD_VALUES = ("binary", "p_success", "progress", "step_progress")
#: The config's own section for the reward model (``keyshot judge`` checks it and does not use it):
#: ``reward: {on_failure: zero}``.
REWARD_SECTION = "reward"


@dataclass
class RewardSettings:
    """The ``reward:`` section of a judge config (or keyword overrides of
    :meth:`keyshot.reward.model.RewardModel.from_config`): settings only, no runtime. It lives here, beside
    :class:`JudgeRunConfig`, so that the config loader refuses a typo under ``reward:`` for ``keyshot judge``
    too; :mod:`keyshot.reward.model` re-exports it."""

    on_failure: OnFailure = "none"
    allow_root: str | None = None  # where dict rollouts' screenshot paths may point (default: cwd)
    #: what the reward is: the verdict (1.0/0.0), P(success) at the status word, the fraction of key
    #: points met, or the sum of the per-step rewards (``step_progress``: needs ``pipeline.step_rewards``;
    #: the share of key points met, mixed with the verdict by ``step_outcome_weight``). A binary reward makes
    #: a GRPO group whose rollouts all fail (or all succeed) equal.
    value: RewardValue = "binary"
    #: the per-step rewards' mix with the verdict: r_t = (1 - w)(P_t - P_(t-1)), plus w times the verdict
    #: (1.0/0.0) at the last step, so that they sum to (1 - w) progress + w success. 0: progress alone.
    step_outcome_weight: float = 0.0
    #: the shared model's batch window: rollouts submitted within it of the first share one round of calls
    #: (:mod:`keyshot.reward.shared`); unset in the config: ``$KEYSHOT_REWARD_WINDOW_S``, else 0.05 s (read
    #: by :func:`keyshot.reward.model.reward_config`, which loads the settings; the settings themselves read
    #: no environment).
    batch_window_s: float | None = None
    #: how long a tripped endpoint breaker stays down before a later batch tries the endpoint again.
    breaker_cooldown_s: float = 30.0

    def __post_init__(self) -> None:
        if self.on_failure not in ON_FAILURE:
            raise ValueError(f"on_failure must be one of {ON_FAILURE}, got {self.on_failure!r}")
        if self.value not in REWARD_VALUES:
            raise ValueError(f"reward.value must be one of {REWARD_VALUES}, got {self.value!r}")
        if not 0 <= self.step_outcome_weight <= 1:
            raise ValueError(
                f"reward.step_outcome_weight must be within [0, 1], got {self.step_outcome_weight!r}"
            )
        for name in ("batch_window_s", "breaker_cooldown_s"):
            if (getattr(self, name) or 0) < 0:
                raise ValueError(f"reward.{name} must be >= 0, got {getattr(self, name)!r}")

    def check(self, cfg: JudgeRunConfig, where: str) -> None:
        """Refuse a value the judge config cannot produce, naming the keys to set."""
        if self.value == "p_success" and cfg.pipeline.outcome_logprobs is None:
            raise ConfigError(
                f"{where}: reward.value p_success needs the outcome call's log-probabilities: "
                "set pipeline.outcome_logprobs (e.g. 5)"
            )
        if (
            self.value == "progress"
            and cfg.pipeline.outcome_mode != "key_point"
            and not cfg.pipeline.step_rewards
        ):
            raise ConfigError(
                f"{where}: reward.value progress needs the outcome judged key point by key point "
                f"(pipeline.outcome_mode: key_point; it is {cfg.pipeline.outcome_mode!r}) or the key points' "
                "steps asked (pipeline.step_rewards: true)"
            )
        if self.value == "step_progress" and not cfg.pipeline.step_rewards:
            raise ConfigError(
                f"{where}: reward.value step_progress needs when each key point was first met: "
                "set pipeline.step_rewards: true"
            )


@dataclass
class JudgeRunConfig:
    """One ``keyshot judge`` run (``configs/judge/*.yaml``)."""

    #: the shipped configs' folder a name two folders share is read from (``--config tiny_cpu``)
    SHIPPED_FOLDER: ClassVar[str] = "judge"
    judge: EndpointConfig
    scorer: ScorerConfig = field(default_factory=ScorerConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    out: str = "runs/judge"
    cache: str | None = None  # default OUT/calls.sqlite
    format: str = "auto"
    agent: str | None = None  # for formats that do not name the agent
    benchmark: str | None = None
    concurrency: int = 4  # trajectories judged at once
    limit: int | None = None
    shard_by: Literal["task", "trajectory"] = "task"  # what --shard I/N hashes (keyshot.infer.runs.shards)
    # The reward model's options (keyshot.reward, docs/reward.md): one config file serves judging and
    # rewards. keyshot judge checks the section (an unknown key or value is refused) and does not use it;
    # it changes no verdict.
    reward: RewardSettings | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for all), got {self.limit}")
        self._check_constrained()

    def called_endpoints(self, served: EndpointConfig | None = None) -> list[EndpointConfig]:
        """Every endpoint a run's clients call, named as they count by in the ledger: the judge, the
        scorer's endpoint or its pool's members (named ``model@host:port``, as the pool names them), and
        ``served``, a scorer the run serves itself (``--serve-scorer``)."""
        members = member_configs(self.scorer.endpoints) if self.scorer.endpoints else [self.scorer.endpoint]
        return [e for e in (self.judge, *members, served) if e is not None]

    def constrained_endpoints(self) -> dict[str, EndpointConfig]:
        """The endpoints whose answers are held to the answer format (``constrained: true``), by their
        config key."""
        found = {"judge.constrained": self.judge}
        if self.scorer.backend == "openai":
            if self.scorer.endpoint is not None:
                found["scorer.endpoint.constrained"] = self.scorer.endpoint
            for i, ep in enumerate(self.scorer.endpoints or []):
                found[f"scorer.endpoints[{i}].constrained"] = ep
        return {key: ep for key, ep in found.items() if ep.constrained}

    def constrained_roles(self) -> list[str]:
        """``judge`` and/or ``scorer``: the roles whose answers are constrained (what run.json records)."""
        return sorted({key.split(".")[0] for key in self.constrained_endpoints()})

    def _check_constrained(self) -> None:
        """Constrained answers: never in reference mode, all of a scorer pool or none, and token limits
        that leave room for the answer format (:mod:`keyshot.infer.protocol.answer_format`)."""
        constrained = self.constrained_endpoints()
        if constrained and self.pipeline.parse_mode == "reference":
            raise ValueError(
                f"{next(iter(constrained))}=true with pipeline.parse_mode=reference: reference mode sends the "
                "reference's requests unchanged; set it to false or use parse_mode=strict"
            )
        pool = [ep.constrained for ep in self.scorer.endpoints or []]
        if self.scorer.backend == "openai" and any(pool) and not all(pool):
            raise ValueError(
                "scorer.endpoints[].constrained: set it on every endpoint of the pool or on none"
            )
        variant, pipe = self.pipeline.prompt_variant, self.pipeline
        limits = []  # (setting, its value, step)
        if self.judge.constrained:
            for step in ("key_points", "outcome"):
                override = getattr(pipe, f"{step}_max_tokens")
                value = self.judge.max_tokens if override is None else override
                limits.append((judge_step_limit(step, override), value, step))
            if self.scorer.judge_scores:
                limits.append((JUDGE_LIMIT, self.judge.max_tokens, "key_screenshot"))
        for key, ep in constrained.items():
            if key.startswith("scorer"):
                limit = self.scorer.max_tokens
                setting = scorer_limit(limit, key.replace("constrained", "max_tokens"))
                limits.append((setting, ep.max_tokens if limit is None else limit, "key_screenshot"))
        for setting, value, step in limits:
            least = answer_format(variant, step).min_tokens()
            if value < least:
                raise ValueError(
                    f"{setting}={value} leaves no room for a constrained {step} answer: set it to {least} or more"
                )


class JudgeRunError(KeyshotError):
    """A run that cannot start (bad config, no trajectories, unreadable files, another protocol)."""
