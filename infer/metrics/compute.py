"""Judge-vs-human metrics: success rate, agreement, SR gap (Online-Mind2Web) and precision,
recall, F1 (AgentRewardBench), per agent, per benchmark and overall.

Everything works on plain :class:`JudgedRecord` rows ``(task_id, agent, benchmark, predicted,
human)``. ``predicted`` is the judge's verdict (None = no parseable verdict, counted as failure, as
AgentRewardBench does); a verdict the judge did not reach (no screenshot score could be read, or a call
failed: :func:`withheld_reason`) is no failure but dropped, its reason counted. ``human`` is a canonical
label: ``success``, ``failure``, ``not_executable`` (Online-Mind2Web's
"2") or ``unsure`` (always dropped). Records are built from keyshot's verdicts
(:func:`records_from_verdicts`, read by :func:`keyshot.infer.runs.verdict_sources.load_verdicts`), a
human-label file (:func:`load_human_labels`: Online-Mind2Web's ``human_label.json``, a ``{task_id:
label}`` map or a ``task_id,label[,agent]`` CSV) and the AgentRewardBench WebJudge record folder
(:func:`load_arb_index`, :func:`arb_records`). Each record says where its truth came from
(:data:`TRUTH_SOURCES`), and each table of the report names its sources.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.loaders.human_labels import (
    LabelTable,
    normalize_agent,
    normalize_human_label,
    read_label_file,
)
from keyshot.infer.loaders.judge_records import ArbIndexRow, read_arb_index, read_record_outcome, record_path
from keyshot.infer.loaders.trajectory import FAILURE, NOT_EXECUTABLE, SUCCESS, UNSURE, TrajectoryError
from keyshot.infer.metrics.config import DEFAULTS, LABEL_2_POLICIES
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.runs.counts import INCOMPLETE as OUTCOME_INCOMPLETE
from keyshot.infer.runs.counts import NO_SCORES, judged_without_scores, outcome_of

logger = logging.getLogger(__name__)

OVERALL = "Overall"
MACRO = "Macro average"

#: Where a record's truth comes from: a human-label file or the verdict's own human label, the
#: benchmark's reward AgentLab recorded with the trajectory, or AgentRewardBench's annotation.
HUMAN_LABELS = "human labels"
AGENTLAB_REWARD = "AgentLab reward"
ARB_ANNOTATION = "ARB annotation"
TRUTH_SOURCES = (HUMAN_LABELS, AGENTLAB_REWARD, ARB_ANNOTATION)


class MetricsInputError(KeyshotError, ValueError):
    """A verdict, label or index file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class JudgedRecord:
    task_id: str
    agent: str
    benchmark: str
    predicted: bool | None
    human: str | None
    truth: str | None = None  # one of TRUTH_SOURCES, None when there is no truth
    withheld: str | None = None  # why the verdict is not counted (:func:`withheld_reason`), None when it is
    p_success: float | None = None  # P(success) read at the outcome call's status word, None when not read
    #: (key points the judge found met, key points), when it said which (:func:`key_points_met`), else None
    key_points_met: tuple[int, int] | None = None


#: Why a verdict without a status is dropped rather than counted as a failure.
NO_READABLE_SCORES = "no readable scores"
INCOMPLETE = "incomplete: re-run keyshot judge"


def withheld_reason(v: Verdict) -> str | None:
    """Why ``v`` holds no verdict to count: none of its screenshot scores could be read (a verdict
    parse_mode=reference judged anyway included), or a call it needs failed (docs/architecture.md, "A
    verdict needs evidence"; the outcomes of :mod:`keyshot.infer.runs.counts`); None when it counts. A
    finished run's verdict without a readable status counts as a failure."""
    outcome = outcome_of(v)
    if outcome == NO_SCORES:
        return NO_READABLE_SCORES
    if outcome == OUTCOME_INCOMPLETE and v.success is None:
        return INCOMPLETE
    return None


def key_points_met(v: Verdict) -> tuple[int, int] | None:
    """(met, of) key points of a verdict: from the screenshots each was first met at
    (``pipeline.step_rewards``), else from the per-key-point outcome calls (``key_point`` mode); None when
    the verdict says neither (WebCanvas's completion rate counts key points over trajectories)."""
    if v.key_point_steps:
        return sum(step is not None for step in v.key_point_steps), len(v.key_point_steps)
    calls = [c for c in v.outcome_calls if c.key_point is not None]
    if calls and all(c.valid for c in calls):
        return sum(bool(c.success) for c in calls), len(calls)
    return None


def evidence_notes(verdicts: Sequence[Verdict], stand_in: str | None = None) -> list[str]:
    """The lines every metrics table carries about what its verdicts rest on: the stand-in sentence of a
    run of stand-in models, and how many verdicts rest on no readable screenshot score (not counted)."""
    notes = [stand_in] if stand_in else []
    no_scores = sum(outcome_of(v) == NO_SCORES for v in verdicts)
    if no_scores:
        judged = sum(judged_without_scores(v) for v in verdicts)
        notes.append(
            f"{no_scores} of {len(verdicts)} verdicts rest on no readable screenshot score"
            + (f" ({judged} judged anyway, parse_mode=reference)" if judged else "")
            + ": not counted (dropped as 'no readable scores')"
        )
    return notes


# ---------------------------------------------------------------------------- label handling
def normalize_prediction(value: Any) -> bool | None:
    """The judge's verdict as True/False, or None when it had none."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    key = str(value).strip().lower()
    if key in ("success", "successful", "true", "1", "yes"):
        return True
    if key in ("failure", "unsuccessful", "false", "0", "no"):
        return False
    return None


def human_outcome(human: str | None, label_2: str = DEFAULTS.label_2) -> bool | None:
    """The human verdict as a bool, or None when the record is dropped."""
    if label_2 not in LABEL_2_POLICIES:
        raise ValueError(f"label_2 must be one of {', '.join(LABEL_2_POLICIES)}, got {label_2!r}")
    if human == SUCCESS:
        return True
    if human == FAILURE:
        return False
    if human == NOT_EXECUTABLE:
        return {"not_success": False, "success": True, "drop": None}[label_2]
    return None  # unsure, or no label


def agent_key(name: str) -> str:
    """Agent names compared loosely: "Browser Use", "Browser_Use" and "browser-use" are one agent (the
    rule of :func:`keyshot.infer.loaders.human_labels.normalize_agent`)."""
    return normalize_agent(name)


# ---------------------------------------------------------------------------- metric rows
@dataclass
class AgreementRow:
    """Online-Mind2Web metrics of one group. Rates are fractions in [0, 1]."""

    scope: str  # "agent", "benchmark", "overall" or "macro"
    group: str
    n: int
    n_no_verdict: int
    judge_sr: float | None
    human_sr: float | None
    agreement: float | None
    sr_gap: float | None
    #: WebCanvas's completion rate: key points met over key points, micro-averaged over the group's
    #: verdicts that say which were met (``n_completion`` of them); None when none does
    completion_rate: float | None = None
    n_completion: int = 0


@dataclass
class ClassificationRow:
    """AgentRewardBench metrics of one group: the judge's "success" against the human's."""

    scope: str  # "agent", "benchmark" or "overall"
    group: str
    n: int
    n_no_verdict: int
    tp: int
    fp: int
    fn: int
    tn: int
    precision: float | None
    recall: float | None
    f1: float | None


@dataclass
class MetricsReport:
    label_2: str
    n_records: int
    n_used: int
    dropped: dict[str, int]
    agreement: list[AgreementRow]
    classification: list[ClassificationRow]
    sources: dict[str, str] = field(default_factory=dict)
    truth: dict[str, int] = field(default_factory=dict)  # records used, by the source of their truth
    #: what the verdicts rest on, when every table must say it: a run of stand-in models, verdicts
    #: judged without a readable screenshot score (:func:`evidence_notes`)
    notes: list[str] = field(default_factory=list)

    def row(self, section: str, group: str) -> AgreementRow | ClassificationRow:
        rows = self.agreement if section == "agreement" else self.classification
        for r in rows:
            if r.group == group:
                return r
        raise KeyError(f"no {section} row for group {group!r}")


def labelled_pairs(
    records: Iterable[JudgedRecord], label_2: str
) -> tuple[list[tuple[JudgedRecord, bool]], Counter]:
    """(record, truth) of every judged record with a truth to compare with; the others counted by why not
    (withheld reasons, ``no_human_label``, ``unsure``, ``not_executable``, ``other``)."""
    used: list[tuple[JudgedRecord, bool]] = []
    dropped: Counter = Counter()
    for r in records:
        if r.withheld:
            dropped[r.withheld] += 1
            continue
        truth = human_outcome(r.human, label_2)
        if truth is None:
            reason = {None: "no_human_label", UNSURE: "unsure", NOT_EXECUTABLE: "not_executable"}.get(
                r.human, "other"
            )
            dropped[reason] += 1
            continue
        used.append((r, truth))
    return used, dropped


def _agreement(scope: str, group: str, pairs: Sequence[tuple[JudgedRecord, bool]]) -> AgreementRow:
    n = len(pairs)
    if n == 0:
        return AgreementRow(scope, group, 0, 0, None, None, None, None)
    judged = [r.predicted is True for r, _ in pairs]  # None (no verdict) counts as failure
    truth = [t for _, t in pairs]
    judge_sr = sum(judged) / n
    human_sr = sum(truth) / n
    counted = [r.key_points_met for r, _ in pairs if r.key_points_met is not None]
    points = sum(of for _, of in counted)
    return AgreementRow(
        scope=scope,
        group=group,
        n=n,
        n_no_verdict=sum(r.predicted is None for r, _ in pairs),
        judge_sr=judge_sr,
        human_sr=human_sr,
        agreement=sum(j == t for j, t in zip(judged, truth, strict=True)) / n,
        sr_gap=abs(judge_sr - human_sr),
        completion_rate=sum(met for met, _ in counted) / points if points else None,
        n_completion=len(counted),
    )


def _classification(scope: str, group: str, pairs: Sequence[tuple[JudgedRecord, bool]]) -> ClassificationRow:
    tp = fp = fn = tn = 0
    for r, truth in pairs:
        pred = r.predicted is True
        if pred and truth:
            tp += 1
        elif pred:
            fp += 1
        elif truth:
            fn += 1
        else:
            tn += 1
    precision = tp / (tp + fp) if tp + fp else None
    recall = tp / (tp + fn) if tp + fn else None
    if precision is None or recall is None:
        f1 = None
    elif precision + recall == 0:
        f1 = 0.0
    else:
        f1 = 2 * precision * recall / (precision + recall)
    return ClassificationRow(
        scope=scope,
        group=group,
        n=len(pairs),
        n_no_verdict=sum(r.predicted is None for r, _ in pairs),
        tp=tp,
        fp=fp,
        fn=fn,
        tn=tn,
        precision=precision,
        recall=recall,
        f1=f1,
    )


def _groups(pairs: Sequence[tuple[JudgedRecord, bool]], attr: str) -> dict[str, list]:
    out: dict[str, list] = defaultdict(list)
    for pair in pairs:
        out[getattr(pair[0], attr)].append(pair)
    return dict(sorted(out.items()))


def _mean(values: Iterable[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def agreement_metrics(records: Iterable[JudgedRecord], label_2: str = DEFAULTS.label_2) -> list[AgreementRow]:
    """Success rates, agreement rate and SR gap per agent (per benchmark when there are several),
    pooled ("Overall") and, with several agents, the mean of the per-agent rows ("Macro average",
    the paper's "average SR gap")."""
    pairs, _ = labelled_pairs(records, label_2)
    by_agent = _groups(pairs, "agent")
    rows = [_agreement("agent", a, p) for a, p in by_agent.items()]
    by_bench = _groups(pairs, "benchmark")
    if len(by_bench) > 1:
        rows += [_agreement("benchmark", b, p) for b, p in by_bench.items()]
    rows.append(_agreement("overall", OVERALL, pairs))
    agents = [r for r in rows if r.scope == "agent" and r.n]
    if len(agents) > 1:
        rows.append(
            AgreementRow(
                scope="macro",
                group=MACRO,
                n=sum(r.n for r in agents),
                n_no_verdict=sum(r.n_no_verdict for r in agents),
                judge_sr=_mean(r.judge_sr for r in agents),
                human_sr=_mean(r.human_sr for r in agents),
                agreement=_mean(r.agreement for r in agents),
                sr_gap=_mean(r.sr_gap for r in agents),
                completion_rate=_mean(r.completion_rate for r in agents),
                n_completion=sum(r.n_completion for r in agents),
            )
        )
    return rows


def classification_metrics(
    records: Iterable[JudgedRecord], label_2: str = DEFAULTS.label_2
) -> list[ClassificationRow]:
    """Precision, recall and F1 of the judge's "success" per agent, per benchmark and pooled."""
    pairs, _ = labelled_pairs(records, label_2)
    rows = [_classification("agent", a, p) for a, p in _groups(pairs, "agent").items()]
    rows += [_classification("benchmark", b, p) for b, p in _groups(pairs, "benchmark").items()]
    rows.append(_classification("overall", OVERALL, pairs))
    return rows


def compute_metrics(
    records: Sequence[JudgedRecord], label_2: str = DEFAULTS.label_2, sources: dict[str, str] | None = None
) -> MetricsReport:
    records = list(records)
    pairs, dropped = labelled_pairs(records, label_2)
    return MetricsReport(
        label_2=label_2,
        n_records=len(records),
        n_used=len(pairs),
        dropped=dict(sorted(dropped.items())),
        agreement=agreement_metrics(records, label_2),
        classification=classification_metrics(records, label_2),
        sources=dict(sources or {}),
        truth=dict(sorted(Counter(r.truth or "unnamed" for r, _ in pairs).items())),
    )


# ---------------------------------------------------------------------------- readers
def load_human_labels(path: str | Path) -> LabelTable:
    """A human-label file of any accepted shape, read by the one reader of label files
    (:func:`keyshot.infer.loaders.human_labels.read_label_file`): a mapping ``(task_id, agent_key) ->
    label`` where labels without an agent hold for every agent."""
    try:
        return read_label_file(path)
    except TrajectoryError as exc:
        raise MetricsInputError(str(exc)) from None


def load_arb_index(path: str | Path) -> list[ArbIndexRow]:
    """The AgentRewardBench index's rows, read by the one reader of that file
    (:func:`keyshot.infer.loaders.judge_records.read_arb_index`)."""
    try:
        return read_arb_index(path)
    except TrajectoryError as exc:
        raise MetricsInputError(str(exc)) from None


def arb_records(
    index_path: str | Path, judge: str | None = None, parse_mode: str = DEFAULTS.arb_parse_mode
) -> list[JudgedRecord]:
    """Records of one judge's released AgentRewardBench run: the verdict is the record's outcome
    completion read with ``keyshot.infer.protocol.parsing.parse_status`` (``reference`` mode by default)."""
    from keyshot.infer.protocol.parsing import parse_status

    index_path = Path(index_path)
    rows = load_arb_index(index_path)
    judges = sorted({r.judge for r in rows})
    if judge is None:
        if len(judges) != 1:
            raise MetricsInputError(f"{index_path}: holds several judges ({', '.join(judges)}); choose one")
        judge = judges[0]
    elif judge not in judges:
        raise MetricsInputError(f"{index_path}: no judge {judge!r} (has {', '.join(judges)})")
    out = []
    for row in rows:
        if row.judge != judge:
            continue
        try:
            text = read_record_outcome(record_path(index_path, row))
        except TrajectoryError as exc:
            raise MetricsInputError(str(exc)) from None
        status = parse_status(text, mode=parse_mode)
        out.append(
            JudgedRecord(row.task_id, row.agent, row.benchmark, status.success, row.human, ARB_ANNOTATION)
        )
    return out


def recorded_ground_truth(v: Verdict) -> str | None:
    """The ground truth a verdict carries itself: its human label, else the benchmark's reward
    recorded with the trajectory (AgentLab/BrowserGym ``cum_reward``: > 0 is success), else None."""
    return recorded_truth(v)[0]


def recorded_truth(v: Verdict) -> tuple[str | None, str | None]:
    """:func:`recorded_ground_truth` and its source (``HUMAN_LABELS``, ``AGENTLAB_REWARD`` or None)."""
    try:
        human = normalize_human_label(v.human_label)
    except ValueError:
        logger.warning(
            "task %s (%s): unknown human label %r, treated as missing", v.task_id, v.agent, v.human_label
        )
        human = None
    if human is not None:
        return human, HUMAN_LABELS
    reward = v.reward
    if isinstance(reward, int | float) and not isinstance(reward, bool):
        return (SUCCESS if reward > 0 else FAILURE), AGENTLAB_REWARD
    return None, None


def truth_of(
    v: Verdict, human_labels: Mapping[tuple[str, str], str] | None = None, agent: str | None = None
) -> tuple[str | None, str | None]:
    """A verdict's truth and the name of its source, the one home of both (metrics, the report, the
    sweep's δ comparison and the run's summary name the truth by it): the label of ``human_labels`` (a
    label file, keyed by task id and agent: ``HUMAN_LABELS``), else what the verdict carries
    (:func:`recorded_truth`). ``agent`` names the agent of a verdict judged without one."""
    if human_labels is not None:
        label = human_labels.get((str(v.task_id), agent_key(str(v.agent or agent or "unknown"))))
        if label is not None:
            return label, HUMAN_LABELS
    return recorded_truth(v)


def records_from_verdicts(
    verdicts: Iterable[Verdict],
    human_labels: Mapping[tuple[str, str], str] | None = None,
    arb_index: Sequence[ArbIndexRow] | None = None,
    *,
    agent: str | None = None,
    benchmark: str | None = None,
) -> list[JudgedRecord]:
    """Turn verdict rows into records; human labels come from ``human_labels`` (a label file, keyed by
    task id and agent) or ``arb_index`` (keyed by benchmark, agent and task id) when they have the
    trajectory, else from the verdict's own ``human_label``, else from the benchmark's reward recorded
    with the trajectory (AgentLab/BrowserGym ``cum_reward``: > 0 is success). ``agent`` and
    ``benchmark`` are given to verdicts judged without them, before the join."""
    arb = {row.key: row.human for row in arb_index or []}
    records = []
    matched = 0
    verdict_keys: list[tuple[str, str]] = []
    for v in verdicts:
        task_id = str(v.task_id)
        agent_name = str(v.agent or agent or "unknown")
        bench = str(v.benchmark or benchmark or "unknown")
        predicted = normalize_prediction(v.success)
        human, truth = truth_of(v, human_labels, agent)
        verdict_keys.append((task_id, agent_name))
        if human_labels is not None and (task_id, agent_key(agent_name)) in human_labels:
            matched += 1
        elif (bench, agent_key(agent_name), task_id) in arb:
            human, truth = arb[(bench, agent_key(agent_name), task_id)], ARB_ANNOTATION
            matched += 1
        records.append(
            JudgedRecord(
                task_id,
                agent_name,
                bench,
                predicted,
                human,
                truth if human else None,
                withheld_reason(v),
                v.p_success,
                key_points_met(v),
            )
        )
    if (human_labels is not None or arb_index is not None) and records and matched * 2 < len(records):
        label_keys = list(human_labels or {})[:3] or [(r.task_id, r.agent) for r in list(arb_index or [])[:3]]
        raise MetricsInputError(
            f"only {matched} of {len(records)} verdicts matched a human label: verdicts are keyed (task id, agent) "
            f"like {verdict_keys[:3]}, the labels like {label_keys}; the agent of a verdict comes from the "
            "trajectory (Online-Mind2Web: the agent folder's name, or keyshot judge --agent NAME); verdicts "
            "judged without an agent take keyshot metrics --agent NAME"
        )
    if human_labels is not None or arb_index is not None:
        logger.info("%d of %d verdicts matched a human label", matched, len(records))
    return records


def labels_not_judged(
    records: Sequence[JudgedRecord],
    human_labels: Mapping[tuple[str, str], str] | None = None,
    arb_index: Sequence[ArbIndexRow] | None = None,
) -> tuple[int, int]:
    """Labels no verdict met: ``(of the judged agents, of other agents)``. A label without an agent
    (the any-agent column) is met by a verdict of its task, whatever the agent."""
    judged = {(r.task_id, agent_key(r.agent)) for r in records}
    tasks = {r.task_id for r in records}
    agents = {agent_key(r.agent) for r in records}
    keys = {(task_id, agent_key(agent) if agent else "") for task_id, agent in human_labels or {}}
    keys |= {(row.task_id, agent_key(row.agent)) for row in arb_index or []}
    mine = other = 0
    for task_id, agent in keys:
        if agent == "":
            mine += task_id not in tasks
        elif agent not in agents:
            other += 1
        else:
            mine += (task_id, agent) not in judged
    return mine, other
