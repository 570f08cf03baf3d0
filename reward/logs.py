"""The log fields every adapter reports, built in one place.

Trainers average what they are given: OpenRLHF turns each per-sample ``extra_logs`` value into a tensor and
means it over the batch, TRL gathers ``log_metric`` values across ranks (a key missing on one rank can hang
the gather). So every field here is a plain float, for every sample and every call, with the same keys:
a value that a sample does not have (no progress, no P(success)) is 0.0 with a ``has_`` field saying so,
never None, NaN or a sentinel such as -1 that a mean would take for a measurement.
"""

from __future__ import annotations

import logging
import statistics
from collections import Counter
from collections.abc import Hashable, Sequence

from keyshot.reward.model import RewardResult

logger = logging.getLogger(__name__)

#: The per-sample fields of :func:`sample_logs`, in order.
SAMPLE_KEYS = (
    "keyshot_failed",
    "keyshot_success",
    "keyshot_judge_calls",
    "keyshot_scorer_calls",
    "keyshot_progress",
    "keyshot_has_progress",
    "keyshot_p_success",
    "keyshot_has_p_success",
)


def paid_calls(result: RewardResult, role: str) -> float:
    """Calls of ``role`` ('judge' or 'scorer') this result sent to an endpoint: ``RewardResult.paid_calls``,
    the ``sent`` of :func:`keyshot.infer.runs.counts.call_split` (cache hits and identical screenshots
    scored once excluded)."""
    return float(result.paid_calls.get(role, 0))


def sample_logs(results: Sequence[RewardResult]) -> dict[str, list[float]]:
    """Per-sample fields (:data:`SAMPLE_KEYS`): ``keyshot_failed`` is 1.0 for a rollout given no verdict
    (whatever ``on_failure`` made its reward), ``keyshot_success`` 1.0 for a success verdict."""
    rows = [
        (
            float(r.failed),
            float(bool(r.success) and not r.failed),
            paid_calls(r, "judge"),
            paid_calls(r, "scorer"),
            r.progress if r.progress is not None else 0.0,
            float(r.progress is not None),
            r.p_success if r.p_success is not None else 0.0,
            float(r.p_success is not None),
        )
        for r in results
    ]
    return {key: [float(row[i]) for row in rows] for i, key in enumerate(SAMPLE_KEYS)}


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def batch_metrics(results: Sequence[RewardResult]) -> dict[str, float]:
    """One value per key for a batch (every key always present): the failed and success fractions, paid
    judge and scorer calls per rollout, and progress and P(success) averaged over the rollouts that have
    one (0.0 when none has; ``_n`` says how many)."""
    progress = [r.progress for r in results if r.progress is not None]
    p_success = [r.p_success for r in results if r.p_success is not None]
    return {
        "keyshot/failed": _mean([float(r.failed) for r in results]),
        "keyshot/success": _mean([float(bool(r.success) and not r.failed) for r in results]),
        "keyshot/judge_calls": _mean([paid_calls(r, "judge") for r in results]),
        "keyshot/scorer_calls": _mean([paid_calls(r, "scorer") for r in results]),
        "keyshot/progress": _mean(progress),
        "keyshot/progress_n": float(len(progress)),
        "keyshot/p_success": _mean(p_success),
        "keyshot/p_success_n": float(len(p_success)),
    }


_warned: set[str] = set()


def warn_constant_groups(
    rollout_keys: Sequence[Hashable], group_keys: Sequence[Hashable], where: str, fix: str
) -> bool:
    """Warn once per ``where`` when every group of more than one sample scores one identical rollout.

    GRPO-style trainers compare the samples of a prompt: when each prompt's samples are scored on the same
    recorded rollout (a dataset column, not the sample's own episode), every group gets equal rewards and a
    zero advantage, and nothing else says so. Returns whether the batch has that shape.
    """
    groups: dict[Hashable, set[Hashable]] = {}
    for group, rollout in zip(group_keys, rollout_keys, strict=True):
        groups.setdefault(group, set()).add(rollout)
    sizes = Counter(group_keys)
    multi = [g for g in groups if sizes[g] > 1]
    constant = bool(multi) and all(len(groups[g]) == 1 for g in multi)
    if constant and where not in _warned:
        _warned.add(where)
        logger.warning(
            "%s: every sample of a prompt is scored on the same rollout, so a group's rewards are equal and "
            "its advantage is zero (the judge does not read the completion's final answer). %s",
            where,
            fix,
        )
    return constant
