"""Teachers as config: OpenAI-compatible endpoints that label screenshots, and the judge that writes
the key points (``configs/teachers/*.yaml``).

A teacher is an :class:`keyshot.infer.client.judge_client.EndpointConfig` (URL, model, API key *environment variable*,
concurrency, retries, prices per million tokens, budget cap) plus what the cost estimate of
``keyshot synth run --dry-run`` has to assume about it: how many prompt tokens one screenshot costs
(``image_tokens``) and how long an answer is (``est_output_tokens``).

``image_tokens`` rules (applied to the image that is sent, i.e. after the run's image policy):

* ``qwen``: exact for Qwen2.5-VL on vLLM: one token per 28×28 px (:func:`keyshot.infer.protocol.images.visual_tokens`).
* ``openai_tiles``: GPT-4o / GPT-4.1 "high" detail: fit in 2048×2048, shortest side to 768, then
  85 + 170 per 512-px tile.
* ``openai_patches:M``: GPT-4.1-mini / -nano, o4-mini: 32-px patches, at most 1536, times the model's
  multiplier ``M`` (1.62 for GPT-4.1-mini, 2.46 for -nano, 1.72 for o4-mini).
* ``claude``: Anthropic: long side at most 1568 px and area at most 1.15 MP, then ``w·h/750``.
* an integer: that many tokens per image, whatever its size.

These are the providers' published formulas at the time of writing, an assumption of the estimate
only: real costs come from the ``usage`` the endpoints return.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.data_synth.errors import SynthError
from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.client.pool import EndpointPool, member_configs
from keyshot.infer.client.usage import (  # the image-token rules live with the prices
    CHARS_PER_TOKEN,
    UsageLedger,
    check_image_token_rule,
    image_token_count,
)
from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy


@dataclass
class TeacherConfig:
    """One teacher. ``replicas``: more base URLs serving the same model (a self-hosted teacher on several
    nodes); calls then go to the least-loaded live one (:class:`keyshot.infer.client.pool.EndpointPool`)."""

    endpoint: EndpointConfig
    image_tokens: str = "qwen"
    est_output_tokens: int = 250
    chars_per_token: float = CHARS_PER_TOKEN
    replicas: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_image_token_rule(self.image_tokens, self.name)
        if self.replicas:
            member_configs(self.endpoints())  # one model, no URL twice, no budget
        if self.est_output_tokens < 0 or self.chars_per_token <= 0:
            raise ValueError(f"teacher {self.name!r}: est_output_tokens must be >= 0 and chars_per_token > 0")

    @property
    def name(self) -> str:
        return self.endpoint.name

    def endpoints(self) -> list[EndpointConfig]:
        """The endpoint and its replicas."""
        return [self.endpoint, *(dataclasses.replace(self.endpoint, base_url=url) for url in self.replicas)]

    def client(self, cache: CallCache | None, ledger: UsageLedger) -> JudgeClient | EndpointPool:
        """The client of this teacher: one endpoint's, or a pool over its replicas."""
        if self.replicas:
            return EndpointPool(self.endpoints(), cache, ledger)
        return JudgeClient(self.endpoint, cache, ledger)

    def image_token_count(self, width: int, height: int, policy: ImagePolicy = DEFAULT_POLICY) -> int:
        """Estimated prompt tokens of one ``width×height`` screenshot sent under ``policy``."""
        return image_token_count(self.image_tokens, width, height, policy)

    def text_token_count(self, text: str) -> int:
        return math.ceil(len(text) / self.chars_per_token)


@dataclass
class TeacherSet:
    """The judge that writes key points (and outcome verdicts) and the teachers that score screenshots."""

    key_points_judge: TeacherConfig
    teachers: list[TeacherConfig] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.teachers:
            raise ValueError("a teacher set needs at least one teacher")
        names = [t.name for t in self.teachers]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"teacher names must be unique (set endpoint.name): {dupes} appear twice")
        if self.key_points_judge.name in names:
            raise ValueError(
                f"the key-point judge and a teacher are both named {self.key_points_judge.name!r}: give the judge "
                "its own endpoint.name (usage and budgets are kept per name)"
            )

    def names(self) -> list[str]:
        return [t.name for t in self.teachers]

    def with_budgets(self, budget: Callable[[TeacherConfig, float], float]) -> TeacherSet:
        """The same set with each ``budget_usd`` replaced by ``budget(teacher, its budget)`` (no budget stays none)."""

        def one(t: TeacherConfig) -> TeacherConfig:
            if t.endpoint.budget_usd is None:
                return t
            new = budget(t, t.endpoint.budget_usd)
            return dataclasses.replace(t, endpoint=dataclasses.replace(t.endpoint, budget_usd=new))

        return TeacherSet(one(self.key_points_judge), [one(t) for t in self.teachers])


def load_teacher_set(path: str | os.PathLike, overrides: list[str] | None = None) -> TeacherSet:
    """Read a teacher-set YAML; errors name the file and the bad key."""
    try:
        return load_config(TeacherSet, Path(path), overrides)
    except (ConfigError, ValueError) as exc:
        raise SynthError(f"teacher set {path}: {exc}") from None


def remaining_budgets(teachers: TeacherSet, spent: dict[str, dict[str, float]]) -> TeacherSet:
    """The teacher set with each ``budget_usd`` reduced by what earlier sessions of the run spent, so a
    budget caps a run folder's total spending however often it is resumed."""
    return teachers.with_budgets(
        lambda t, budget: max(0.0, budget - spent.get(t.name, {}).get("cost_usd", 0.0))
    )


def shard_budgets(teachers: TeacherSet, count: int) -> TeacherSet:
    """Each ``budget_usd`` split evenly over ``count`` shards: N shards together spend what one run may."""
    return teachers.with_budgets(lambda t, budget: budget / count)
