"""The dataset card: ``README.md`` in the dataset folder, with a score histogram (``scores.png``).

It states what training needs to trust the data: counts per split, agent and score; how the rows
were split (the unit and why, requested and achieved fractions, trajectories kept together because
they share screenshots) and the duplicate rows collapsed; each teacher's score distribution; inter-teacher agreement; what aggregation dropped and why; the money spent; and
the prompt version, image policy and data hash that training writes into the checkpoint.
"""

from __future__ import annotations

import io
import logging
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from keyshot.data_synth.agreement import pairwise_agreement
from keyshot.data_synth.labels import StoreContents
from keyshot.data_synth.run_folder import read_usage
from keyshot.infer.common.fileio import write_bytes_atomic

if TYPE_CHECKING:
    from keyshot.data_synth.aggregate import AggregationReport
    from keyshot.data_synth.dataset_meta import DatasetMeta

logger = logging.getLogger(__name__)

CARD_FILE = "README.md"
PLOT_FILE = "scores.png"
SCORES = (1, 2, 3, 4, 5)


def _fmt(x: float) -> str:
    return "n/a" if isinstance(x, float) and math.isnan(x) else f"{x:.3f}"


def _pct(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.1f}%)" if total else str(n)


def teacher_histograms(contents: StoreContents) -> dict[str, dict[int, int]]:
    """Valid scores per teacher, over every label in the run."""
    hist: dict[str, dict[int, int]] = {}
    for label in contents.labels.values():
        if label.valid and label.score in SCORES:
            h = hist.setdefault(label.teacher, {s: 0 for s in SCORES})
            h[label.score] += 1
    return dict(sorted(hist.items()))


def plot_scores(path: Path, teachers: dict[str, dict[int, int]], dataset: dict[int, int]) -> None:
    """Bar chart of score shares: one group per score, one bar per teacher plus the dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = dict(teachers)
    series["dataset (consensus)"] = dataset
    fig, ax = plt.subplots(figsize=(7, 3.6), dpi=100)
    width = 0.8 / max(1, len(series))
    for i, (name, hist) in enumerate(series.items()):
        total = sum(hist.values()) or 1
        xs = [s + (i - (len(series) - 1) / 2) * width for s in SCORES]
        ax.bar(xs, [hist.get(s, 0) / total for s in SCORES], width=width, label=f"{name} (n={total})")
    ax.set_xticks(list(SCORES))
    ax.set_xlabel("score")
    ax.set_ylabel("share of screenshots")
    ax.set_title("Key-screenshot scores per teacher and in the dataset")
    ax.legend(fontsize=7)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_bytes_atomic(path, buffer.getvalue())


_UNITS = {
    "agent": "by agent: no agent's trajectories are in two splits",
    "task group": "by task group: no task's trajectories are in two splits",
    "agent lists": "by the agents listed per split in the build config",
}


def split_section(meta: DatasetMeta) -> list[str]:
    """How the rows were split (unit, requested and achieved fractions, what was kept together) and
    what was collapsed as duplicates."""
    info, dup = meta.splits, meta.duplicates
    if "unit" not in info:  # a dataset built before splits said how
        return []
    lines = ["", "## Splits", "", f"Split {_UNITS.get(info['unit'], info['unit'])}."]
    if info.get("reason"):
        lines.append(
            f"The agent split could not meet the requested fractions ({info['reason']}), so the rows are "
            "split by task group, each kept in its agent's split where that split had room "
            f"({info.get('moved', 0)} trajectories placed outside it)."
        )
    elif info.get("moved"):
        lines.append(
            f"{info['moved']} trajectories were placed outside their agent's split to keep a group whole."
        )
    requested, achieved = info.get("requested", {}), info.get("achieved", {})
    lines += ["", "| split | requested | achieved | rows |", "|---|---:|---:|---:|"]
    for split in achieved:
        want = f"{requested[split]:.3f}" if split in requested else "listed"
        lines.append(f"| {split} | {want} | {achieved[split]:.3f} | {meta.rows.get(split, 0)} |")
    lines += [
        "",
        f"- trajectories that share a screenshot are kept in one split: {info.get('shared_screenshots', 0)} "
        f"screenshots appear in more than one trajectory, {info.get('grouped_trajectories', 0)} trajectories "
        f"were grouped with another because of them ({info.get('groups', 0)} groups in all)",
        f"- screenshots in more than one split: {info.get('screenshots_in_two_splits', 0)}",
        f"- duplicate rows collapsed: {dup.get('rows_collapsed', 0)} rows were identical to another (same "
        "screenshot bytes, same request) and are counted in that row's `count` column (a trainer may weight "
        f"a row by it); {dup.get('score_conflicts', 0)} of them had another consensus score than the row kept",
    ]
    return lines


def render_card(
    run_dir: Path,
    contents: StoreContents,
    meta: DatasetMeta,
    report: AggregationReport,
    rows_written: dict[str, dict[tuple[str, int], int]],
    unreadable: list[str],
) -> str:
    total_rows = sum(sum(c.values()) for c in rows_written.values())
    lines = [
        "---",
        "tags: [keyshot, webjudge, web-agents, reward-model]",
        "keyshot:",
        f"  prompt_version: {meta.prompt_version}",
        f"  data_hash: {meta.data_hash}",
        "---",
        "",
        "# keyshot key-screenshot scorer dataset",
        "",
        "Each row is one screenshot of a web-agent trajectory with the WebJudge key-screenshot request",
        "(`messages`, image in the `image` column) and the target answer aggregated from teacher judges.",
        "",
        f"- prompt set: `{meta.prompt_variant}`, version `{meta.prompt_version}`",
        f"- image policy: `{meta.image_policy}`",
        f"- data hash: `{meta.data_hash}`",
        f"- teachers: {', '.join(f'`{t}`' for t in meta.teachers)}",
        f"- rows: {total_rows} ({', '.join(f'{s}: {n}' for s, n in meta.rows.items())})",
        "",
        'Load: `datasets.load_from_disk(PATH)`. Publish: `datasets.load_from_disk(PATH).push_to_hub("org/name")`.',
        "",
        "## Rows per split, agent and score",
        "",
        "| split | agent | " + " | ".join(f"score {s}" for s in SCORES) + " | rows |",
        "|---|---|" + "---:|" * (len(SCORES) + 1),
    ]
    overall: Counter[int] = Counter()
    for split, counts in rows_written.items():
        for agent in sorted({a for a, _ in counts}):
            per = [counts.get((agent, s), 0) for s in SCORES]
            overall.update({s: n for s, n in zip(SCORES, per, strict=True)})
            lines.append(f"| {split} | {agent} | " + " | ".join(map(str, per)) + f" | {sum(per)} |")
        split_total = [sum(n for (_, sc), n in counts.items() if sc == s) for s in SCORES]
        lines.append(
            f"| **{split}** | all | " + " | ".join(map(str, split_total)) + f" | {sum(split_total)} |"
        )
    lines += split_section(meta)
    lines += [
        "",
        f"![scores]({PLOT_FILE})",
        "",
        "## Score distribution per teacher (valid labels) and in the dataset",
        "",
        "| source | " + " | ".join(f"score {s}" for s in SCORES) + " | n |",
        "|---|" + "---:|" * (len(SCORES) + 1),
    ]
    for teacher, hist in teacher_histograms(contents).items():
        n = sum(hist.values())
        lines.append(f"| {teacher} | " + " | ".join(_pct(hist[s], n) for s in SCORES) + f" | {n} |")
    n = sum(overall.values())
    lines.append(
        "| **dataset (consensus)** | " + " | ".join(_pct(overall[s], n) for s in SCORES) + f" | {n} |"
    )

    lines += ["", "## Inter-teacher agreement", ""]
    pairs = pairwise_agreement(contents)
    if pairs:
        lines += [
            "On the screenshots both teachers labelled validly. Kappa: Cohen's, plain / linear / quadratic weights.",
            "",
            "| teacher A | teacher B | n | exact | kappa | kappa (linear) | kappa (quadratic) | Spearman |",
            "|---|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p in pairs:
            lines.append(
                f"| {p.teacher_a} | {p.teacher_b} | {p.n} | {_fmt(p.exact)} | {_fmt(p.kappa)} | "
                f"{_fmt(p.kappa_linear)} | {_fmt(p.kappa_quadratic)} | {_fmt(p.spearman)} |"
            )
    else:
        lines.append("Only one teacher: no agreement to report.")

    lines += ["", "## Aggregation", "", f"Settings: `{report.config}`", ""]
    lines += [f"- screenshots with labels: {report.steps_labelled}"]
    for reason, count in sorted(report.dropped.items()):
        lines.append(f"- dropped, {reason}: {count}")
    if unreadable:
        lines.append(f"- dropped, unreadable screenshot: {len(unreadable)}")
    for teacher, counts in sorted(report.teacher_labels.items()):
        lines.append(
            f"- teacher `{teacher}`: {counts['valid']} valid, {counts['invalid']} invalid or failed labels"
        )
    for reason, count in sorted(report.invalid_reasons.items()):
        lines.append(f"  - invalid label reason `{reason}`: {count}")
    for teacher, count in sorted(report.target_teachers.items()):
        lines.append(f"- target text from `{teacher}`: {count} rows")

    lines += ["", "## Cost", ""]
    usage = read_usage(run_dir)
    imported = sum(1 for lb in contents.labels.values() if lb.source.startswith("import"))
    if usage:
        lines += [
            "| endpoint | calls | HTTP requests | cache hits | failures | prompt tokens | completion tokens | cost $ |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name, u in sorted(usage.items()):
            lines.append(
                f"| {name} | {int(u.get('calls', 0))} | {int(u.get('requests', 0))} | {int(u.get('cache_hits', 0))} | "
                f"{int(u.get('failures', 0))} | {int(u.get('prompt_tokens', 0))} | {int(u.get('completion_tokens', 0))} | "
                f"{u.get('cost_usd', 0.0):.4f} |"
            )
        lines.append(f"\nTotal spent: ${sum(u.get('cost_usd', 0.0) for u in usage.values()):.4f}.")
    else:
        lines.append("No API calls were made for this dataset.")
    if imported:
        lines.append(f"{imported} labels were imported from existing WebJudge logs at no cost.")
    lines.append("")
    return "\n".join(lines)


def write_card(dataset_dir: Path, card: str, contents: StoreContents, rows_written: dict) -> Path:
    """The dataset's README.md (``card``, :func:`render_card`) and its score plot."""
    overall: Counter[int] = Counter()
    for counts in rows_written.values():
        for (_, score), n in counts.items():
            overall[score] += n
    plot_scores(dataset_dir / PLOT_FILE, teacher_histograms(contents), {s: overall[s] for s in SCORES})
    path = dataset_dir / CARD_FILE
    write_bytes_atomic(path, card.encode("utf-8"))
    return path
