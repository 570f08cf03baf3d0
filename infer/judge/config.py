"""A ``keyshot judge`` run's configuration (judge, scorer, pipeline, run); the scorer it describes is
built by :mod:`keyshot.infer.judge.scorer_factory`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.client.pool import DEFAULT_COOLDOWN_S, member_configs
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.judge.pipeline import PipelineConfig
from keyshot.infer.serve.plan import ServeConfig


@dataclass
class ScorerConfig:
    """The key-screenshot scorer.

    ``backend``: ``openai`` (an OpenAI-compatible endpoint, e.g. ``keyshot serve``, or ``endpoints``:
    several replicas of it, each call to the least-loaded live one), ``transformers``
    (in-process, ``checkpoint`` is the model folder) or ``none`` (reference configuration: the judge
    scores every screenshot). ``checkpoint`` also fixes the image policy (its training pixel bounds);
    without it, ``min_pixels``/``max_pixels`` do, else keyshot's default policy. A checkpoint that records
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

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or null for all), got {self.limit}")


class JudgeRunError(KeyshotError):
    """A run that cannot start (bad config, no trajectories, unreadable files, another protocol)."""
