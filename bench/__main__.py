"""Every benchmark that fits a CPU machine, then bench/RESULTS.md made again from all the rows (make bench).

    .venv/bin/python -m bench [--only calls,images] [--work runs/bench]

Each benchmark of bench/catalog.py that is not marked ``not_run`` runs as ``python -m bench.<name> ARGS
--json WORK/<name>.json`` (its output in WORK/<name>.log); the rows it writes beside that JSON replace
bench/rows/<name>.json, even when it exits 1 on a missed target (they record the miss). The command exits 1
naming every benchmark that failed; one that wrote no rows keeps its previous ones.
The long ones and the GPU kit are not run: their row files stay as they are. Then bench/results.py makes
RESULTS.md and RESULTS.png whole from bench/rows/.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from bench.catalog import BENCHMARKS, BY_NAME
from bench.record import REPO, read, rows_path
from bench.results import RESULTS, ROWS, regenerate
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.testing.frameworks import framework_python, missing


def run(name: str, work: Path) -> str:
    """Runs one benchmark and keeps the rows it wrote; returns what went wrong, or ""."""
    benchmark = BY_NAME[name]
    out, log = work.resolve() / f"{name}.json", work.resolve() / f"{name}.log"
    if benchmark.framework and (problem := missing(benchmark.framework)):
        return f"{name} ({problem})"
    python = framework_python(benchmark.framework) if benchmark.framework else Path(sys.executable)
    shown = out.relative_to(REPO) if out.is_relative_to(REPO) else out  # the command its rows record
    command = [str(python), "-m", f"bench.{name}", *benchmark.args, "--json", str(shown)]
    print(f"[bench] {name}: {' '.join(command[1:])} (log: {log})", flush=True)
    started = time.perf_counter()
    rows_path(out).unlink(missing_ok=True)
    with log.open("w") as fh:
        code = subprocess.run(command, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT).returncode
    wrote = rows_path(out).exists()
    if wrote:  # kept even when the benchmark exits 1 on a missed target: the rows record the miss
        read(rows_path(out))
        write_text_atomic(ROWS / f"{name}.json", rows_path(out).read_text(encoding="utf-8"))
    print(f"[bench] {name}: exit {code} in {time.perf_counter() - started:.0f} s", flush=True)
    if code == 0 and wrote:
        return ""
    print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
    return f"{name} (exit {code}; {'its rows kept' if wrote else 'no rows written, the previous ones kept'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    runnable = [b.name for b in BENCHMARKS if not b.not_run]
    parser.add_argument("--only", help="comma-separated subset of: " + ", ".join(runnable))
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench", help="JSON and logs")
    args = parser.parse_args(argv)
    names = args.only.split(",") if args.only else runnable
    unknown = [n for n in names if n not in runnable]
    if unknown:
        parser.error(
            f"--only: {', '.join(unknown)} not among the benchmarks make bench runs ({', '.join(runnable)})"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    failed = [problem for name in names if (problem := run(name, args.work))]
    for path in regenerate(ROWS, RESULTS):
        print(f"[bench] wrote {path}")
    if failed:
        print(f"[bench] failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
