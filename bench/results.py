"""bench/RESULTS.md and bench/RESULTS.png, made whole from the row files in bench/rows/.

    .venv/bin/python -m bench.results [--rows bench/rows] [--out bench/RESULTS.md]

RESULTS.md opens with the headline figures of every row file in one table (RESULTS.png, beside it, plots
those that carry bars), then has one section per benchmark of bench/catalog.py, in its order: each of its
row files (by the time it was measured) with its tables, when, at which commit, by which command and on
which machine it ran, and its notes. Nothing in RESULTS.md is written by hand: a figure goes into a row
file (bench/record.py), and this makes the page again.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from bench.catalog import BENCHMARKS, BY_NAME, Benchmark
from bench.record import Headline, RowFile, RowFileError, read
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import atomic_output, write_text_atomic

BENCH = Path(__file__).resolve().parent
ROWS = BENCH / "rows"
RESULTS = BENCH / "RESULTS.md"
PLOT = "RESULTS.png"

Section = tuple[Benchmark, list[tuple[Path, RowFile]]]


def collect(folder: Path) -> list[Section]:
    """The row files of ``folder`` under their benchmarks, in the catalog's order."""
    found: dict[str, list[tuple[Path, RowFile]]] = {}
    for path in sorted(folder.glob("*.json")):
        name = path.name.split(".")[0]
        if name not in BY_NAME:
            raise RowFileError(
                f"{path}: no benchmark {name!r} in bench/catalog.py: a row file is named "
                "<benchmark>.json or <benchmark>.<label>.json"
            )
        found.setdefault(name, []).append((path, read(path)))
    return [(b, sorted(found[b.name], key=lambda f: f[1].measured)) for b in BENCHMARKS if b.name in found]


def anchor(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render(sections: list[Section], plotted: bool) -> str:
    lines = [
        "# keyshot benchmarks",
        "",
        "Made by `python -m bench.results` from the row files in [`bench/rows/`](rows/); nothing here is "
        "written by hand. `make bench` runs every benchmark that fits a CPU machine (bench/catalog.py), "
        "keeps each one's rows as `bench/rows/<name>.json` and makes this page again; a long run keeps its "
        "rows in a file of its own (`<name>.<label>.json`). Each ratio compares two measurements taken in "
        "the same run, on the machine named under it; absolute numbers are for orientation only.",
        "",
        "## At a glance",
        "",
        "| what | figure | measured | section |",
        "|---|---:|---|---|",
    ]
    for benchmark, files in sections:
        for _, run in files:
            link = f"[{benchmark.title}](#{anchor(benchmark.title)})"
            lines += [f"| {h.what} | {h.figure} | {run.measured[:10]} | {link} |" for h in run.rows.headlines]
    if plotted:
        lines += ["", f"![The headline figures, keyshot against its baseline]({PLOT})"]
    for benchmark, files in sections:
        script = f"[`bench/{benchmark.name}.py`]({benchmark.name}.py)"
        how = f"not run by `make bench`: {benchmark.not_run}" if benchmark.not_run else "run by `make bench`"
        lines += ["", f"## {benchmark.title}", "", f"{script}, {how}."]
        for path, run in files:
            for table in run.rows.tables:
                lines += ["", table.markdown()]
            lines += [
                "",
                f"Measured {run.measured}; commit {run.commit}; by `{run.command}`; {run.machine} "
                f"([`{path.name}`](rows/{path.name})).",
            ]
            for note in run.rows.notes:
                lines += ["", note]
    return "\n".join(lines) + "\n"


def plot(headlines: list[Headline], out: Path) -> None:
    """One panel per headline with bars, the baseline's bar grey."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [h.plot for h in headlines if h.plot]
    columns = min(len(panels), 2)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 2.4 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels, strict=False):
        labels = [label for label, _ in panel.bars][::-1]
        values = [value for _, value in panel.bars][::-1]
        colours = ["#1f77b4"] * (len(values) - 1) + ["#a0a0a0"]
        ax.barh(labels, values, color=colours)
        for y, value in enumerate(values):
            ax.text(value, y, f" {value:,.0f}" if value >= 100 else f" {value:.3g}", va="center", fontsize=9)
        ax.set_title(panel.title, fontsize=10, loc="left")
        ax.set_xlabel(panel.unit, fontsize=9)
        ax.set_xlim(0, max(values) * 1.25)
        ax.tick_params(labelsize=9)
        ax.spines[["top", "right"]].set_visible(False)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    with atomic_output(out) as fh:
        fig.savefig(fh, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)


def regenerate(rows: Path, out: Path) -> list[Path]:
    """Writes ``out`` (RESULTS.md) and RESULTS.png beside it from the row files in ``rows``."""
    sections = collect(rows)
    headlines = [h for _, files in sections for _, run in files for h in run.rows.headlines]
    written = []
    if any(h.plot for h in headlines):
        plot(headlines, out.parent / PLOT)
        written.append(out.parent / PLOT)
    else:  # no bars to draw: no picture of older rows either
        (out.parent / PLOT).unlink(missing_ok=True)
    written.insert(0, write_text_atomic(out, render(sections, plotted=bool(written))))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.results",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rows", type=Path, default=ROWS, help="the row files' folder")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        written = regenerate(args.rows, args.out)
    except KeyshotError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code
    print("wrote " + ", ".join(map(str, written)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
