"""What the report shows, computed from a judged run: its verdicts, their ground truth, their kind.

A run is a keyshot run folder (``verdicts.jsonl`` beside ``summary.json`` and ``run.json``), a
keyshot verdict file, or released judge records keyshot imports (the reference implementation's
output file, AgentRewardBench WebJudge record folders): :func:`load_run` reads any of them into
:class:`~keyshot.infer.protocol.verdicts.Verdict` objects.

Ground truth, where the data has it: the Online-Mind2Web human label (from ``--human-labels`` or the
verdict), else the benchmark's own reward recorded with the trajectory (AgentLab/BrowserGym,
AgentRewardBench). Each trajectory also gets a *kind*: an agent's own outcome, a task humans marked
not executable (Online-Mind2Web label 2), an infrastructure failure (site blocked, CAPTCHA, crashed
run: these are not the agent's fault), or a run that could not be judged (incomplete).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.loaders.trajectory import NOT_EXECUTABLE
from keyshot.infer.metrics.calibration import Calibration, compute_calibration
from keyshot.infer.metrics.compute import (
    JudgedRecord,
    MetricsReport,
    compute_metrics,
    evidence_notes,
    key_points_met,
    records_from_verdicts,
    truth_of,
    withheld_reason,
)
from keyshot.infer.metrics.sweep_compare import SweepComparison, compare_sweep, is_sweep_folder
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.runs.counts import INCOMPLETE, NO_SCORES, outcome_of
from keyshot.infer.runs.run_record import read_protocol, stand_in_of
from keyshot.infer.runs.summary import read_summary
from keyshot.infer.runs.verdict_sources import load_verdicts

logger = logging.getLogger(__name__)

KIND_AGENT = "agent"
KIND_NOT_EXECUTABLE = "not executable"
KIND_INFRASTRUCTURE = "infrastructure"
KIND_INCOMPLETE = "incomplete"
_INFRASTRUCTURE = re.compile(
    r"captcha|access denied|blocked by|bot detection|403 forbidden|site (?:is )?(?:down|unavailable)|"
    r"page (?:failed|did not) load|cloudflare|the run failed|crash",
    re.IGNORECASE,
)


@dataclass
class Run:
    """A judged run as the report sees it. ``name`` says what was judged (agents, benchmarks, the folder
    judged) rather than the run folder's name; ``stand_in`` is the sentence of a run of stand-in models."""

    name: str
    verdicts: list[Verdict]
    summary: dict = field(default_factory=dict)
    protocol: dict = field(default_factory=dict)
    source_kind: str = "keyshot"
    stand_in: str | None = None
    path: Path | None = None  # what was loaded: a sweep's δ folder brings the δ comparison


def load_run(path: Path) -> Run:
    """A run folder, a verdict file, or released judge records (see the module docstring)."""
    verdicts, kind = load_verdicts(path)
    name = run_name(verdicts, path)
    if kind == "keyshot":
        folder = path if path.is_dir() else path.parent
        summary = _summary(folder) if path.is_dir() else {}
        protocol = (_protocol(folder) if path.is_dir() else {}) or _protocol_of(verdicts)
        return Run(name, verdicts, summary, protocol, stand_in=stand_in_of(folder), path=path)
    return Run(name, verdicts, protocol=_protocol_of(verdicts), source_kind=kind, path=path)


def run_name(verdicts: list[Verdict], path: Path) -> str:
    """What the run judged, for the report's title: ``DemoAgent-gpt-4o on workarena (agentlab_workarena)``:
    its agents and benchmarks (up to three of each) and the folder its trajectories came from."""

    def some(names: set[str]) -> str:
        shown = sorted(names)[:3]
        return ", ".join(shown) + (f" and {len(names) - 3} more" if len(names) > 3 else "")

    agents = {v.agent for v in verdicts if v.agent}
    benchmarks = {v.benchmark for v in verdicts if v.benchmark}
    sources = {Path(v.source).parent.name for v in verdicts if v.source}
    parts = [some(agents) if agents else "trajectories"]
    if benchmarks:
        parts.append(f"on {some(benchmarks)}")
    if len(sources) == 1:
        parts.append(f"({sources.pop()})")
    elif not agents and not benchmarks:
        parts.append(f"({path.name})")
    return " ".join(parts)


def _summary(folder: Path) -> dict:
    try:
        return read_summary(folder) or {}
    except KeyshotError as exc:
        logger.warning("%s; the report shows the run without its summary", exc)
        return {}


def _protocol(folder: Path) -> dict:
    try:
        return read_protocol(folder) or {}
    except KeyshotError as exc:
        logger.warning("%s; the report reads the protocol from the verdicts", exc)
        return {}


def _protocol_of(verdicts: list[Verdict]) -> dict:
    """The protocol recorded in the verdicts themselves (every verdict carries its config)."""
    return dict(verdicts[0].config) if verdicts and verdicts[0].config else {}


def ground_truth(
    v: Verdict, human_labels: dict[tuple[str, str], str] | None = None
) -> tuple[str | None, str | None]:
    """``success``/``failure``/``not_executable``/``unsure`` (None when the data has none), and the name
    of its source (:func:`~keyshot.infer.metrics.compute.truth_of`)."""
    return truth_of(v, human_labels)


def kind_of(v: Verdict, truth: str | None) -> str:
    if outcome_of(v) in (NO_SCORES, INCOMPLETE):
        return KIND_INCOMPLETE
    if truth == NOT_EXECUTABLE:
        return KIND_NOT_EXECUTABLE
    text = " ".join(filter(None, [v.outcome_text, v.error, *(s.thought for s in v.screenshots[-2:])]))
    if _INFRASTRUCTURE.search(text):
        return KIND_INFRASTRUCTURE
    return KIND_AGENT


def run_records(run: Run, truths: list[tuple[str | None, str | None]]) -> list[JudgedRecord]:
    """The run's verdicts with the report's ground truth (:func:`ground_truth`: each with its source's
    name), p_success included."""
    return [
        JudgedRecord(
            v.task_id,
            v.agent or "unknown",
            v.benchmark or "unknown",
            v.success,
            label,
            truth=source if label else None,
            withheld=withheld_reason(v),
            p_success=v.p_success,
            key_points_met=key_points_met(v),
        )
        for v, (label, source) in zip(run.verdicts, truths, strict=True)
    ]


def first_met_here(v: Verdict) -> dict[int, list[str]]:
    """The key points first met at each screenshot, by screenshot index (``pipeline.step_rewards``: the
    judge's ``key_point_steps``); empty when the verdict does not say."""
    points = split_key_points(v.key_points or "")
    steps = v.key_point_steps or []
    if len(steps) != len(points):  # not asked, or a verdict of another key-point reading
        return {}
    here: dict[int, list[str]] = {}
    for point, step in zip(points, steps, strict=True):
        if step is not None:
            here.setdefault(step, []).append(point)
    return here


def calibration_of(run: Run, truths: list[tuple[str | None, str | None]]) -> Calibration | None:
    """p_success against the ground truth (keyshot.infer.metrics.calibration), or None when no verdict has
    both."""
    cal = compute_calibration(run_records(run, truths))
    return cal if cal.n_used else None


def sweep_of(path: Path, human_labels: dict[tuple[str, str], str] | None = None) -> SweepComparison | None:
    """The δ comparison of the sweep ``path`` belongs to (a δ folder of ``keyshot sweep``'s OUT, or OUT
    itself), against the same ground truth as the report; None for a run that is no sweep's."""
    folder = path if path.is_dir() else path.parent
    for candidate in (folder, folder.parent):
        if is_sweep_folder(candidate):
            try:
                return compare_sweep(
                    candidate, lambda vs: records_from_verdicts(vs, human_labels=human_labels)
                )
            except KeyshotError as exc:
                logger.warning("%s; the report shows no δ comparison", exc)
                return None
    return None


def metrics_of(run: Run, truths: list[tuple[str | None, str | None]]) -> MetricsReport | None:
    """Agreement, SR gap and P/R/F1 against the ground truth, or None when no verdict has any."""
    if not any(label is not None for label, _ in truths):
        return None
    report = compute_metrics(run_records(run, truths))
    report.notes = evidence_notes(run.verdicts, run.stand_in)
    return report
