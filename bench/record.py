"""A benchmark's record: the rows it writes beside its JSON output, which bench/RESULTS.md is made from.

A benchmark's ``rows_of(figures)`` turns what it measured (its JSON) into :class:`Rows`: its tables, its
headline figures (the table at the top of RESULTS.md, with a bar plot where one says it better) and notes on
how it was measured. :func:`finish` prints them, and, given ``--json FILE`` (:func:`json_option`), saves the
benchmark's JSON there and, beside it, its row file (``X.json`` → ``X.rows.json``) with what ran: when, at
which commit, the command and the machine.
``python -m bench`` keeps each run's row file as ``bench/rows/<name>.json``; ``python -m bench.results``
reads every file there (:func:`read`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic

REPO = Path(__file__).resolve().parents[1]
# A benchmark imports this module as it starts: its run starts here.
STARTED = time.time()
LOAD_AT_START = os.getloadavg()[0]


class RowFileError(KeyshotError):
    """A row file that cannot be read: the message names the file and field."""


@dataclass(frozen=True)
class Table:
    """A table of a benchmark's section: its own columns, each cell a string as it is shown."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    align: str = ""  # "l" or "r" per column; empty: the first column left, the others right
    title: str = ""  # a line above the table, where it needs one

    def markdown(self) -> str:
        align = self.align or "l" + "r" * (len(self.columns) - 1)
        rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
        table = "\n".join(
            ["| " + " | ".join(self.columns) + " |", rule, *("| " + " | ".join(r) + " |" for r in self.rows)]
        )
        return f"{self.title}\n\n{table}" if self.title else table


def ratio_table(rows: list[tuple[str, str, str]]) -> Table:
    """The usual table: what is compared with what, the ratio, and the figures behind it."""
    return Table(("comparison", "ratio", "detail"), tuple(rows), "lrl")


@dataclass(frozen=True)
class Plot:
    """Bars of one panel of RESULTS.png, the baseline's first."""

    title: str
    unit: str
    bars: tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Headline:
    """A figure for the table at the top of RESULTS.md: what keyshot does against what, and the figure."""

    what: str
    figure: str
    plot: Plot | None = None


@dataclass(frozen=True)
class Rows:
    """What a benchmark says about one run of it."""

    tables: tuple[Table, ...]
    headlines: tuple[Headline, ...] = ()
    notes: tuple[str, ...] = ()  # Markdown paragraphs: how it was measured, what the figures mean


@dataclass(frozen=True)
class RowFile:
    """A row file: a run's rows and what ran."""

    rows: Rows
    measured: str  # "YYYY-MM-DD HH:MM[-HH:MM] UTC": files under one heading are shown in this order
    commit: str
    command: str
    machine: str
    title: str = ""  # what the run was, where its page heads each run with it (RESULTS-gpu.md)


def json_option(parser: argparse.ArgumentParser) -> None:
    """The ``--json FILE`` option of every benchmark (``python -m bench`` passes it): :func:`finish` writes
    the figures there and their rows beside them."""
    parser.add_argument(
        "--json",
        type=Path,
        help="write the figures to this JSON file, and their rows beside it (X.rows.json)",
    )


def rows_path(json_path: Path) -> Path:
    """Where a benchmark writes its rows: beside its JSON (``X.json`` → ``X.rows.json``)."""
    return json_path.with_name(json_path.name.removesuffix(".json") + ".rows.json")


def finish(
    json_path: Path | None,
    data: dict,
    rows_of: Callable[[dict], Rows],
    module: str,
    argv: list[str] | None,
    code: int = 0,
) -> int:
    """A benchmark's last step: prints its rows (made from ``data`` as its JSON holds it, so they can be made
    again from the JSON alone) and, given ``json_path``, writes ``data`` there and the row file beside it.
    ``module`` is the benchmark's (its ``__spec__.name``), ``argv`` its arguments (None: the command
    line's). Returns ``code``, the benchmark's exit status."""
    text = json.dumps(data, indent=2, default=str) + "\n"
    rows = rows_of(json.loads(text))
    print("\n\n".join([*(t.markdown() for t in rows.tables), *rows.notes]), flush=True)
    if json_path is not None:
        write_text_atomic(json_path, text)
        write_text_atomic(rows_path(json_path), dumps(row_file(rows, module, argv)))
    return code


def markdown_notes(text: str) -> tuple[str, ...]:
    """A Markdown text as a row file's notes: its blank-line-separated blocks, a fenced block kept whole."""
    notes, block, fenced = [], [], False
    for line in text.split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        if line or fenced:
            block.append(line)
        elif block:
            notes.append("\n".join(block))
            block = []
    if block:
        notes.append("\n".join(block))
    return tuple(notes)


def row_file(rows: Rows, module: str, argv: list[str] | None, title: str = "") -> RowFile:
    """``rows`` with what ran: when (since this module was imported), the commit, the command and the machine."""
    args = sys.argv[1:] if argv is None else argv
    return RowFile(rows, _measured(), commit(), " ".join(["python", "-m", module, *args]), _machine(), title)


def _measured() -> str:
    start, end = (time.strftime("%Y-%m-%d %H:%M", time.gmtime(t)) for t in (STARTED, time.time()))
    if end == start:
        return f"{start} UTC"
    return f"{start}-{end[11:] if end[:10] == start[:10] else end} UTC"


def commit() -> str:
    """The code measured: ``$KEYSHOT_COMMIT`` (a packed archive has no .git, bench/gpu_session.sh), else the
    checkout's HEAD, said with uncommitted changes; "unknown" without git."""
    if named := os.environ.get("KEYSHOT_COMMIT"):
        return named

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        except OSError:  # no git: the commit is unknown
            return ""
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (
        " with uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    )


def _machine() -> str:
    load = f"{LOAD_AT_START:.1f}-{os.getloadavg()[0]:.1f}"
    return (
        f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
        f"load average {load} (start-end)"
    )


def dumps(run: RowFile) -> str:
    """A row file's text: JSON, a table row or a list of strings on one line each."""
    rows = run.rows
    tables = []
    for t in rows.tables:
        table = {"title": t.title} if t.title else {}
        tables.append(
            table | {"columns": list(t.columns), "align": t.align, "rows": [list(r) for r in t.rows]}
        )
    headlines = []
    for h in rows.headlines:
        plot = (
            {"title": h.plot.title, "unit": h.plot.unit, "bars": [list(b) for b in h.plot.bars]}
            if h.plot
            else {}
        )
        headlines.append({"what": h.what, "figure": h.figure} | ({"plot": plot} if plot else {}))
    data = {"measured": run.measured, "commit": run.commit, "command": run.command, "machine": run.machine}
    data |= {"title": run.title} if run.title else {}
    data["tables"] = tables
    data |= {"headlines": headlines} if headlines else {}
    data |= {"notes": list(rows.notes)} if rows.notes else {}
    return _json(data, "") + "\n"


def _json(value: object, indent: str) -> str:
    inner = indent + "  "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {_json(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + f"\n{indent}}}"
    one_line = json.dumps(value, ensure_ascii=False)
    if isinstance(value, list) and (any(isinstance(v, (dict, list)) for v in value) or len(one_line) > 110):
        return "[\n" + ",\n".join(inner + _json(v, inner) for v in value) + f"\n{indent}]"
    return one_line


def read(path: Path) -> RowFile:
    """A row file; one that is not one raises RowFileError naming the file and the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RowFileError(f"{path}: not a row file ({exc}); write it with bench.record.finish") from None
    check = _Check(path)
    top = check.object(
        data,
        "the file",
        ("measured", "commit", "command", "machine", "tables"),
        ("headlines", "notes", "title"),
    )
    tables = []
    for i, value in enumerate(check.list(top["tables"], "tables")):
        where = f"tables[{i}]"
        table = check.object(value, where, ("columns", "rows"), ("align", "title"))
        columns = check.strings(table["columns"], f"{where}.columns")
        align = check.string(table.get("align", ""), f"{where}.align")
        if align and (len(align) != len(columns) or set(align) - {"l", "r"}):
            raise check.fail(f"{where}.align", f"one 'l' or 'r' per column ({len(columns)})")
        rows = [
            check.strings(row, f"{where}.rows[{j}]") for j, row in enumerate(check.list(table["rows"], where))
        ]
        for j, cells in enumerate(rows):
            if len(cells) != len(columns):
                raise check.fail(f"{where}.rows[{j}]", f"{len(cells)} cells for {len(columns)} columns")
        tables.append(
            Table(columns, tuple(rows), align, check.string(table.get("title", ""), f"{where}.title"))
        )
    headlines = []
    for i, value in enumerate(check.list(top.get("headlines", []), "headlines")):
        where = f"headlines[{i}]"
        headline = check.object(value, where, ("what", "figure"), ("plot",))
        plot = None
        if "plot" in headline:
            p = check.object(headline["plot"], f"{where}.plot", ("title", "unit", "bars"), ())
            bars = []
            for j, bar in enumerate(check.list(p["bars"], f"{where}.plot.bars")):
                if not (
                    isinstance(bar, list) and len(bar) == 2 and isinstance(bar[0], str)
                ) or not isinstance(bar[1], (int, float)):
                    raise check.fail(f"{where}.plot.bars[{j}]", "a [label, number] pair")
                bars.append((bar[0], float(bar[1])))
            title, unit = (check.string(p[k], f"{where}.plot.{k}") for k in ("title", "unit"))
            plot = Plot(title, unit, tuple(bars))
        what, figure = (check.string(headline[k], f"{where}.{k}") for k in ("what", "figure"))
        headlines.append(Headline(what, figure, plot))
    notes = check.strings(top.get("notes", []), "notes")
    rows = Rows(tuple(tables), tuple(headlines), notes)
    what = (check.string(top[k], k) for k in ("measured", "commit", "command", "machine"))
    return RowFile(rows, *what, check.string(top.get("title", ""), "title"))


class _Check:
    """The checks of a row file's JSON, each failure one line naming the file and the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, what: str) -> RowFileError:
        return RowFileError(f"{self.path}: {where}: {what} (bench/record.py says what a row file holds)")

    def object(self, value: object, where: str, required: tuple[str, ...], optional: tuple[str, ...]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(where, "not an object")
        missing = [k for k in required if k not in value]
        if missing:
            raise self.fail(where, f"missing {', '.join(missing)}")
        unknown = sorted(set(value) - set(required) - set(optional))
        if unknown:
            raise self.fail(where, f"unknown field {', '.join(unknown)}")
        return value

    def list(self, value: object, where: str) -> list:
        if not isinstance(value, list):
            raise self.fail(where, "not a list")
        return value

    def strings(self, value: object, where: str) -> tuple[str, ...]:
        if not all(isinstance(v, str) for v in self.list(value, where)):
            raise self.fail(where, "not a list of strings")
        return tuple(value)

    def string(self, value: object, where: str) -> str:
        if not isinstance(value, str):
            raise self.fail(where, "not a string")
        return value
