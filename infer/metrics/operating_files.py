"""The operating point as files people read (``keyshot metrics --out``): ``calibration.{json,md}`` with the
reliability diagram (``reliability.png``) and the precision-recall curve (``pr_curve.png``) of p_success,
and for a threshold sweep ``delta_comparison.{json,md,csv,png}``: the δ's side by side."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict
from pathlib import Path

from keyshot.infer.common.fileio import make_folder, write_bytes_atomic
from keyshot.infer.metrics.calibration import (
    DEFAULT_P_THRESHOLD,
    LABEL_NOT_JUDGED,
    Calibration,
    ThresholdScore,
)
from keyshot.infer.metrics.files import percent, truth_source, truth_sr_column
from keyshot.infer.metrics.operating_plots import pr_curve_plot, reliability_diagram, sweep_plot
from keyshot.infer.metrics.sweep_compare import SweepComparison


def _num(value: float | None, digits: int = 4) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _score_line(name: str, s: ThresholdScore | None) -> str:
    if s is None:
        return f"| {name} | — | 0 | — | — | — | — |"
    return (
        f"| {name} | {s.threshold:.4f} | {s.n} | {percent(s.agreement)} | {percent(s.precision)} | "
        f"{percent(s.recall)} | {percent(s.f1)} |"
    )


def counts_lines(counts: dict[str, int], n_used: int, n_records: int) -> list[str]:
    """Every input, counted: used, and each reason a record or label was left out."""
    lines = [f"- used (p_success and a truth): {n_used} of {n_records} verdicts"]
    lines += [f"- {reason}: {n}" for reason, n in counts.items() if reason != LABEL_NOT_JUDGED]
    if LABEL_NOT_JUDGED in counts:
        lines.append(f"- {LABEL_NOT_JUDGED}: {counts[LABEL_NOT_JUDGED]} (labels no verdict met)")
    return lines


def calibration_markdown(cal: Calibration) -> str:
    out = [*(f"**{note}**\n" for note in cal.notes), "### p_success against the truth", ""]
    out += counts_lines(cal.counts, cal.n_used, cal.n_records)
    out += [
        "",
        f"Expected calibration error: {_num(cal.ece)}; Brier score: {_num(cal.brier)} "
        f"({len(cal.bins)} equal-width bins).",
        "",
        "| p_success bin | n | mean p_success | share that succeeded |",
        "|---|---:|---:|---:|",
    ]
    out += [
        f"| [{b.low:.1f}, {b.high:.1f}{']' if b.high == 1 else ')'} | {b.n} | {_num(b.mean_p, 3)} | "
        f"{_num(b.success_rate, 3)} |"
        for b in cal.bins
    ]
    op = cal.operating_point
    if op is not None:
        out += [
            "",
            f"### The p_success threshold, chosen for {op.objective} on the tune split, reported on the test split",
            "",
            f"Split by a stable hash of the task id (seed {op.split_seed!r}): {op.n_tune} tune, {op.n_test} test "
            "records; a verdict is success when p_success ≥ the threshold.",
            "",
            "| split | threshold | n | agreement | precision | recall | F1 |",
            "|---|---:|---:|---:|---:|---:|---:|",
            _score_line("tune (chosen here)", op.tune),
            _score_line("**test** (reported)", op.test),
            _score_line(f"test at {DEFAULT_P_THRESHOLD}", op.test_default),
            "",
        ]
        if op.threshold is not None and op.n_test:
            out.append(
                f"Use it: `pipeline.p_success_threshold={op.threshold:.4f}` for keyshot judge and keyshot reward."
            )
        if not op.n_test:
            out.append("The test split is empty: the threshold has no report yet (more records needed).")
    return "\n".join(out) + "\n"


def write_calibration(cal: Calibration, out_dir: Path, banner: str | None = None) -> dict[str, Path]:
    out_dir = make_folder(out_dir)
    files = {
        "calibration_json": (
            out_dir / "calibration.json",
            json.dumps(asdict(cal), indent=2).encode() + b"\n",
        ),
        "calibration_md": (out_dir / "calibration.md", calibration_markdown(cal).encode()),
        "reliability_png": (out_dir / "reliability.png", reliability_diagram(cal, banner)),
        "pr_curve_png": (out_dir / "pr_curve.png", pr_curve_plot(cal)),
    }
    for path, data in files.values():
        write_bytes_atomic(path, data)
    return {kind: path for kind, (path, _) in files.items()}


_SWEEP_FIELDS = [
    "delta",
    "scope",
    "group",
    "verdicts",
    "n",
    "agreement",
    "precision",
    "recall",
    "f1",
    "judge_sr",
    "true_sr",
    "kept",
    "outcome_prompt_tokens",
]


def sweep_markdown(cmp: SweepComparison, calibrations: dict[float, Calibration] | None = None) -> str:
    out = [
        *(f"**{note}**\n" for note in cmp.notes),
        f"### Threshold sweep of {cmp.source}: the δ's side by side",
        "",
    ]
    first = cmp.per_delta[0].report if cmp.per_delta else None
    out += [
        (f"Truth: {truth_source(first)}. " if first is not None else "")
        + "Rates count the verdicts with a truth (n); kept screenshots and outcome prompt tokens count every "
        "swept verdict.",
        "",
        "| δ | group | verdicts | n | agreement | precision | recall | F1 | judge SR | "
        f"{truth_sr_column(first) if first is not None and first.truth else 'true SR'} | kept | "
        "kept / verdict | outcome prompt tokens |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(cmp.rows, key=lambda r: (r.scope != "overall", r.group, r.delta)):
        name = f"**{r.group}**" if r.scope == "overall" else r.group
        per = f"{r.kept / r.verdicts:.2f}" if r.verdicts else "—"
        out.append(
            f"| {r.delta:g} | {name} | {r.verdicts} | {r.n} | {percent(r.agreement)} | {percent(r.precision)} | "
            f"{percent(r.recall)} | {percent(r.f1)} | {percent(r.judge_sr)} | {percent(r.true_sr)} | {r.kept} | "
            f"{per} | {r.outcome_prompt_tokens} |"
        )
    dropped = [(d.delta, d.dropped) for d in cmp.per_delta if d.dropped]
    if dropped:
        out += [
            "",
            "Left out of the rates: "
            + "; ".join(
                f"δ={delta:g}: " + ", ".join(f"{k} {n}" for k, n in reasons.items())
                for delta, reasons in dropped
            )
            + ".",
        ]
    if calibrations:
        out += ["", "| δ | p_success used | ECE | Brier |", "|---:|---:|---:|---:|"]
        out += [f"| {d:g} | {c.n_used} | {_num(c.ece)} | {_num(c.brier)} |" for d, c in calibrations.items()]
    best = cmp.best("agreement")
    if best:
        deltas = ", ".join(f"{r.delta:g}" for r in best)
        tie = f" (a tie of {len(best)}: the truth does not tell them apart)" if len(best) > 1 else ""
        out += ["", f"Highest overall agreement: δ={deltas}, {percent(best[0].agreement)}%{tie}."]
    return "\n".join(out) + "\n"


def sweep_csv(cmp: SweepComparison) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=_SWEEP_FIELDS, lineterminator="\n")
    writer.writeheader()
    for r in cmp.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in asdict(r).items()})
    return buf.getvalue()


def write_sweep(
    cmp: SweepComparison,
    out_dir: Path,
    calibrations: dict[float, Calibration] | None = None,
    banner: str | None = None,
) -> dict[str, Path]:
    out_dir = make_folder(out_dir)
    data = {
        "source": cmp.source,
        "truth": truth_source(cmp.per_delta[0].report) if cmp.per_delta else None,
        "deltas": cmp.deltas,
        "rows": [asdict(r) for r in cmp.rows],
        "dropped": {f"{d.delta:g}": d.dropped for d in cmp.per_delta},
        "calibration": {
            f"{d:g}": {"n_used": c.n_used, "ece": c.ece, "brier": c.brier}
            for d, c in (calibrations or {}).items()
        },
        "notes": cmp.notes,
    }
    files = {
        "sweep_json": (out_dir / "delta_comparison.json", json.dumps(data, indent=2).encode() + b"\n"),
        "sweep_md": (out_dir / "delta_comparison.md", sweep_markdown(cmp, calibrations).encode()),
        "sweep_csv": (out_dir / "delta_comparison.csv", sweep_csv(cmp).encode()),
        "sweep_png": (out_dir / "delta_comparison.png", sweep_plot(cmp, banner)),
    }
    for path, blob in files.values():
        write_bytes_atomic(path, blob)
    return {kind: path for kind, (path, _) in files.items()}
