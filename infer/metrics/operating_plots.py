"""Pictures of the judge's operating point (PNG, matplotlib's Agg backend): the reliability diagram and the
precision-recall curve of p_success, and the δ's of a threshold sweep side by side. ``keyshot metrics``
writes them as files; ``keyshot report`` shows the same pictures beside its score histogram. A picture
without data says so."""

from __future__ import annotations

from keyshot.infer.metrics.calibration import Calibration
from keyshot.infer.metrics.figures import figure, no_data, png
from keyshot.infer.metrics.sweep_compare import SweepComparison


def reliability_diagram(cal: Calibration | None, banner: str | None = None) -> bytes:
    """Per bin the share that succeeded against the mean p_success (the diagonal is a calibrated judge),
    the bins' sizes under it; ECE and Brier in the title."""
    fig = figure(5.2, 4.2)
    ax = fig.add_subplot(4, 1, (1, 3))
    hist = fig.add_subplot(4, 1, 4)
    if cal is None or not cal.n_used:
        no_data(ax, "no verdict has both p_success and a truth", fontsize=10)
        hist.set_axis_off()
        return png(fig)
    filled = [b for b in cal.bins if b.n]
    ax.plot([0, 1], [0, 1], ls="--", color="#8fa3c7", lw=1, label="calibrated")
    ax.plot(
        [b.mean_p for b in filled], [b.success_rate for b in filled], "o-", color="#2f5bd3", label="judge"
    )
    for b in filled:
        ax.text(b.mean_p, b.success_rate, f" {b.n}", fontsize=7, va="bottom")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_ylabel("share that succeeded")
    title = f"Reliability of p_success (n={cal.n_used}; ECE {cal.ece:.3f}, Brier {cal.brier:.3f})"
    ax.set_title(title if not banner else f"{title}\n{banner}", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    width = cal.bins[0].high - cal.bins[0].low
    hist.bar([b.low + width / 2 for b in cal.bins], [b.n for b in cal.bins], width * 0.9, color="#aab4c5")
    hist.set_xlim(0, 1)
    hist.set_xlabel("p_success (bin)")
    hist.set_ylabel("n", fontsize=8)
    return png(fig)


def pr_curve_plot(cal: Calibration | None) -> bytes:
    """Precision against recall of "success iff p_success ≥ t", the chosen threshold marked."""
    fig = figure(5.2, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    points = [p for p in (cal.pr_curve if cal else []) if p.precision is not None and p.recall is not None]
    if not points:
        no_data(ax, "no verdict has both p_success and a truth", fontsize=10)
        return png(fig)
    ax.plot([p.recall for p in points], [p.precision for p in points], "o-", color="#2f5bd3", ms=3)
    op = cal.operating_point
    if op and op.threshold is not None:
        chosen = next((p for p in points if p.threshold == op.threshold), None)
        if chosen:
            ax.plot(
                chosen.recall,
                chosen.precision,
                "s",
                color="#e0a800",
                ms=8,
                label=f"chosen t={op.threshold:.3f}",
            )
            ax.legend(fontsize=7)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title("Precision-recall of p_success thresholds (all records)", fontsize=9)
    ax.grid(alpha=0.3)
    return png(fig)


def sweep_plot(comparison: SweepComparison | None, banner: str | None = None) -> bytes:
    """Agreement, precision, recall and F1 per δ (overall; agreement per agent dotted), and the screenshots
    kept and outcome prompt tokens per δ beside them."""
    fig = figure(9.0, 3.6)
    left = fig.add_subplot(1, 2, 1)
    right = fig.add_subplot(1, 2, 2)
    overall = comparison.overall() if comparison else []
    if not overall:
        no_data(left, "no sweep to compare", fontsize=10)
        right.set_axis_off()
        return png(fig)
    deltas = [r.delta for r in overall]
    for key, color in (
        ("agreement", "#2f5bd3"),
        ("precision", "#3a9a5b"),
        ("recall", "#c0504d"),
        ("f1", "#7b5ea7"),
    ):
        values = [100 * getattr(r, key) if getattr(r, key) is not None else float("nan") for r in overall]
        left.plot(deltas, values, "o-", color=color, label=key if key != "f1" else "F1")
    agents = sorted({r.group for r in comparison.rows if r.scope == "agent"})
    if len(agents) > 1:
        for agent in agents:
            rows = [r for r in comparison.rows if r.scope == "agent" and r.group == agent]
            left.plot(
                [r.delta for r in rows],
                [100 * r.agreement if r.agreement is not None else float("nan") for r in rows],
                ":",
                color="#2f5bd3",
                alpha=0.45,
                lw=1,
            )
    left.set_xticks(deltas)
    left.set_xlabel("δ (keep screenshots scored ≥ δ)")
    left.set_ylabel("%")
    left.set_ylim(0, 100)
    left.set_title("Against the truth, per δ (dotted: agreement per agent)", fontsize=9)
    left.legend(fontsize=7)
    left.grid(alpha=0.3)
    right.bar(deltas, [r.kept for r in overall], 0.5, color="#aab4c5", label="screenshots kept")
    right.set_xticks(deltas)
    right.set_xlabel("δ")
    right.set_ylabel("screenshots kept")
    twin = right.twinx()
    twin.plot(
        deltas,
        [r.outcome_prompt_tokens for r in overall],
        "o-",
        color="#e0a800",
        label="outcome prompt tokens",
    )
    twin.set_ylabel("outcome prompt tokens")
    twin.set_ylim(bottom=0)
    right.set_title("What the outcome call reads, per δ", fontsize=9)
    handles = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(handles, [h.get_label() for h in handles], fontsize=7, loc="lower left")
    if banner:
        fig.suptitle(banner, fontsize=9, color="#b35c00")
    return png(fig)
