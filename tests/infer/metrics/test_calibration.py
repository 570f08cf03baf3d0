"""p_success as a probability: a labelled run whose calibration and best threshold are known by construction
(keyshot.infer.metrics.calibration), figures checked to the last digit."""

from __future__ import annotations

import itertools
from fractions import Fraction

from keyshot.infer.loaders.trajectory import FAILURE, SUCCESS, UNSURE
from keyshot.infer.metrics.calibration import (
    LABEL_NOT_JUDGED,
    NO_LABEL,
    NO_P_SUCCESS,
    TEST,
    TUNE,
    UNSURE_LABEL,
    compute_calibration,
    split_of,
)
from keyshot.infer.metrics.compute import NO_READABLE_SCORES, JudgedRecord, labels_not_judged

_ids = (f"task-{i}" for i in itertools.count())


def _task(split: str) -> str:
    """The next task id the stable split puts on ``split``."""
    return next(t for t in _ids if split_of(t) == split)


def _rec(p: float | None, truth: bool | None, split: str = TUNE, **kw) -> JudgedRecord:
    human = None if truth is None else (SUCCESS if truth else FAILURE)
    return JudgedRecord(
        _task(split), "agent-a", "bench", p is not None and p >= 0.5, human, "human labels", p_success=p, **kw
    )


def test_split_is_stable():
    # the split is part of what a reported threshold means: it must not move between versions
    assert [split_of(f"t{i}") for i in range(6)] == [split_of(f"t{i}") for i in range(6)]
    assert {split_of(f"t{i}") for i in range(40)} == {TUNE, TEST}
    assert split_of("webarena.344") != split_of("webarena.344", seed="1") or split_of(
        "webarena.427"
    ) != split_of("webarena.427", seed="1")


def test_reliability_ece_brier_by_construction():
    records = (
        [_rec(0.1, i < 1) for i in range(10)]  # bin [0.1, 0.2): 1 of 10 succeeded, exactly calibrated
        + [_rec(0.45, i < 3) for i in range(10)]  # bin [0.4, 0.5): 3 of 10, gap 0.15
        + [_rec(0.8, i < 12) for i in range(20)]  # bin [0.8, 0.9): 12 of 20, gap 0.2
    )
    cal = compute_calibration(records)
    assert cal.n_records == cal.n_used == 40 and cal.counts == {}
    filled = [(b.low, b.n, b.mean_p, b.success_rate) for b in cal.bins if b.n]
    assert filled == [(0.1, 10, 0.1, 0.1), (0.4, 10, 0.45, 0.3), (0.8, 20, 0.8, 0.6)]
    assert sum(b.n for b in cal.bins) == 40 and len(cal.bins) == 10
    # ECE = 10/40 * 0 + 10/40 * 0.15 + 20/40 * 0.2 = 0.1375
    assert round(cal.ece, 15) == 0.1375
    # Brier = (0.81 + 9*0.01 + 3*0.3025 + 7*0.2025 + 12*0.04 + 8*0.64) / 40 = 8.825 / 40
    exact = (
        Fraction(81, 100)
        + 9 * Fraction(1, 100)
        + 3 * Fraction(3025, 10000)
        + 7 * Fraction(2025, 10000)
        + 12 * Fraction(4, 100)
        + 8 * Fraction(64, 100)
    ) / 40
    assert exact == Fraction(220625, 1000000)
    assert round(cal.brier, 15) == 0.220625
    # the PR curve: one point per distinct p, descending; at 0.8 precision 12/20, recall 12/16
    assert [pt.threshold for pt in cal.pr_curve] == [0.8, 0.45, 0.1]
    top = cal.pr_curve[0]
    assert (top.precision, top.recall) == (0.6, 0.75)
    assert cal.pr_curve[-1].recall == 1.0 and cal.pr_curve[-1].precision == 16 / 40


def test_p_one_falls_in_the_last_bin_and_a_perfect_judge_scores_zero():
    cal = compute_calibration([_rec(1.0, True), _rec(0.0, False)])
    assert cal.bins[-1].n == 1 and cal.bins[0].n == 1
    assert cal.ece == 0.0 and cal.brier == 0.0


_TUNE = [(0.1, False), (0.2, False), (0.3, True), (0.4, False), (0.6, True), (0.7, True), (0.9, False)]
_TEST = [(0.35, True), (0.5, False), (0.65, True), (0.95, False), (0.25, False)]


def _split_run(flip_test: bool = False) -> list[JudgedRecord]:
    return [_rec(p, y, TUNE) for p, y in _TUNE] + [_rec(p, y != flip_test, TEST) for p, y in _TEST]


def test_threshold_chosen_on_tune_reported_on_test_agreement():
    op = compute_calibration(_split_run(), objective="agreement").operating_point
    assert (op.n_tune, op.n_test) == (7, 5)
    # on tune, 0.3 and 0.6 both agree on 5 of 7; 0.6 is nearer 0.5
    assert op.threshold == 0.6 and op.tune.agreement == 5 / 7
    # on test at 0.6: 0.5 F ok, 0.65 T ok, 0.25 F ok, 0.35 missed, 0.95 false success
    t = op.test
    assert (t.n, t.agreement, t.precision, t.recall, t.f1) == (5, 0.6, 0.5, 0.5, 0.5)
    d = op.test_default  # 0.5 on the same test records: TP 1, FP 2, FN 1, TN 1
    assert (d.threshold, d.agreement, d.precision, d.recall) == (0.5, 0.4, 1 / 3, 0.5)
    assert round(d.f1, 15) == 0.4


def test_threshold_chosen_for_f1():
    op = compute_calibration(_split_run(), objective="f1").operating_point
    # on tune at 0.3: TP 3, FP 2, FN 0 -> F1 0.75 (0.6 gives 2/3)
    assert op.threshold == 0.3 and op.tune.f1 == 0.75
    t = op.test  # 0.35, 0.5, 0.65, 0.95 called success: TP 2, FP 2, TN 1
    assert (t.agreement, t.precision, t.recall) == (0.6, 0.5, 1.0)
    assert round(t.f1, 15) == round(2 / 3, 15)


def test_the_threshold_never_sees_the_test_labels():
    kept = compute_calibration(_split_run(), objective="agreement").operating_point
    flipped = compute_calibration(_split_run(flip_test=True), objective="agreement").operating_point
    assert flipped.threshold == kept.threshold == 0.6
    assert flipped.tune == kept.tune
    assert flipped.test.agreement == 1 - kept.test.agreement


def test_every_input_is_counted():
    records = [
        _rec(0.9, True),
        _rec(0.2, False),
        _rec(None, True),  # a verdict without p_success
        _rec(None, False),
        _rec(0.7, None),  # a trajectory without a label
        JudgedRecord(_task(TUNE), "agent-a", "bench", True, UNSURE, "human labels", p_success=0.8),
        JudgedRecord(_task(TUNE), "agent-a", "bench", None, SUCCESS, "human labels", NO_READABLE_SCORES),
    ]
    labels = {(r.task_id, "agent-a"): r.human for r in records if r.human}
    labels[("never-judged", "agent-a")] = SUCCESS
    labels[("never-judged-2", "")] = FAILURE
    labels[("t-other", "agent-b")] = SUCCESS
    assert labels_not_judged(records, labels) == (2, 1)
    cal = compute_calibration(records, labels_not_judged=2)
    assert cal.n_used == 2
    assert cal.counts == {
        LABEL_NOT_JUDGED: 2,
        NO_P_SUCCESS: 2,
        NO_READABLE_SCORES: 1,
        NO_LABEL: 1,
        UNSURE_LABEL: 1,
    }
    assert cal.n_used + sum(v for k, v in cal.counts.items() if k != LABEL_NOT_JUDGED) == len(records)
