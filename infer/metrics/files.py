"""The metrics as files people read: Markdown tables, CSV, JSON and a PNG of the agreement and P/R/F1
per agent (``keyshot metrics --out``, ``keyshot merge --arb-index``)."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from keyshot.infer.common.fileio import make_folder, write_bytes_atomic
from keyshot.infer.common.text import shorten_middle
from keyshot.infer.metrics.compute import (
    AGENTLAB_REWARD,
    ARB_ANNOTATION,
    HUMAN_LABELS,
    MetricsReport,
    compute_metrics,
    records_from_verdicts,
)
from keyshot.infer.protocol.verdicts import Verdict


def percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


#: The success-rate column's name by the source of the truth (several sources: "true SR").
_SR_COLUMN = {HUMAN_LABELS: "human SR", AGENTLAB_REWARD: "reward SR", ARB_ANNOTATION: "ARB human SR"}


def truth_source(report: MetricsReport) -> str:
    """Where the truth of the report's records comes from: "human labels", or each source with its
    count ("AgentLab reward 12, human labels 3")."""
    if not report.truth:
        return "none (no record has a human label or a recorded reward)"
    if len(report.truth) == 1:
        return next(iter(report.truth))
    return ", ".join(f"{source} {n}" for source, n in report.truth.items())


def agreement_summary(verdicts: list[Verdict]) -> dict | None:
    """The agreement of ``verdicts`` with the truth they carry (human labels, AgentLab reward), overall,
    with the truth's name (:func:`truth_source`): what a run's summary shows; None when none has a truth."""
    records = records_from_verdicts(verdicts)
    if not any(r.truth for r in records):
        return None
    report = compute_metrics(records)
    overall = next((r for r in report.agreement if r.scope == "overall"), None)
    if overall is None:
        return None
    return {
        "truth": truth_source(report),
        "n": overall.n,
        "agreement": overall.agreement,
        "judge_sr": overall.judge_sr,
        "truth_sr": overall.human_sr,
    }


def truth_sr_column(report: MetricsReport) -> str:
    """The name of the truth's success rate: "human SR", "reward SR", "ARB human SR" or "true SR"."""
    return _SR_COLUMN.get(next(iter(report.truth)), "true SR") if len(report.truth) == 1 else "true SR"


def metrics_markdown(report: MetricsReport) -> str:
    """The report as Markdown tables (rates in percent), each naming the source of its truth."""
    notes = "".join(f"**{note}**\n\n" for note in report.notes)
    truth = f"{notes}Truth: {truth_source(report)}."
    label_2 = (
        f" Human label 2 (not executable): {report.label_2}."
        if HUMAN_LABELS in report.truth or ARB_ANNOTATION in report.truth
        else ""
    )
    out = [
        *(f"**{note}**\n" for note in report.notes),
        f"Records: {report.n_records}, used: {report.n_used}"
        + (f", dropped: {', '.join(f'{k} {v}' for k, v in report.dropped.items())}" if report.dropped else "")
        + f".{label_2} A verdict without a status counts as failure.",
        "",
        "### Success rate and agreement with the truth (Online-Mind2Web style)",
        "",
        truth,
        "",
    ]
    completion = any(r.n_completion for r in report.agreement)
    if completion:  # WebCanvas's completion rate beside the success rate, when the verdicts say it
        out += [
            "CR: the judge's completion rate, key points met over key points (WebCanvas), micro-averaged "
            "over the verdicts that say which were met (n CR); the macro row averages the agents' CRs.",
            "",
        ]
    out += [
        f"| group | n | no status | judge SR | {truth_sr_column(report)} | AR | SR gap |"
        + (" CR | n CR |" if completion else ""),
        "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if completion else ""),
    ]
    for r in report.agreement:
        name = f"**{r.group}**" if r.scope in ("overall", "macro") else r.group
        out.append(
            f"| {name} | {r.n} | {r.n_no_verdict} | {percent(r.judge_sr)} | {percent(r.human_sr)} | "
            f"{percent(r.agreement)} | {percent(r.sr_gap)} |"
            + (f" {percent(r.completion_rate)} | {r.n_completion} |" if completion else "")
        )
    out += [
        "",
        "### Precision, recall, F1 of the judge's success against the truth (AgentRewardBench style)",
        "",
        truth,
        "",
        "| scope | group | n | TP | FP | FN | TN | precision | recall | F1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report.classification:
        name = f"**{r.group}**" if r.scope == "overall" else r.group
        out.append(
            f"| {r.scope} | {name} | {r.n} | {r.tp} | {r.fp} | {r.fn} | {r.tn} | "
            f"{percent(r.precision)} | {percent(r.recall)} | {percent(r.f1)} |"
        )
    return "\n".join(out) + "\n"


_CSV_FIELDS = [
    "section",
    "scope",
    "group",
    "n",
    "n_no_verdict",
    "judge_sr",
    "human_sr",
    "agreement",
    "sr_gap",
    "tp",
    "fp",
    "fn",
    "tn",
    "precision",
    "recall",
    "f1",
    "completion_rate",
    "n_completion",
]


def metrics_csv(report: MetricsReport) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for section, rows in (("agreement", report.agreement), ("classification", report.classification)):
        for r in rows:
            d = asdict(r)
            writer.writerow({"section": section, **{k: ("" if v is None else v) for k, v in d.items()}})
    return buf.getvalue()


def metrics_png(report: MetricsReport) -> bytes:
    """A bar chart: success rates and agreement per agent; precision/recall/F1 per group."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    agree = [r for r in report.agreement if r.n and r.scope in ("agent", "overall")]
    clf = [r for r in report.classification if r.n]
    fig = Figure(figsize=(max(8.0, 0.9 * max(len(agree), len(clf)) + 3), 8.5), dpi=100)
    FigureCanvasAgg(fig)
    panels = (
        (
            agree,
            ("judge_sr", "human_sr", "agreement"),
            ("judge SR", truth_sr_column(report), "agreement"),
            "Success rate and agreement",
        ),
        (
            clf,
            ("precision", "recall", "f1"),
            ("precision", "recall", "F1"),
            f"Judge success vs {truth_source(report)} (P / R / F1)",
        ),
    )
    for i, (rows, keys, labels, title) in enumerate(panels):
        ax = fig.add_subplot(2, 1, i + 1)
        if not rows:
            ax.text(0.5, 0.5, f"{title}: no data (no verdict has a truth)", ha="center", va="center")
            ax.set_xticks([])
            ax.set_yticks([])
            continue
        x = np.arange(len(rows))
        width = 0.8 / len(keys)
        for j, (key, label) in enumerate(zip(keys, labels, strict=True)):
            values = [100 * (getattr(r, key) or 0.0) for r in rows]
            ax.bar(x + (j - (len(keys) - 1) / 2) * width, values, width, label=label)
        ax.set_xticks(x)
        ax.set_xticklabels([shorten_middle(r.group, 26) for r in rows], rotation=25, ha="right", fontsize=8)
        ax.set_ylim(0, 100)
        ax.set_ylabel("%")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def write_metrics(report: MetricsReport, out_dir: str | Path) -> dict[str, Path]:
    """Write metrics.json, metrics.md, metrics.csv and metrics.png into ``out_dir`` (atomically)."""
    out_dir = make_folder(out_dir)
    files = {
        "json": (out_dir / "metrics.json", json.dumps(asdict(report), indent=2).encode() + b"\n"),
        "md": (out_dir / "metrics.md", metrics_markdown(report).encode()),
        "csv": (out_dir / "metrics.csv", metrics_csv(report).encode()),
        "png": (out_dir / "metrics.png", metrics_png(report)),
    }
    for path, data in files.values():
        write_bytes_atomic(path, data)
    return {kind: path for kind, (path, _) in files.items()}
