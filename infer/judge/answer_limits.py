"""Which setting limits an answer's tokens, the one rule: the config's checks name it when a limit leaves no
room for a constrained answer (:mod:`keyshot.infer.judge.config`), and a cut answer is counted and named
under it (:mod:`keyshot.infer.judge.pipeline`, the scorers' ``max_tokens_setting``)."""

from __future__ import annotations

#: The judge's own limit, for every judge step that sets none of its own (and for the judge as scorer).
JUDGE_LIMIT = "judge.max_tokens"
#: The scorer's limit over its endpoints' own.
SCORER_LIMIT = "scorer.max_tokens"


def judge_step_limit(step: str, override: int | None) -> str:
    """The setting that limits a judge step's answers (``key_points`` or ``outcome``):
    ``pipeline.<step>_max_tokens`` when set (``override``), else ``judge.max_tokens``."""
    return f"pipeline.{step}_max_tokens" if override is not None else JUDGE_LIMIT


def scorer_limit(scorer_max_tokens: int | None, endpoint_setting: str) -> str:
    """The setting that limits the scorer's answers: ``scorer.max_tokens`` when set, else its endpoint's
    (``endpoint_setting``: ``scorer.endpoint.max_tokens``, or a pool member's)."""
    return SCORER_LIMIT if scorer_max_tokens is not None else endpoint_setting
