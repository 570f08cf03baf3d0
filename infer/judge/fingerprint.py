"""What decides a judge run's verdicts: the fingerprint recorded in ``OUT/run.json``, read from the run's
config before any call (built by :func:`keyshot.infer.judge.protocol_record.protocol_record`, as every
verdict's record is)."""

from __future__ import annotations

from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.protocol_record import protocol_record
from keyshot.infer.judge.scorer_factory import describe_scorer, scorer_facts
from keyshot.infer.model.checkpoint import CheckpointDescription


def protocol_fingerprint(cfg: JudgeRunConfig, checkpoint: CheckpointDescription | None = None) -> dict:
    """What decides a run's verdicts: a run folder keeps its verdicts only for this protocol.
    ``checkpoint``: the description of ``scorer.checkpoint`` its caller read (read here when not given)."""
    if checkpoint is None and not cfg.scorer.judge_scores:
        checkpoint = describe_scorer(cfg.scorer)
    facts, policy = scorer_facts(cfg, checkpoint)
    return protocol_record(cfg.pipeline, cfg.judge, facts, policy)
