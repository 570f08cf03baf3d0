"""The protocol record: what decides a judge's verdicts, built by one function from what is sent.

``keyshot judge`` records it in ``OUT/run.json`` from its config before any call
(:func:`keyshot.infer.judge.fingerprint.protocol_fingerprint`), every verdict carries it from the live judge
and scorer (:meth:`keyshot.infer.judge.pipeline.WebJudge.describe`), and a sweep's δ folder records it for
the judge the sweep asked (:mod:`keyshot.infer.judge.threshold_sweep`): all of them call
:func:`protocol_record`, so a folder's record and its verdicts' cannot say two things.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from keyshot.infer.client.endpoint import EndpointConfig
from keyshot.infer.protocol.images import ImagePolicy
from keyshot.infer.protocol.prompts import load_prompt_set, load_step_prompts
from keyshot.infer.runs.run_record import CONSTRAINED, with_constrained

#: ``scorer.backend`` when the judge scores every screenshot itself (the reference configuration).
JUDGE_SCORES_BACKEND = "none"


class PipelineSettings(Protocol):
    """What the record reads of a :class:`~keyshot.infer.judge.pipeline.PipelineConfig` (named here, not
    imported: the pipeline builds its verdicts' record with this module)."""

    prompt_variant: str
    outcome_mode: str
    parse_mode: str
    threshold: float
    threshold_on: str
    max_kept: int
    outcome_images: str
    allow_partial: bool
    p_success_threshold: float | None
    step_rewards: bool


@dataclass(frozen=True)
class ScorerFacts:
    """What the record says of the scorer: its back-end in a config's words (``openai``, ``transformers``,
    or ``none`` when the judge scores), the model it names (its checkpoint, else the served model; None when
    the judge scores), the checkpoint's hash, and whether its answers are constrained."""

    backend: str
    model: str | None = None
    checkpoint_hash: str | None = None
    constrained: bool = False

    @classmethod
    def recorded(cls, protocol: dict) -> ScorerFacts:
        """The scorer a recorded protocol names (a judged folder's ``run.json``)."""
        return cls(
            protocol.get("scorer_backend"),
            protocol.get("scorer_model"),
            protocol.get("scorer_checkpoint_hash"),
            "scorer" in (protocol.get(CONSTRAINED) or []),
        )


def protocol_record(
    pipeline: PipelineSettings,
    judge: EndpointConfig,
    scorer: ScorerFacts,
    policy: ImagePolicy | dict | None,
) -> dict:
    """The protocol of verdicts judged under ``pipeline`` by ``judge`` with ``scorer``'s scores of
    screenshots seen under ``policy`` (None: unknown, as for released records)."""
    record = {
        "prompt_version": load_prompt_set(pipeline.prompt_variant).version,
        "prompt_variant": pipeline.prompt_variant,
        "outcome_mode": pipeline.outcome_mode,
        "parse_mode": pipeline.parse_mode,
        "threshold": pipeline.threshold,
        "threshold_on": pipeline.threshold_on,
        "max_kept": pipeline.max_kept,
        "outcome_images": pipeline.outcome_images,
        "allow_partial": pipeline.allow_partial,
        "judge_model": judge.model,
        "judge_max_tokens": judge.max_tokens,
        "judge_temperature": judge.temperature,
        "judge_seed": judge.seed,
        "scorer_backend": scorer.backend,
        "scorer_model": scorer.model,
        "scorer_checkpoint_hash": scorer.checkpoint_hash,
        "image_policy": policy.to_dict() if isinstance(policy, ImagePolicy) else policy,
        # the operating point on p_success (docs/operating-point.md), recorded only when set
        **(
            {"p_success_threshold": pipeline.p_success_threshold}
            if pipeline.p_success_threshold is not None
            else {}
        ),
        # the step question (when each key point was first met), recorded only when asked
        **(
            {"step_rewards": True, "step_prompt_version": load_step_prompts().version}
            if pipeline.step_rewards
            else {}
        ),
    }
    roles = [role for role, on in (("judge", judge.constrained), ("scorer", scorer.constrained)) if on]
    return with_constrained(record, roles)
