"""What decides a judge run's verdicts: the fingerprint recorded in ``OUT/run.json``."""

from __future__ import annotations

from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.scorer_factory import describe_scorer, scorer_policy
from keyshot.infer.model.checkpoint import CheckpointDescription
from keyshot.infer.protocol.images import DEFAULT_POLICY, REFERENCE_POLICY
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.runs.run_record import with_constrained


def protocol_fingerprint(cfg: JudgeRunConfig, checkpoint: CheckpointDescription | None = None) -> dict:
    """What decides a run's verdicts: a run folder keeps its verdicts only for this protocol.
    ``checkpoint``: the description of ``scorer.checkpoint`` its caller read (read here when not given)."""
    sc, pipe = cfg.scorer, cfg.pipeline
    if checkpoint is None and sc.backend != "none":
        checkpoint = describe_scorer(sc)
    if sc.backend == "none":
        policy, scorer_model = REFERENCE_POLICY, None
    else:
        policy = scorer_policy(sc, checkpoint) or DEFAULT_POLICY
        served = sc.endpoint or (sc.endpoints[0] if sc.endpoints else None)
        scorer_model = sc.checkpoint or (served.model if served else None)
    fingerprint = {
        "prompt_version": load_prompt_set(pipe.prompt_variant).version,
        "prompt_variant": pipe.prompt_variant,
        "outcome_mode": pipe.outcome_mode,
        "parse_mode": pipe.parse_mode,
        "threshold": pipe.threshold,
        "threshold_on": pipe.threshold_on,
        "max_kept": pipe.max_kept,
        "outcome_images": pipe.outcome_images,
        "allow_partial": pipe.allow_partial,
        "judge_model": cfg.judge.model,
        "judge_max_tokens": cfg.judge.max_tokens,
        "judge_temperature": cfg.judge.temperature,
        "judge_seed": cfg.judge.seed,
        "scorer_backend": sc.backend,
        "scorer_model": scorer_model,
        "scorer_checkpoint_hash": checkpoint.hash if checkpoint is not None else None,
        "image_policy": policy.to_dict(),
        # the operating point on p_success (docs/operating-point.md), recorded only when set
        **({"p_success_threshold": pipe.p_success_threshold} if pipe.p_success_threshold is not None else {}),
    }
    return with_constrained(fingerprint, cfg.constrained_roles())
