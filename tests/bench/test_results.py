"""bench/RESULTS.md is made whole from the row files in bench/rows/ (bench/results.py): the committed page is
that regeneration, no row of any row file is left out of it, the recorded long runs and hand-kept sections
are there, and a benchmark run writes the rows the page is made from beside its JSON."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from bench.catalog import BY_NAME
from bench.record import RowFileError, read, rows_path
from bench.results import ROWS, collect, main, regenerate
from tests.support.paths import REPO

BENCH = REPO / "bench"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("results") / "RESULTS.md"
    written = regenerate(ROWS, out)
    return out, written


def test_the_committed_page_is_the_regeneration(page):
    out, written = page
    assert written == [out, out.parent / "RESULTS.png", out.parent / "RESULTS-gpu.md"]
    assert out.read_text(encoding="utf-8") == (BENCH / "RESULTS.md").read_text(encoding="utf-8"), (
        "bench/RESULTS.md differs from what its row files make: add figures as row files in bench/rows/ and "
        "run `python -m bench.results`"
    )
    with Image.open(out.parent / "RESULTS.png") as made, Image.open(BENCH / "RESULTS.png") as committed:
        assert made.format == committed.format == "PNG" and made.size == committed.size


def test_the_gpu_page_is_the_regeneration_of_its_row_files(page):
    """bench/RESULTS-gpu.md is made from bench/rows/gpu/ as RESULTS.md from bench/rows/: newest run first,
    every note of every run on it."""
    made = (page[0].parent / "RESULTS-gpu.md").read_text(encoding="utf-8")
    assert made == (BENCH / "RESULTS-gpu.md").read_text(encoding="utf-8"), (
        "bench/RESULTS-gpu.md differs from what bench/rows/gpu/ makes: add the run's row file there and run "
        "`python -m bench.results`"
    )
    runs = sorted(((read(p), p) for p in (ROWS / "gpu").glob("*.json")), key=lambda r: r[0].measured)
    assert len(runs) >= 2
    for run, path in runs:
        assert f"## {run.measured[:10]}: {run.title}" in made and f"(rows/gpu/{path.name})" in made
        assert all(note in made for note in run.rows.notes)
    newest, oldest = runs[-1][0], runs[0][0]
    assert made.index(newest.title) < made.index(oldest.title)


def test_every_row_of_every_row_file_reaches_the_page(page):
    text = page[0].read_text(encoding="utf-8")
    files = sorted(ROWS.glob("*.json"))
    assert files and sum(len(f) for _, f in collect(ROWS)) == len(files)
    for path in files:
        run = read(path)
        assert f"(rows/{path.name})" in text and run.measured in text and run.command in text
        for table in run.rows.tables:
            assert table.markdown() in text, f"{path.name}: a table left out"
        for headline in run.rows.headlines:
            assert f"| {headline.what} | {headline.figure} |" in text, f"{path.name}: a headline left out"
        for note in run.rows.notes:
            assert note in text, f"{path.name}: a note left out"
    assert (
        text.index("## At a glance") < text.index("](RESULTS.png)") < text.index("\n## ", text.index("## At"))
    )


# The hand-kept sections and rows of the page before it was made from row files (8e75e94), and the long runs:
# their row files are of their own (<name>.<label>.json, or a benchmark make bench does not run), so their
# figures stay on the page whatever make bench writes next.
RECORDED = {
    "Image policy": ["| 1.26× |", "| 0.33-1.03× |", "decompression bombs", "+3,407 MiB"],
    "Threshold sweep": ["| 720 (576 / 72 / 72) | 1,331,805 | 95.6 | 17.6× / 5.5× / 15.6× |"],
    "Constrained answers": ["| key_points | 512 | 1000 / 0 | 512 / 77 | 1.031 / 0.265 | 0.26× | 2.18×"],
    "Live episodes": ["trained (was: refused)", "peak PSS 8,561 MiB"],
    "Live pages per Chromium": ["48.9 MiB a page", "128 pages in two 6,927"],
    "The reward env's memory per session": ["5.6 MiB a session (0.07× the 75 MiB"],
    "A step's buffers in the reward env": ["| 0.21× | 7.4 vs 35.9 MiB a session"],
    "TRL's BrowserGym example on keyshot reward env": [
        "refused at start, one line",
        "**21,221 MiB PSS**",
        "**the server's tree peaked at 16,145 MiB PSS",
        "took **4,160 s**",
    ],
    "One step at OpenEnv's client": ["| 2.01 (0.40x) |"],
    "Live soak": ["| 0.86× |", "| 1.06× |", "The previous floor's soak row"],
    "The GPU kit": ["| 0.35× | 20.8 vs 59.5 GiB |", "[RESULTS-gpu.md](RESULTS-gpu.md)"],
}


@pytest.mark.parametrize("title", RECORDED)
def test_recorded_sections_and_long_runs_stay(page, title):
    text = page[0].read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    section = text[start : text.find("\n## ", start + 1)]
    for figure in RECORDED[title]:
        assert figure in section, f"{title}: {figure!r} lost"


def test_the_headline_plot_draws_the_three_pictures(page):
    panels = [
        h.plot.title for _, files in collect(ROWS) for _, run in files for h in run.rows.headlines if h.plot
    ]
    assert any("Rewarding" in p for p in panels) and any("sessions per GiB" in p for p in panels)
    assert sum("7B shape" in p for p in panels) == 2  # LoRA against the full fine-tune
    with Image.open(page[0].parent / "RESULTS.png") as png:
        assert png.size == (1280, 240 * ((len(panels) + 1) // 2))


def test_a_row_file_that_is_not_one_is_named(tmp_path, capsys):
    (tmp_path / "report.json").write_text(
        json.dumps({"measured": "x", "commit": "y", "command": "z", "tables": []})
    )
    with pytest.raises(RowFileError, match=r"report\.json: the file: missing machine"):
        collect(tmp_path)
    (tmp_path / "report.json").unlink()
    (tmp_path / "benchmark.json").write_text((ROWS / "report.json").read_text())
    assert main(["--rows", str(tmp_path), "--out", str(tmp_path / "RESULTS.md")]) == 2
    err = capsys.readouterr().err.strip()
    assert "benchmark.json: no benchmark 'benchmark' in bench/catalog.py" in err and "\n" not in err
    assert not (tmp_path / "RESULTS.md").exists()


def test_a_benchmark_writes_its_rows_beside_its_json(tmp_path):
    """bench/report.py, small: its JSON, its row file beside it, and the page made from that row file."""
    out = tmp_path / "runs" / "report.json"
    argv = ["--trajectories", "3", "--screenshots", "2", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "bench.report", *argv], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    figures = json.loads(out.read_text())
    run = read(rows_path(out))
    assert rows_path(out).name == "report.rows.json"
    assert run.command == "python -m bench.report " + " ".join(argv)
    (row,) = run.rows.tables[0].rows
    assert (
        row[1] == f"{figures['ratio_first_over_cached']:.2f}×" and "3 trajectories × 2 screenshots" in row[2]
    )
    assert run.measured.endswith(" UTC") and run.commit and "CPUs" in run.machine
    (tmp_path / "rows").mkdir()
    (tmp_path / "rows" / "report.json").write_text(rows_path(out).read_text())
    regenerate(tmp_path / "rows", tmp_path / "RESULTS.md")
    text = (tmp_path / "RESULTS.md").read_text()
    assert f"## {BY_NAME['report'].title}\n" in text and run.rows.tables[0].markdown() in text
    assert not (tmp_path / "RESULTS.png").exists()  # no headline with bars: no plot
