"""p_success read as a probability: its calibration against the truth, its precision-recall curve, and the
p_success threshold chosen on one split of the trajectories and reported on the other.

Works on :class:`~keyshot.infer.metrics.compute.JudgedRecord` rows (``p_success`` from the outcome call's
log-probabilities, :attr:`keyshot.infer.protocol.verdicts.Verdict.p_success`) and the truth of each
(:func:`~keyshot.infer.metrics.compute.human_outcome`). Every record is accounted for
(:attr:`Calibration.counts`): a verdict without p_success, a trajectory without a label, an "Unsure" label,
a verdict withheld for want of evidence are each counted and left out of every rate, never folded into one.

* Reliability: ``n_bins`` equal-width bins over [0, 1] (p = 1 falls in the last); per bin the number of
  records, their mean p_success and the share that succeeded (sums are exact: ``math.fsum``). ECE = Σ_b (n_b / N) · |mean p_b − share_b|;
  Brier = mean (p − y)² with y = 1 for a success.
* PR curve: one point per distinct p_success t (descending): precision and recall of "success iff p ≥ t".
* Operating point: the trajectories are split by a stable hash of their task id (the same task by several
  agents stays on one side, :func:`split_of`) into ``tune`` and ``test``. The threshold maximising the
  objective (agreement or F1) on ``tune`` is chosen among the tune records' own p values (and 1.0); ties go to
  the threshold nearest 0.5, then the lower one. It is reported on ``test``, never on the labels it was
  chosen on, beside the default 0.5 on the same test records.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from keyshot.infer.metrics.compute import JudgedRecord, labelled_pairs
from keyshot.infer.metrics.config import DEFAULTS, OBJECTIVES

TUNE, TEST = "tune", "test"
DEFAULT_P_THRESHOLD = 0.5

#: What each left-out record is counted as (:attr:`Calibration.counts`).
NO_P_SUCCESS = "verdict without p_success"
NO_LABEL = "trajectory without a label"
UNSURE_LABEL = "label Unsure"
NOT_EXECUTABLE_LABEL = "label not executable (--label-2 drop)"
LABEL_NOT_JUDGED = "label for a trajectory not judged"
#: labelled_pairs' reasons, as the calibration's tables name them
_WHY_NO_TRUTH = {
    "no_human_label": NO_LABEL,
    "other": NO_LABEL,
    "unsure": UNSURE_LABEL,
    "not_executable": NOT_EXECUTABLE_LABEL,
}


@dataclass
class ReliabilityBin:
    low: float
    high: float
    n: int
    mean_p: float | None
    success_rate: float | None


@dataclass
class PRPoint:
    threshold: float
    precision: float | None
    recall: float | None
    f1: float | None
    agreement: float


@dataclass
class ThresholdScore:
    """ "success iff p_success ≥ threshold" on one split's records."""

    threshold: float
    n: int
    agreement: float | None
    precision: float | None
    recall: float | None
    f1: float | None


@dataclass
class OperatingPoint:
    objective: str
    split_seed: str
    n_tune: int
    n_test: int
    threshold: float | None  # None when the tune split has no record
    tune: ThresholdScore | None
    test: ThresholdScore | None  # the chosen threshold on the test split
    test_default: ThresholdScore | None  # DEFAULT_P_THRESHOLD on the same test records


@dataclass
class Calibration:
    n_records: int
    n_used: int
    counts: dict[str, int]
    bins: list[ReliabilityBin]
    ece: float | None
    brier: float | None
    pr_curve: list[PRPoint]
    operating_point: OperatingPoint | None = None
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- the pairs
def probability_pairs(
    records: Iterable[JudgedRecord], label_2: str = DEFAULTS.label_2
) -> tuple[list[tuple[JudgedRecord, float, bool]], Counter]:
    """(record, p_success, truth) of every record that has both; the others counted by why not."""
    pairs, dropped = labelled_pairs(records, label_2)
    left = Counter({_WHY_NO_TRUTH.get(why, why): n for why, n in dropped.items()})
    used: list[tuple[JudgedRecord, float, bool]] = []
    for r, truth in pairs:
        if r.p_success is None:
            left[NO_P_SUCCESS] += 1
            continue
        used.append((r, float(r.p_success), truth))
    return used, left


# ---------------------------------------------------------------------------- reliability
def reliability(pairs: Sequence[tuple[float, bool]], n_bins: int = DEFAULTS.n_bins) -> list[ReliabilityBin]:
    if n_bins < 1:
        raise ValueError(f"n_bins must be >= 1, got {n_bins}")
    members: list[list[tuple[float, bool]]] = [[] for _ in range(n_bins)]
    for p, y in pairs:
        members[min(int(p * n_bins), n_bins - 1)].append((p, y))
    out = []
    for b, inside in enumerate(members):
        n = len(inside)
        out.append(
            ReliabilityBin(
                low=b / n_bins,
                high=(b + 1) / n_bins,
                n=n,
                mean_p=math.fsum(p for p, _ in inside) / n if n else None,
                success_rate=sum(y for _, y in inside) / n if n else None,
            )
        )
    return out


def expected_calibration_error(bins: Sequence[ReliabilityBin]) -> float | None:
    total = sum(b.n for b in bins)
    if not total:
        return None
    return math.fsum(b.n / total * abs(b.mean_p - b.success_rate) for b in bins if b.n)


def brier_score(pairs: Sequence[tuple[float, bool]]) -> float | None:
    if not pairs:
        return None
    return math.fsum((p - float(y)) ** 2 for p, y in pairs) / len(pairs)


# ---------------------------------------------------------------------------- thresholds
def score_threshold(pairs: Sequence[tuple[float, bool]], threshold: float) -> ThresholdScore:
    """Agreement, precision, recall and F1 of "success iff p ≥ threshold"."""
    tp = fp = fn = tn = 0
    for p, y in pairs:
        pred = p >= threshold
        tp += pred and y
        fp += pred and not y
        fn += (not pred) and y
        tn += (not pred) and not y
    n = len(pairs)
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    f1 = None if precision is None or recall is None else 2 * tp / (2 * tp + fp + fn)  # one rounding
    return ThresholdScore(threshold, n, (tp + tn) / n if n else None, precision, recall, f1)


def pr_curve(pairs: Sequence[tuple[float, bool]]) -> list[PRPoint]:
    out = []
    for t in sorted({p for p, _ in pairs}, reverse=True):
        s = score_threshold(pairs, t)
        out.append(PRPoint(t, s.precision, s.recall, s.f1, s.agreement or 0.0))
    return out


def best_threshold(
    pairs: Sequence[tuple[float, bool]], objective: str = DEFAULTS.objective
) -> ThresholdScore | None:
    """The threshold among the pairs' own p values (and 1.0: no success at all) that maximises
    ``objective`` on them (ties: nearest 0.5, then the lower); None without pairs."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    best: ThresholdScore | None = None
    best_key: tuple | None = None
    candidates = {p for p, _ in pairs}
    if candidates and max(candidates) < 1.0:
        candidates.add(1.0)  # no success at all is a threshold too
    for t in sorted(candidates):
        s = score_threshold(pairs, t)
        value = getattr(s, objective)
        key = (-1.0 if value is None else value, -abs(t - DEFAULT_P_THRESHOLD), -t)
        if best_key is None or key > best_key:
            best, best_key = s, key
    return best


def split_of(task_id: str, seed: str = DEFAULTS.split_seed) -> str:
    """``tune`` or ``test``: a stable hash of the task id (and the seed), half and half on average."""
    digest = hashlib.sha256(f"{seed}\0{task_id}".encode()).digest()
    return TUNE if digest[0] % 2 == 0 else TEST


def operating_point(
    triples: Sequence[tuple[JudgedRecord, float, bool]],
    objective: str = DEFAULTS.objective,
    seed: str = DEFAULTS.split_seed,
) -> OperatingPoint:
    """The threshold chosen on the ``tune`` split, scored on ``test`` (see the module docstring)."""
    tune = [(p, y) for r, p, y in triples if split_of(r.task_id, seed) == TUNE]
    test = [(p, y) for r, p, y in triples if split_of(r.task_id, seed) == TEST]
    chosen = best_threshold(tune, objective)
    return OperatingPoint(
        objective=objective,
        split_seed=seed,
        n_tune=len(tune),
        n_test=len(test),
        threshold=chosen.threshold if chosen else None,
        tune=chosen,
        test=score_threshold(test, chosen.threshold) if chosen and test else None,
        test_default=score_threshold(test, DEFAULT_P_THRESHOLD) if test else None,
    )


def compute_calibration(
    records: Sequence[JudgedRecord],
    *,
    label_2: str = DEFAULTS.label_2,
    n_bins: int = DEFAULTS.n_bins,
    objective: str = DEFAULTS.objective,
    seed: str = DEFAULTS.split_seed,
    labels_not_judged: int = 0,
) -> Calibration:
    """Everything above for one set of records; ``labels_not_judged`` counts labels no verdict met."""
    records = list(records)
    triples, left = probability_pairs(records, label_2)
    pairs = [(p, y) for _, p, y in triples]
    counts = dict(sorted(left.items()))
    if labels_not_judged:
        counts[LABEL_NOT_JUDGED] = labels_not_judged
    bins = reliability(pairs, n_bins)
    return Calibration(
        n_records=len(records),
        n_used=len(pairs),
        counts=counts,
        bins=bins,
        ece=expected_calibration_error(bins),
        brier=brier_score(pairs),
        pr_curve=pr_curve(pairs),
        operating_point=operating_point(triples, objective, seed) if triples else None,
    )
