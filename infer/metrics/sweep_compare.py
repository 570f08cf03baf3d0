"""The δ's of a threshold sweep side by side (``keyshot metrics SWEEP_OUT``): agreement, precision, recall,
F1, the screenshots kept and the outcome prompt tokens per δ, per agent and overall, the paper's Table B.4
with its cost beside it.

A sweep folder is what ``keyshot sweep`` writes (:mod:`keyshot.infer.judge.sweep`): ``sweep.json`` and one run
folder per δ (``delta_<δ>``), each read by the one verdict reader and joined with the truth as ``keyshot
metrics`` joins any run (:func:`~keyshot.infer.metrics.compute.records_from_verdicts`). The rates count
the verdicts that have a truth (the rest counted per δ as :attr:`DeltaMetrics.dropped`); kept screenshots and
outcome prompt tokens count every swept verdict of the group, since each was paid for.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.infer.metrics.compute import (
    OVERALL,
    JudgedRecord,
    MetricsInputError,
    MetricsReport,
    agent_key,
    compute_metrics,
)
from keyshot.infer.metrics.config import DEFAULTS
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.runs.run_record import read_protocol
from keyshot.infer.runs.verdict_sources import load_verdicts

#: The file ``keyshot sweep`` writes beside its δ folders (:mod:`keyshot.infer.judge.threshold_sweep`, above
#: this room, writes it by this name).
SWEEP_FILE = "sweep.json"


@dataclass
class SweepRow:
    """One δ and one group (an agent, or ``Overall``)."""

    delta: float
    scope: str  # "agent" or "overall"
    group: str
    verdicts: int  # swept verdicts of the group
    n: int  # of them, with a truth: the rates' denominator
    agreement: float | None
    precision: float | None
    recall: float | None
    f1: float | None
    judge_sr: float | None
    true_sr: float | None
    kept: int  # screenshots shown to the outcome calls
    outcome_prompt_tokens: int


@dataclass
class DeltaMetrics:
    delta: float
    folder: str
    report: MetricsReport
    dropped: dict[str, int] = field(default_factory=dict)
    records: list[JudgedRecord] = field(default_factory=list)


@dataclass
class SweepComparison:
    source: str
    deltas: list[float]
    rows: list[SweepRow]
    per_delta: list[DeltaMetrics]
    notes: list[str] = field(default_factory=list)

    def overall(self) -> list[SweepRow]:
        return [r for r in self.rows if r.scope == "overall"]

    def best(self, metric: str = "agreement") -> list[SweepRow]:
        """The δ's whose overall ``metric`` is highest (several when they tie)."""
        rows = [r for r in self.overall() if getattr(r, metric) is not None]
        top = max((getattr(r, metric) for r in rows), default=None)
        return [r for r in rows if getattr(r, metric) == top]


def is_sweep_folder(path: Path) -> bool:
    return path.is_dir() and (path / SWEEP_FILE).is_file()


def sweep_folders(path: Path) -> list[tuple[float, Path]]:
    """(δ, folder) of each δ the sweep recorded, in its order; the δ read from each folder's run.json."""
    try:
        sweep = json.loads((path / SWEEP_FILE).read_text(encoding="utf-8"))
        rows = sweep["per_delta"]
        folders = [(r["delta"], path / r["folder"]) for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise MetricsInputError(f"{path / SWEEP_FILE}: not a keyshot sweep file ({exc})") from None
    out = []
    for delta, folder in folders:
        protocol = read_protocol(folder) or {}
        if protocol.get("threshold") != delta:
            raise MetricsInputError(
                f"{folder}: its run.json records threshold {protocol.get('threshold')!r}, the sweep δ={delta}; "
                "run keyshot sweep again into a new --out"
            )
        out.append((delta, folder))
    return out


def _rates(
    report: MetricsReport, group: str
) -> tuple[int, float | None, float | None, float | None, float | None]:
    agree = next((r for r in report.agreement if r.group == group and r.scope in ("agent", "overall")), None)
    clf = next(
        (r for r in report.classification if r.group == group and r.scope in ("agent", "overall")), None
    )
    return (
        agree.n if agree else 0,
        agree.agreement if agree else None,
        clf.precision if clf else None,
        clf.recall if clf else None,
        clf.f1 if clf else None,
    )


def compare_sweep(
    path: Path,
    records_of: Callable[[list[Verdict]], list[JudgedRecord]],
    *,
    label_2: str = DEFAULTS.label_2,
) -> SweepComparison:
    """Every δ of the sweep in ``path`` joined with the truth by ``records_of`` (the same join as
    ``keyshot metrics``) and put side by side."""
    rows: list[SweepRow] = []
    per_delta: list[DeltaMetrics] = []
    folders = sweep_folders(path)
    for delta, folder in folders:
        verdicts, _ = load_verdicts(folder)
        records = records_of(verdicts)
        report = compute_metrics(records, label_2=label_2, sources={"verdicts": str(folder)})
        per_delta.append(DeltaMetrics(delta, folder.name, report, dict(report.dropped), records))
        by_agent: dict[str, list[tuple[Verdict, JudgedRecord]]] = {}
        for v, r in zip(verdicts, records, strict=True):
            by_agent.setdefault(r.agent, []).append((v, r))
        groups = [("agent", a, pairs) for a, pairs in sorted(by_agent.items())]
        groups.append(("overall", OVERALL, [p for pairs in by_agent.values() for p in pairs]))
        for scope, group, pairs in groups:
            n, agreement, precision, recall, f1 = _rates(report, group)
            agree_row = next((r for r in report.agreement if r.group == group), None)
            rows.append(
                SweepRow(
                    delta=delta,
                    scope=scope,
                    group=group,
                    verdicts=len(pairs),
                    n=n,
                    agreement=agreement,
                    precision=precision,
                    recall=recall,
                    f1=f1,
                    judge_sr=agree_row.judge_sr if agree_row else None,
                    true_sr=agree_row.human_sr if agree_row else None,
                    kept=sum(len(v.kept) for v, _ in pairs),
                    outcome_prompt_tokens=sum(v.usage["judge"].prompt_tokens for v, _ in pairs),
                )
            )
    agents = {agent_key(r.group) for r in rows if r.scope == "agent"}
    notes = [] if len(agents) < 2 else [f"{len(agents)} agents; one row per agent per δ, then Overall"]
    return SweepComparison(str(path), [d for d, _ in folders], rows, per_delta, notes)
