"""A ``keyshot judge`` run's configuration (judge, scorer, pipeline, run); the scorer it describes is
built by :mod:`keyshot.infer.judge.scorer_factory`."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.client.pool import DEFAULT_COOLDOWN_S, member_configs
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.judge.pipeline import PipelineConfig
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy
from keyshot.infer.serve.plan import ServeConfig

logger = logging.getLogger(__name__)


@dataclass
class ScorerConfig:
    """The key-screenshot scorer.

    ``backend``: ``openai`` (an OpenAI-compatible endpoint, e.g. ``keyshot serve``, or ``endpoints``:
    several replicas of it, each call to the least-loaded live one), ``transformers``
    (in-process, ``checkpoint`` is the model folder) or ``none`` (reference configuration: the judge
    scores every screenshot). ``checkpoint`` (a folder, or a hub id such as ``osunlp/WebJudge-7B``) also
    fixes the image policy (its training pixel bounds; ``min_pixels``/``max_pixels`` set beside it must
    equal them); without it, ``min_pixels``/``max_pixels`` do (one of them alone: keyshot's default for the
    other, said in one line), else keyshot's default policy. A checkpoint that records
    the answer length it was trained on also fixes the least answer limit (:func:`keyshot.infer.judge.scorer_factory.scorer_max_tokens`).
    """

    backend: Literal["openai", "transformers", "none"] = "openai"
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
    serve: ServeConfig | None = None  # settings for --serve-scorer

    def __post_init__(self) -> None:
        if self.endpoint is not None and self.endpoints:
            raise ValueError("set scorer.endpoint (one) or scorer.endpoints (a pool), not both")
        if self.endpoints:
            member_configs(self.endpoints)  # one model, no endpoint twice
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
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


@dataclass
class JudgeRunConfig:
    """One ``keyshot judge`` run (``configs/judge/*.yaml``)."""

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
    # rewards. keyshot judge accepts the section and ignores it; it changes no verdict.
    reward: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for all), got {self.limit}")


class JudgeRunError(KeyshotError):
    """A run that cannot start (bad config, no trajectories, unreadable files, another protocol)."""
