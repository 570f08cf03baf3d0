"""The report's plots (PNG, matplotlib's Agg backend): score histogram, keyshot vs human success rate
per agent, and the confusion matrix of verdicts against ground truth. A plot without data says so."""

from __future__ import annotations

from collections import Counter

from keyshot.infer.common.text import shorten_middle
from keyshot.infer.loaders.trajectory import FAILURE, NOT_EXECUTABLE, SUCCESS, UNSURE
from keyshot.infer.metrics.compute import MetricsReport
from keyshot.infer.metrics.figures import figure, no_data, png
from keyshot.infer.runs.counts import OUTCOME_LABELS, OUTCOMES


def score_histogram(scores: list[int | None], threshold: float) -> bytes:
    """One bar per score 1-5 and one for the screenshots with no readable score (None: the answer held
    none, was cut, or the call failed)."""
    fig = figure()
    ax = fig.add_subplot(1, 1, 1)
    counts = Counter("no score" if s is None else str(s) for s in scores)
    if not scores:
        no_data(ax, "no screenshot was scored")
    else:
        labels = ["1", "2", "3", "4", "5", "no score"]
        colors = [
            "#e0a800" if lb == "no score" else "#aab4c5" if float(lb) < threshold else "#2f5bd3"
            for lb in labels
        ]
        heights = [counts.get(lb, 0) for lb in labels]
        ax.bar(labels, heights, color=colors)
        for x, h in enumerate(heights):
            if h:
                ax.text(x, h, str(h), ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, max(heights) * 1.15)
        ax.set_ylabel("screenshots")
        ax.set_title(
            f"Screenshot scores (blue: kept, score ≥ {threshold:g}; amber: no readable score)", fontsize=9
        )
        ax.grid(axis="y", alpha=0.3)
    return png(fig)


def agent_success_rates(report: MetricsReport | None) -> bytes:
    import numpy as np

    rows = [r for r in report.agreement if r.scope == "agent" and r.n] if report else []
    fig = figure(max(5.2, 1.1 * len(rows) + 2.5))
    ax = fig.add_subplot(1, 1, 1)
    if not rows:
        no_data(ax, "no ground truth to compare with")
        return png(fig)
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [100 * (r.judge_sr or 0) for r in rows], 0.4, label="keyshot", color="#2f5bd3")
    ax.bar(x + 0.2, [100 * (r.human_sr or 0) for r in rows], 0.4, label="ground truth", color="#8fa3c7")
    ax.set_xticks(x)
    ax.set_xticklabels(
        [shorten_middle(r.group, 22) for r in rows],
        rotation=20,
        ha="right",
        fontsize=8,
    )
    ax.set_ylim(0, 100)
    ax.set_ylabel("success rate %")
    ax.set_title("Success rate per agent: keyshot vs ground truth", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    return png(fig)


def confusion_matrix(pairs: list[tuple[str, str]]) -> bytes:
    """``pairs`` of (outcome, ground-truth word) for the trajectories that have ground truth; the rows are
    the outcomes of :mod:`keyshot.infer.runs.counts` (a verdict judged without readable scores is counted
    under "no readable scores", as everywhere)."""
    fig = figure(4.6, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    if not pairs:
        no_data(ax, "no ground truth to compare with")
        return png(fig)
    rows = list(OUTCOMES)
    cols = sorted({t for _, t in pairs}, key=[SUCCESS, FAILURE, NOT_EXECUTABLE, UNSURE].index)
    counts = Counter(pairs)
    grid = [[counts.get((r, c), 0) for c in cols] for r in rows]
    ax.imshow(grid, cmap="Blues")
    top = max(max(r) for r in grid) or 1
    for i in range(len(rows)):
        for j in range(len(cols)):
            dark = grid[i][j] > 0.5 * top
            ax.text(
                j,
                i,
                str(grid[i][j]),
                ha="center",
                va="center",
                fontsize=10,
                color="white" if dark else "#1d2330",
            )
    ax.set_xticks(range(len(cols)))
    ax.set_xticklabels([c.replace("_", " ") for c in cols], fontsize=8)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([OUTCOME_LABELS[r] for r in rows], fontsize=8)
    ax.set_xlabel("ground truth")
    ax.set_ylabel("keyshot verdict")
    ax.set_title("Verdicts vs ground truth", fontsize=10)
    return png(fig)
