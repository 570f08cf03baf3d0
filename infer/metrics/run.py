"""One metrics run, whichever command asks for it (``keyshot metrics``, ``keyshot merge --human-labels``): a
judge's verdicts (a run's folder, its verdicts.jsonl, a sweep's folder, or released ARB records) joined with
the truth, measured, written to a folder, and the text the terminal shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.metrics.compute import (
    INCOMPLETE,
    NO_READABLE_SCORES,
    MetricsInputError,
    MetricsReport,
    arb_records,
    compute_metrics,
    evidence_notes,
    load_arb_index,
    load_human_labels,
    records_from_verdicts,
)
from keyshot.infer.metrics.config import DEFAULTS, MetricsConfig
from keyshot.infer.metrics.files import metrics_markdown, write_metrics
from keyshot.infer.metrics.operating import write_operating_point, write_sweep_metrics
from keyshot.infer.metrics.sweep_compare import is_sweep_folder
from keyshot.infer.runs.run_record import stand_in_of
from keyshot.infer.runs.verdict_sources import load_verdicts


@dataclass(frozen=True)
class MetricsInputs:
    """What is measured (``verdicts``; None: the released records of ``arb_index``) and against what."""

    verdicts: Path | None = None
    human_labels: Path | None = None
    arb_index: Path | None = None
    #: the judge folder of ``arb_index`` to score when no verdict file is given
    arb_judge: str | None = None
    #: the agent and benchmark of verdicts judged without one
    agent: str | None = None
    benchmark: str | None = None


@dataclass
class MetricsResult:
    """What a run wrote (``paths``) and what the terminal shows (``blocks``, in order)."""

    blocks: list[str] = field(default_factory=list)
    paths: dict[str, Path] = field(default_factory=dict)

    def text(self) -> str:
        """The blocks, then the line naming every file written."""
        return "\n".join([*self.blocks, "wrote " + ", ".join(str(p) for p in self.paths.values())])


def run_metrics(inputs: MetricsInputs, out: Path, config: MetricsConfig = DEFAULTS) -> MetricsResult:
    """Measure ``inputs`` into ``out``: metrics.{json,md,csv,png}, and p_success's calibration for a keyshot
    run (a sweep's folder: its δ's side by side). A report that compares nothing is refused
    (:func:`require_compared`)."""
    labels = load_human_labels(inputs.human_labels) if inputs.human_labels else None
    index = load_arb_index(inputs.arb_index) if inputs.arb_index else None
    options = config.calibration_options()
    if inputs.verdicts is not None and is_sweep_folder(inputs.verdicts):  # keyshot sweep's OUT
        text, paths = write_sweep_metrics(
            inputs.verdicts, out, labels, index, agent=inputs.agent, benchmark=inputs.benchmark, **options
        )
        return MetricsResult([text], dict(paths))
    stand_in = None
    if inputs.verdicts is not None:
        verdicts, kind = load_verdicts(inputs.verdicts)
        folder = inputs.verdicts if inputs.verdicts.is_dir() else inputs.verdicts.parent
        stand_in = stand_in_of(folder) if kind == "keyshot" else None
        notes = evidence_notes(verdicts, stand_in)
        records = records_from_verdicts(
            verdicts, human_labels=labels, arb_index=index, agent=inputs.agent, benchmark=inputs.benchmark
        )
        sources = {"verdicts": str(inputs.verdicts)}
    elif inputs.arb_index is not None:
        records = arb_records(inputs.arb_index, judge=inputs.arb_judge, parse_mode=config.arb_parse_mode)
        notes = []
        sources = {"arb_judge": inputs.arb_judge or "(the only one)", "arb_parse_mode": config.arb_parse_mode}
    else:
        raise KeyshotError("give a verdict file, or --arb-index to score released records")
    for name in ("human_labels", "arb_index"):
        if getattr(inputs, name) is not None:
            sources[name] = str(getattr(inputs, name))
    report = compute_metrics(records, label_2=config.label_2, sources=sources)
    report.notes = notes
    require_compared(report)
    result = MetricsResult([metrics_markdown(report)], write_metrics(report, out))
    if inputs.verdicts is not None:  # p_success against the truth, every input counted
        text, more = write_operating_point(records, out, labels, index, stand_in=stand_in, **options)
        result.blocks.append(text)
        result.paths.update(more)
    return result


def require_compared(report: MetricsReport) -> None:
    """Refuse a report that compares nothing: no record had a truth to join."""
    if report.n_used:
        return
    dropped = ", ".join(f"{reason} {n}" for reason, n in report.dropped.items()) or "none"
    if NO_READABLE_SCORES in report.dropped or INCOMPLETE in report.dropped:
        advice = " ".join(report.notes) or "re-run keyshot judge to retry the failed calls"
    elif "no_human_label" in report.dropped:
        advice = (
            "give the human labels with --human-labels FILE (Online-Mind2Web human_label.json, {task_id: 0|1} "
            "JSON or task_id,label[,agent] CSV), or for AgentRewardBench --arb-index INDEX.csv"
        )
    else:
        advice = "every truth is unsure or not executable (--label-2 decides how not executable counts)"
    raise MetricsInputError(
        f"nothing to compare: {report.n_records} records, none with a usable verdict and truth (dropped: "
        f"{dropped}); {advice}"
    )
