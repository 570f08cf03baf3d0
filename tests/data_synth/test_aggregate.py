"""Aggregation of teacher labels (consensus, filters, target choice, class balance) and agreement stats."""

from __future__ import annotations

import math

import pytest

from keyshot.data_synth.aggregate import (
    AggregationConfig,
    BalanceConfig,
    aggregate,
    consensus_score,
    outcome_matches,
)
from keyshot.data_synth.agreement import cohen_kappa, pairwise_agreement, spearman
from keyshot.data_synth.labels import (
    LabelRecord,
    LabelStore,
    OutcomeRecord,
    StoreContents,
    TrajectoryRecord,
    read_store,
)


def _label(uid: str, step: int, teacher: str, score: int | None, thought: str = "seen") -> LabelRecord:
    return LabelRecord(
        uid=uid,
        step=step,
        teacher=teacher,
        score=score,
        valid=score is not None,
        error=None if score is not None else "unparseable answer: no score",
        text=f"**Reasoning**: {thought}\n\n**Score**: {score}",
        thought=thought,
        model=f"m-{teacher}",
    )


def _store(
    scores: dict[tuple[str, int], dict[str, int | None]], agents: dict[str, str] | None = None
) -> StoreContents:
    contents = StoreContents()
    uids = sorted({uid for uid, _ in scores})
    for uid in uids:
        steps = 1 + max(step for u, step in scores if u == uid)
        contents.add(
            TrajectoryRecord(
                uid=uid,
                task_id=uid,
                task=f"task {uid}",
                screenshots=[f"/img/{uid}/{i}.png" for i in range(steps)],
                agent=(agents or {}).get(uid, "A"),
            )
        )
    for (uid, step), by_teacher in scores.items():
        for teacher, score in by_teacher.items():
            contents.add(_label(uid, step, teacher, score, thought=f"{teacher} on {uid}:{step}"))
    return contents


def _train(_traj):
    return "train"


@pytest.mark.parametrize(
    ("scores", "method", "priority", "want"),
    [
        ([1, 2], "median", None, 1),  # the lower middle value
        ([1, 3, 5], "median", None, 3),
        ([5, 1, 2, 4], "median", None, 2),
        ([1, 2], "mean", None, 2),  # 1.5 rounds half up
        ([1, 1, 2], "mean", None, 1),
        ([1, 1, 5], "majority", None, 1),
        ([1, 5], "majority", [5, 1], 5),  # a tie goes to the first teacher by priority
        ([1, 5], "majority", None, 1),
    ],
)
def test_consensus_methods(scores, method, priority, want):
    assert consensus_score(scores, method, priority) == want


def test_consensus_rejects_unknown_method_and_empty_input():
    with pytest.raises(ValueError, match="unknown consensus"):
        consensus_score([1], "mode")
    with pytest.raises(ValueError, match="no scores"):
        consensus_score([], "median")


def test_invalid_labels_are_dropped_and_min_teachers_applies():
    contents = _store(
        {("t", 0): {"a": 3, "b": None}, ("t", 1): {"a": None, "b": None}, ("t", 2): {"a": 4, "b": 4}}
    )
    rows, report = aggregate(contents, AggregationConfig(), _train)
    assert [(r.step, r.score) for r in rows] == [(0, 3), (2, 4)]
    assert report.dropped == {"no valid label": 1}
    assert report.teacher_labels == {"a": {"valid": 2, "invalid": 1}, "b": {"valid": 1, "invalid": 2}}
    rows, report = aggregate(contents, AggregationConfig(min_teachers=2), _train)
    assert [r.step for r in rows] == [2]
    assert report.dropped == {"no valid label": 1, "fewer than 2 valid labels": 1}


def test_disagreement_filter_and_target_priority():
    contents = _store({("t", 0): {"a": 1, "b": 5, "c": 3}, ("t", 1): {"a": 2, "b": 3, "c": 3}})
    rows, report = aggregate(
        contents, AggregationConfig(max_disagreement=2, teacher_priority=["c", "b"]), _train
    )
    assert [(r.step, r.score, r.target.teacher) for r in rows] == [(1, 3, "c")]
    assert report.dropped == {"teachers disagree by more than 2": 1}
    assert rows[0].answer == "**Reasoning**: c on t:1\n\n**Score**: 3"
    rows, _ = aggregate(contents, AggregationConfig(teacher_priority=["b"]), _train)
    assert [r.target.teacher for r in rows] == ["c", "b"]  # step 0: only c scored the median 3
    rows, _ = aggregate(contents, AggregationConfig(answer_format="raw", teacher_priority=["b"]), _train)
    assert rows[1].answer == rows[1].target.text


def test_mean_without_a_matching_teacher_drops_the_row():
    contents = _store({("t", 0): {"a": 1, "b": 4}})  # mean 2.5 -> 3, nobody said 3
    rows, report = aggregate(contents, AggregationConfig(consensus="mean"), _train)
    assert rows == [] and report.dropped == {"no teacher answer matches the consensus": 1}


def test_a_teacher_without_reasoning_is_not_a_target():
    contents = _store({("t", 0): {"a": 2, "b": 2}})
    contents.labels[("t", 0, "a")].thought = ""
    rows, _ = aggregate(contents, AggregationConfig(teacher_priority=["a", "b"]), _train)
    assert rows[0].target.teacher == "b"


def test_rows_without_pixels_or_split_are_dropped():
    contents = _store({("t", 0): {"a": 2}, ("t", 1): {"a": 3}, ("u", 0): {"a": 4}}, agents={"u": "other"})
    contents.trajectories["t"].screenshots[1] = None
    rows, report = aggregate(
        contents, AggregationConfig(), lambda traj: "train" if traj.agent == "A" else None
    )
    assert [(r.uid, r.step) for r in rows] == [("t", 0)]
    assert report.dropped == {"no pixels for the screenshot": 1, "agent in no split": 1}


def test_outcome_filter_uses_human_labels():
    contents = _store({("t", 0): {"a": 2, "b": 5}, ("u", 0): {"a": 1, "b": 1}, ("v", 0): {"a": 4, "b": 4}})
    contents.trajectories["t"].human_label = "success"
    contents.trajectories["u"].human_label = "not_executable"  # counts as not-success
    contents.trajectories["v"].human_label = None  # no label: not filtered
    for uid, teacher, success in [("t", "a", False), ("t", "b", True), ("u", "a", True), ("u", "b", False)]:
        contents.add(OutcomeRecord(uid, teacher, success, True))
    contents.add(OutcomeRecord("v", "a", False, True))
    rows, report = aggregate(contents, AggregationConfig(outcome_filter="per_teacher"), _train)
    got = {r.uid: (r.score, [lb.teacher for lb in r.labels]) for r in rows}
    assert got == {"t": (5, ["b"]), "u": (1, ["b"]), "v": (4, ["a", "b"])}
    rows, report = aggregate(contents, AggregationConfig(outcome_filter="all"), _train)
    assert [r.uid for r in rows] == ["v"]
    assert report.dropped == {"outcome disagreed with human label (trajectory)": 2}
    assert outcome_matches(True, "unsure") is None and outcome_matches(None, "success") is None


def test_class_balance_downsamples_score_1_in_train_only():
    scores = {(f"t{i}", 0): {"a": 1} for i in range(30)}
    scores.update({(f"s{i}", 0): {"a": 3} for i in range(5)})
    scores.update({(f"f{i}", 0): {"a": 5} for i in range(4)})
    agents = {f"t{i}": "X" if i < 20 else "Y" for i in range(30)}
    agents.update({f"s{i}": "X" for i in range(5)} | {f"f{i}": "X" for i in range(4)})
    contents = _store(scores, agents)

    def split(traj):
        return "train" if traj.agent == "X" else "test"

    cfg = AggregationConfig(balance=BalanceConfig(max_score1_ratio=2.0, per_class_cap={5: 3}, seed=1))
    rows, report = aggregate(contents, cfg, split)
    train = [r for r in rows if r.split == "train"]
    assert report.scores_before_balance["train"] == {1: 20, 2: 0, 3: 5, 4: 0, 5: 4}
    assert report.scores_after_balance["train"] == {1: 16, 2: 0, 3: 5, 4: 0, 5: 3}  # 2 x (5 + 3)
    assert report.scores_after_balance["test"] == {1: 10, 2: 0, 3: 0, 4: 0, 5: 0}  # untouched
    assert report.dropped == {"class balance (train, score 1)": 4, "class balance (train, score 5)": 1}
    assert len(train) == 24
    again, _ = aggregate(contents, cfg, split)
    assert [(r.uid, r.step) for r in again] == [(r.uid, r.step) for r in rows]  # seeded: stable
    other, _ = aggregate(
        contents, AggregationConfig(balance=BalanceConfig(max_score1_ratio=2.0, seed=2)), split
    )
    assert {r.uid for r in other if r.score == 1} != {r.uid for r in rows if r.score == 1}


def test_balance_config_checks_its_keys():
    assert BalanceConfig(per_class_cap={"1": 5}).per_class_cap == {1: 5}
    with pytest.raises(ValueError, match="score 1-5"):
        BalanceConfig(per_class_cap={"x": 5})
    with pytest.raises(ValueError, match="score 1-5"):
        BalanceConfig(per_class_cap={7: 5})


# ---------------------------------------------------------------------------- agreement
def test_cohen_kappa_known_values():
    assert cohen_kappa([1, 1, 2, 2], [1, 2, 2, 2]) == pytest.approx(0.5)
    # with two adjacent categories every disagreement weighs the same: weighting changes nothing
    assert cohen_kappa([1, 1, 2, 2], [1, 2, 2, 2], "linear") == pytest.approx(0.5)
    # a perfect inversion with uniform marginals: quadratic kappa -1
    assert cohen_kappa([1, 2, 3, 4, 5], [5, 4, 3, 2, 1], "quadratic") == pytest.approx(-1.0)
    assert cohen_kappa([3, 3, 3], [3, 3, 3]) == 1.0
    assert math.isnan(cohen_kappa([], []))
    # near misses cost less under weights: quadratic > linear > plain for off-by-one disagreement
    a, b = [1, 2, 3, 4, 5, 1, 2], [2, 3, 4, 5, 4, 1, 2]
    assert cohen_kappa(a, b, "quadratic") > cohen_kappa(a, b, "linear") > cohen_kappa(a, b)
    with pytest.raises(ValueError, match="differ in length"):
        cohen_kappa([1], [1, 2])


def test_spearman_with_ties():
    assert spearman([1, 2, 3, 4, 5], [5, 6, 7, 8, 7]) == pytest.approx(8 / math.sqrt(95))
    assert spearman([1, 2, 3], [1, 4, 9]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_pairwise_agreement_uses_common_valid_labels():
    contents = _store({("t", 0): {"a": 1, "b": 1}, ("t", 1): {"a": 2, "b": 2}, ("t", 2): {"a": 3, "b": None}})
    (pair,) = pairwise_agreement(contents)
    assert (pair.teacher_a, pair.teacher_b, pair.n, pair.exact, pair.kappa) == ("a", "b", 2, 1.0, 1.0)


# ---------------------------------------------------------------------------- the store itself
def test_label_store_keeps_the_latest_record_and_survives_a_torn_line(tmp_path):
    with LabelStore(tmp_path) as store:
        store.append(_label("t", 0, "a", None))
        store.append(_label("t", 0, "a", 4))  # a retried failure replaces the failed record
    path = tmp_path / "labels.jsonl"
    path.write_text(path.read_text() + '{"kind": "label", "uid": "t", "st', encoding="utf-8")
    assert read_store(path).labels[("t", 0, "a")].score == 4
    with LabelStore(tmp_path) as store:  # opening cuts the torn tail, so appends start clean
        store.append(_label("t", 1, "a", 2))
    contents = read_store(path)
    assert {k: v.score for k, v in contents.labels.items()} == {("t", 0, "a"): 4, ("t", 1, "a"): 2}
    path.write_text('{"kind": "label"}\n' + path.read_text(), encoding="utf-8")
    from keyshot.data_synth.errors import LabelStoreError

    with pytest.raises(LabelStoreError, match=r"labels.jsonl:1: incomplete LabelRecord"):
        read_store(path)
