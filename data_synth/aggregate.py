"""Aggregate teacher labels into one training target per screenshot, with filters and class balance.

Works on label metadata only (text and scores, never pixels), so a whole run fits in memory; the
dataset builder then streams the images of the rows kept here. The steps, each counted in the
:class:`AggregationReport`:

1. rows need pixels (an imported log may not hold the screenshot) and a trajectory record;
2. ``outcome_filter``: where a human label exists, ``per_teacher`` ignores the labels of a teacher
   whose WebJudge verdict on the trajectory disagreed with it, ``all`` drops the trajectory if any
   teacher's verdict disagreed (trajectories without a label or a verdict pass);
3. unparseable answers and failed calls are dropped; a row needs ``min_teachers`` valid labels;
4. the consensus score: ``median`` (the lower middle value for an even count), ``majority`` (the most
   frequent score; a tie goes to the tied score of the first teacher in ``teacher_priority``, else the
   lowest) or ``mean`` (rounded half up);
5. ``max_disagreement``: rows whose valid scores spread more than this (max - min) are dropped;
6. the target text comes from the first teacher in ``teacher_priority`` (then by name) whose score
   equals the consensus and who gave a reasoning; ``normalized`` rewrites it in the WebJudge-7B style
   ``**Reasoning**: …\\n\\n**Score**: N``, ``raw`` keeps the teacher's answer as is. No such teacher
   (possible with ``mean``) drops the row;
7. identical rows (``content_key``: the same screenshot bytes and the same request) are one row (the
   first in trajectory and step order whose trajectory names its agent, else the first) with ``count`` the number of times it occurred (a trainer may
   weight a row by it); collapsed rows whose consensus differed from the kept one are counted;
8. class balance, per split listed in ``balance.splits`` (train only by default, so validation and
   test keep the natural distribution): ``max_score1_ratio`` keeps at most ``ratio ×`` (rows with
   other scores) score-1 rows, ``per_class_cap`` caps each score's rows; the rows kept are chosen by
   a seeded hash of (trajectory, step), so the choice is stable across builds.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from keyshot.data_synth.labels import LabelRecord, StoreContents, TrajectoryRecord
from keyshot.infer.protocol.messages import scorer_answer

logger = logging.getLogger(__name__)

SCORES = (1, 2, 3, 4, 5)


@dataclass
class BalanceConfig:
    splits: list[str] = field(default_factory=lambda: ["train"])
    max_score1_ratio: float | None = None
    per_class_cap: dict[int, int] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        caps = {}
        for key, value in self.per_class_cap.items():
            try:
                score = int(key)
            except (TypeError, ValueError):
                raise ValueError(f"balance.per_class_cap: key {key!r} is not a score 1-5") from None
            if score not in SCORES or int(value) < 0:
                raise ValueError(
                    f"balance.per_class_cap: {key!r}: {value!r} must map a score 1-5 to a count >= 0"
                )
            caps[score] = int(value)
        self.per_class_cap = caps
        if self.max_score1_ratio is not None and self.max_score1_ratio < 0:
            raise ValueError("balance.max_score1_ratio must be >= 0")


@dataclass
class AggregationConfig:
    consensus: Literal["median", "majority", "mean"] = "median"
    teacher_priority: list[str] = field(default_factory=list)
    min_teachers: int = 1
    max_disagreement: int | None = None
    answer_format: Literal["normalized", "raw"] = "normalized"
    outcome_filter: Literal["off", "per_teacher", "all"] = "off"
    balance: BalanceConfig = field(default_factory=BalanceConfig)

    def __post_init__(self) -> None:
        if self.min_teachers < 1:
            raise ValueError("aggregation.min_teachers must be >= 1")
        if self.max_disagreement is not None and self.max_disagreement < 0:
            raise ValueError("aggregation.max_disagreement must be >= 0")


@dataclass
class RowPlan:
    """A dataset row decided on labels alone: its consensus score, target label and split."""

    uid: str
    step: int
    score: int
    answer: str
    target: LabelRecord
    labels: list[LabelRecord]
    split: str
    count: int = 1  # identical rows collapsed into this one (itself included)


@dataclass
class AggregationReport:
    steps_labelled: int = 0
    dropped: dict[str, int] = field(default_factory=dict)
    teacher_labels: dict[str, dict[str, int]] = field(default_factory=dict)  # teacher -> valid/invalid
    invalid_reasons: dict[str, int] = field(default_factory=dict)
    scores_before_balance: dict[str, dict[int, int]] = field(default_factory=dict)  # split -> score -> n
    scores_after_balance: dict[str, dict[int, int]] = field(default_factory=dict)
    target_teachers: dict[str, int] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    duplicates: int = 0  # rows identical to an earlier row, collapsed into it
    duplicate_conflicts: int = 0  # of those, rows whose consensus score differed from the kept row's

    def drop(self, reason: str, n: int = 1) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + n

    @property
    def rows(self) -> int:
        return sum(sum(c.values()) for c in self.scores_after_balance.values())


# ---------------------------------------------------------------------------- consensus
def consensus_score(scores: list[int], method: str, priority_scores: list[int] | None = None) -> int:
    """The consensus of valid 1-5 scores; ``priority_scores`` (teachers' scores in priority order)
    break majority ties."""
    if not scores:
        raise ValueError("no scores to aggregate")
    ordered = sorted(scores)
    if method == "median":
        return ordered[(len(ordered) - 1) // 2]
    if method == "mean":
        return int(sum(ordered) / len(ordered) + 0.5)
    if method == "majority":
        counts = Counter(ordered)
        top = max(counts.values())
        tied = sorted(s for s, c in counts.items() if c == top)
        for s in priority_scores or []:
            if s in tied:
                return s
        return tied[0]
    raise ValueError(f"unknown consensus method {method!r}; choose median, majority or mean")


def _priority_key(priority: list[str]) -> Callable[[LabelRecord], tuple[int, str]]:
    rank = {name: i for i, name in enumerate(priority)}
    return lambda label: (rank.get(label.teacher, len(rank)), label.teacher)


def outcome_matches(success: bool | None, human_label: str | None) -> bool | None:
    """Whether a verdict agrees with a human label; None when either is unknown ("unsure" included).
    "not_executable" counts as not-success, as in the paper's success rates."""
    if success is None or human_label not in ("success", "failure", "not_executable"):
        return None
    return success == (human_label == "success")


def _stable_rank(seed: int, uid: str, step: int) -> str:
    return hashlib.sha256(f"{seed}:{uid}:{step}".encode()).hexdigest()


# ---------------------------------------------------------------------------- the aggregation
def aggregate(
    contents: StoreContents,
    cfg: AggregationConfig,
    split_of: Callable[[TrajectoryRecord], str | None],
    content_key: Callable[[RowPlan], str] | None = None,
) -> tuple[list[RowPlan], AggregationReport]:
    """Decide the dataset rows (sorted by trajectory and step) from a label store's contents.
    ``split_of(trajectory)`` is its split (None: left out); rows with the same ``content_key`` are one."""
    report = AggregationReport()
    by_priority = _priority_key(cfg.teacher_priority)
    rows: list[RowPlan] = []

    for label in contents.labels.values():
        counts = report.teacher_labels.setdefault(label.teacher, {"valid": 0, "invalid": 0})
        counts["valid" if label.valid and label.score is not None else "invalid"] += 1
        if not label.valid:
            reason = (label.error or "unknown").split(":")[0][:60]
            report.invalid_reasons[reason] = report.invalid_reasons.get(reason, 0) + 1

    outcomes_by_uid: dict[str, dict[str, bool | None]] = {}
    for (uid, teacher), outcome in contents.outcomes.items():
        outcomes_by_uid.setdefault(uid, {})[teacher] = outcome.success if outcome.valid else None

    for (uid, step), labels in sorted(contents.labels_by_step().items()):
        report.steps_labelled += 1
        traj = contents.trajectories.get(uid)
        if traj is None:
            report.drop("no trajectory record")
            continue
        if step >= len(traj.screenshots) or traj.screenshots[step] is None:
            report.drop("no pixels for the screenshot")
            continue
        if cfg.outcome_filter != "off":
            verdicts = {
                t: outcome_matches(success, traj.human_label)
                for t, success in outcomes_by_uid.get(uid, {}).items()
            }
            if cfg.outcome_filter == "all" and any(v is False for v in verdicts.values()):
                report.drop("outcome disagreed with human label (trajectory)")
                continue
            if cfg.outcome_filter == "per_teacher":
                kept = [lb for lb in labels if verdicts.get(lb.teacher) is not False]
                if len(kept) < len(labels) and not any(lb.valid for lb in kept):
                    report.drop("outcome disagreed with human label (every teacher)")
                    continue
                labels = kept
        valid = [lb for lb in labels if lb.valid and lb.score is not None and 1 <= lb.score <= 5]
        if len(valid) < cfg.min_teachers:
            report.drop("no valid label" if not valid else f"fewer than {cfg.min_teachers} valid labels")
            continue
        valid.sort(key=by_priority)
        scores = [lb.score for lb in valid]
        if cfg.max_disagreement is not None and max(scores) - min(scores) > cfg.max_disagreement:
            report.drop(f"teachers disagree by more than {cfg.max_disagreement}")
            continue
        score = consensus_score(scores, cfg.consensus, scores)
        target = next(
            (
                lb
                for lb in valid
                if lb.score == score
                and (lb.thought.strip() if cfg.answer_format == "normalized" else lb.text.strip())
            ),
            None,
        )
        if target is None:
            report.drop("no teacher answer matches the consensus")
            continue
        split = split_of(traj)
        if split is None:
            report.drop("agent in no split")
            continue
        answer = (
            scorer_answer(target.thought.strip(), score) if cfg.answer_format == "normalized" else target.text
        )
        rows.append(RowPlan(uid, step, score, answer, target, sorted(labels, key=by_priority), split))

    if content_key is not None:  # the row kept names its agent where one of the copies does
        rows = collapse(rows, content_key, report, lambda row: contents.trajectories[row.uid].agent is None)
    for row in rows:
        hist = report.scores_before_balance.setdefault(row.split, {s: 0 for s in SCORES})
        hist[row.score] += 1
    rows = balance(rows, cfg.balance, report)
    for row in rows:
        hist = report.scores_after_balance.setdefault(row.split, {s: 0 for s in SCORES})
        hist[row.score] += 1
        report.target_teachers[row.target.teacher] = report.target_teachers.get(row.target.teacher, 0) + 1
    return rows, report


def collapse(
    rows: list[RowPlan],
    content_key: Callable[[RowPlan], str],
    report: AggregationReport,
    rank: Callable[[RowPlan], object] = lambda row: 0,
) -> list[RowPlan]:
    """One row per content key, the one of lowest ``rank`` (ties: the first); its ``count`` says how
    many rows it stands for. The rows kept stay in their order."""
    groups: dict[str, list[RowPlan]] = {}
    for row in rows:
        groups.setdefault(content_key(row), []).append(row)
    kept: set[int] = set()
    for same in groups.values():
        first = min(same, key=rank)
        for row in same:
            if row is not first:
                first.count += row.count
                report.duplicates += row.count
                report.duplicate_conflicts += row.score != first.score
        kept.add(id(first))
    return [row for row in rows if id(row) in kept]


def balance(
    rows: list[RowPlan], cfg: BalanceConfig, report: AggregationReport | None = None
) -> list[RowPlan]:
    """Downsample score-1 rows and cap classes in the splits ``cfg.splits``; keeps the row order."""
    if cfg.max_score1_ratio is None and not cfg.per_class_cap:
        return rows
    keep: set[tuple[str, int]] = set()
    for split in sorted({r.split for r in rows}):
        in_split = [r for r in rows if r.split == split]
        if split not in cfg.splits:
            keep.update((r.uid, r.step) for r in in_split)
            continue
        by_score: dict[int, list[RowPlan]] = {s: [] for s in SCORES}
        for r in in_split:
            by_score[r.score].append(r)
        quota = {s: len(by_score[s]) for s in SCORES}
        for s, cap in cfg.per_class_cap.items():
            quota[s] = min(quota[s], cap)
        if cfg.max_score1_ratio is not None:
            others = sum(quota[s] for s in SCORES if s != 1)
            quota[1] = min(quota[1], int(cfg.max_score1_ratio * others))
        for s in SCORES:
            chosen = sorted(by_score[s], key=lambda r: _stable_rank(cfg.seed, r.uid, r.step))[: quota[s]]
            keep.update((r.uid, r.step) for r in chosen)
            if report is not None and len(by_score[s]) > quota[s]:
                report.drop(f"class balance ({split}, score {s})", len(by_score[s]) - quota[s])
    return [r for r in rows if (r.uid, r.step) in keep]
