"""bench/RESULTS.md and bench/RESULTS.png, made whole from the row files in bench/rows/.

    .venv/bin/python -m bench.results [--rows bench/rows] [--out bench/RESULTS.md]

RESULTS.md opens with the headline figures of every row file in one table (RESULTS.png, beside it, plots
those that carry bars), then has one section per benchmark of bench/catalog.py, in its order: each of its
row files (by the time it was measured) with its tables, when, at which commit, by which command and on
which machine it ran, and its notes. Nothing in RESULTS.md is written by hand: a figure goes into a row
file (bench/record.py), and this makes the page again.

RESULTS-gpu.md, the GPU kit's own page, is made the same way from bench/rows/gpu/: one row file a lent GPU
machine's run (``python -m bench.gpu --json OUT/gpu.json`` writes ``OUT/gpu.rows.json``), newest first.
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
#: The GPU kit's page, beside RESULTS.md, and its row files (a folder of ROWS: RESULTS.md reads only its files).
GPU_PAGE = "RESULTS-gpu.md"
GPU_ROWS = "gpu"
GPU_RERUN = """## How to rerun (issue 57's rows)

The kit's defaults are the rows issue 57 asks for: the shipped LoRA config; LoRA with `lora.fused`
checkpointing every layer, then every second layer; `lora.fused` without checkpointing at the token caps
8,192 and 16,384 with 4,096-token rows (peak memory); the full fine-tune with its optimizer amortised as the
recipe's; the tower at batch 1 and 8 without host syncs and in CUDA graphs; the in-process scorer at batch 1
and 8. Every training row runs the recipe's `train_step` and prints its timed step over its profiled step.
Nothing below is measured yet: the sections after this one are the earlier leases' records.

```bash
# here: the code as committed, and wheels of what the lent machine lacks (openai, httpx2, pydantic,
# datasets, dill, multiprocess, ..., and liger-kernel with triton for the switches' rows) in .whl/
git archive --format=tar HEAD > /tmp/keyshot.tar      # plus .whl/ carried beside it (under 64 MiB in all)
# there: one call (the CUDA tests at most 150 s, then the kit at most 400 s), then give the machine back
KEYSHOT_COMMIT=$(git rev-parse HEAD) bash bench/gpu_session.sh $OUT
# a rerun of the kit alone after a change to it (the tests skipped), or of some rows:
GPU_TESTS=0 KEYSHOT_COMMIT=... bash bench/gpu_session.sh $OUT --train "lora+fused=lora:lora.fused=true,unchecked_token_cap=null"
```

`$OUT/gpu.rows.json` then goes to `bench/rows/gpu/<date>.json` (its `title` says what the run was) and
`python -m bench.results` makes this page again; `$OUT/gpu.json` replaces `bench/RESULTS-gpu.json`, and
`$OUT/kit.md` is the run's report as the kit printed it. `$OUT/tests.txt` holds the CUDA tests' outcome,
`$OUT/kit.log` the kit's log. A target missed says why from the row's profile (its phases, its language model
against the GEMM rate)."""

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
            lines += run_lines(run, f"rows/{path.name}")
    return "\n".join(lines) + "\n"


def run_lines(run: RowFile, link: str) -> list[str]:
    """One run on a page: its tables, what ran (its row file linked as ``link``), its notes."""
    lines = []
    for table in run.rows.tables:
        lines += ["", table.markdown()]
    lines += [
        "",
        f"Measured {run.measured}; commit {run.commit}; by `{run.command}`; {run.machine} "
        f"([`{link.rpartition('/')[2]}`]({link})).",
    ]
    for note in run.rows.notes:
        lines += ["", note]
    return lines


def render_gpu(files: list[tuple[Path, RowFile]]) -> str:
    """The GPU kit's page: how to rerun it, then each run's row file, newest first."""
    lines = [
        "# keyshot on a GPU: the 7B shape, measured (bench/gpu.py)",
        "",
        f"Made by `python -m bench.results` from the row files in [`bench/rows/{GPU_ROWS}/`](rows/{GPU_ROWS}/), "
        "one a lent GPU machine's run; nothing here is written by hand.",
        "",
        GPU_RERUN,
    ]
    for path, run in sorted(files, key=lambda f: f[1].measured, reverse=True):
        lines += ["", f"## {run.measured[:10]}: {run.title or run.machine}"]
        lines += run_lines(run, f"rows/{GPU_ROWS}/{path.name}")
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
    """Writes ``out`` (RESULTS.md) and RESULTS.png beside it from the row files in ``rows``, and the GPU kit's
    page (RESULTS-gpu.md) beside them from those in ``rows/gpu/``."""
    sections = collect(rows)
    headlines = [h for _, files in sections for _, run in files for h in run.rows.headlines]
    written = []
    if any(h.plot for h in headlines):
        plot(headlines, out.parent / PLOT)
        written.append(out.parent / PLOT)
    else:  # no bars to draw: no picture of older rows either
        (out.parent / PLOT).unlink(missing_ok=True)
    written.insert(0, write_text_atomic(out, render(sections, plotted=bool(written))))
    gpu_runs = [(path, read(path)) for path in sorted((rows / GPU_ROWS).glob("*.json"))]
    if gpu_runs:
        written.append(write_text_atomic(out.parent / GPU_PAGE, render_gpu(gpu_runs)))
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
