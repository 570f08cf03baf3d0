"""What a live MiniWoB page costs in memory on this machine: the figures keyshot's page budget is made from
(``keyshot.env.miniwob.budget``: MIB_PER_PAGE, MIB_PER_BROWSER).

    .venv/bin/python -m bench.pages [--pages 16,64,128] [--task click-button] [--viewport 1280x720]
        [--record] [--json FILE]

A pool opens the pages (each a session in a browser context of its own, reset on ``--task`` and left
open, as a trainer's pages are between its reset and its reward), then the PSS of every process it
started is summed: the workers (Python with BrowserGym), playwright's drivers and every Chromium process.
A Chromium with no page gives the per-browser figure; the pages beyond it give the per-page figure (a
least-squares slope over the page counts). Printed: one JSON line per count, then the figures and their
ratio to the recorded ones; ``--record`` prints the two lines to paste into budget.py. Close to 13 GB at
256 pages: other jobs on the machine should leave the room.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import psutil

from bench import record
from bench.record import Headline, Plot, Rows, ratio_table
from keyshot.env.miniwob import budget as recorded
from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool


def pss_mib(pids: list[int]) -> tuple[float, int]:
    """PSS of ``pids`` and all their descendants (MiB), and how many processes that is."""
    seen: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        for process in [root, *root.children(recursive=True)]:
            seen[process.pid] = process
    total = 0
    for process in seen.values():
        try:
            total += process.memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20, len(seen)


def measure(pool: BrowserPool, pages: int, task: str) -> dict:
    sessions = [pool.lease() for _ in range(pages)]
    started = time.perf_counter()
    with ThreadPoolExecutor(8) as threads:
        list(threads.map(lambda i: sessions[i].reset(seed=i, task=task), range(pages)))
    opened_s = time.perf_counter() - started
    time.sleep(2)  # the pages settle (their first paint's buffers freed)
    pids = [
        pid for process in pool.processes() for pid in process.pids[:1]
    ]  # workers: Chromium is under them
    mib, processes = pss_mib(pids)
    row = {"pages": pages, "browsers": len(pool.processes()), "pss_mib": round(mib), "processes": processes}
    row["opened_s"] = round(opened_s, 1)
    for session in sessions:
        session.close()
    return row


#: What a live session cost before a Chromium held many pages: BrowserGym's two browsers a page, as the
#: page budget counted them (bench/live.py measured 436-475 MiB PSS a browser of that kind).
BROWSERGYM_MIB_PER_SESSION = 512


def rows_of(data: dict) -> Rows:
    counts = ", ".join(
        f"{c['pages']} pages in {c['browsers']} Chromium {c['pss_mib']:,} (opened in {c['opened_s']:.0f} s)"
        for c in data["counts"]
        if c["pages"]
    )
    page = data["mib_per_page"]
    row = (
        f"MiniWoB pages ({data['task']}, viewport {data['viewport']}) open at once, each a browser context of its "
        "own: PSS of every process the pool started (workers, drivers, Chromium), slope over the page counts",
        f"{page} MiB a page",
        f"1 Chromium with no page {data['mib_per_browser']} MiB; {counts}; "
        f"{BROWSERGYM_MIB_PER_SESSION / page:.1f}× the pages of {BROWSERGYM_MIB_PER_SESSION} MiB a session "
        "(BrowserGym's two browsers a page) in the same memory",
    )
    per_gib = {"BrowserGym's two browsers a page": 1024 / BROWSERGYM_MIB_PER_SESSION, "keyshot": 1024 / page}
    headline = Headline(
        "Live MiniWoB sessions per GiB: a browser context each in a shared Chromium / BrowserGym's two "
        "browsers a session",
        f"{BROWSERGYM_MIB_PER_SESSION / page:.1f}× ({page} vs {BROWSERGYM_MIB_PER_SESSION} MiB a session)",
        Plot(
            "Live MiniWoB sessions per GiB",
            "sessions (more is better)",
            tuple((k, round(v, 1)) for k, v in per_gib.items()),
        ),
    )
    return Rows((ratio_table([row]),), (headline,))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", default="16,64,128", help="page counts, comma-separated")
    parser.add_argument("--task", default="click-button")
    parser.add_argument("--viewport", help="WIDTHxHEIGHT of every page (default: the task's own)")
    parser.add_argument("--record", action="store_true", help="print the lines to paste into budget.py")
    record.json_option(parser)
    args = parser.parse_args(argv)
    counts = [int(n) for n in args.pages.split(",")]
    viewport = tuple(int(v) for v in args.viewport.split("x")) if args.viewport else None
    rows = []
    for pages in [0, *counts]:
        budget = BrowserBudget(max(pages, 1))
        with BrowserPool(budget, args.task, viewport=viewport) as pool:
            pool.warm(max(pages, 1))
            pool.wait_ready(120)
            row = measure(pool, pages, args.task)
        print(json.dumps(row), flush=True)
        rows.append(row)
    base = rows[0]["pss_mib"]
    xs = [r["pages"] for r in rows[1:]]
    # each Chromium's own cost counted once per browser: the page slope after the browsers' share
    ys = [r["pss_mib"] - base * r["browsers"] for r in rows[1:]]
    slope = statistics.linear_regression(xs, ys, proportional=True).slope if xs else math.nan
    figures = {"mib_per_browser": round(base), "mib_per_page": round(slope, 1)}
    figures["ratio_to_recorded"] = {
        "mib_per_browser": round(base / recorded.MIB_PER_BROWSER, 2),
        "mib_per_page": round(slope / recorded.MIB_PER_PAGE, 2),
    }
    print(json.dumps(figures), flush=True)
    if args.record:
        print(f"MIB_PER_PAGE = {math.ceil(slope)}\nMIB_PER_BROWSER = {math.ceil(base)}")
    data = {"task": args.task, "viewport": args.viewport or "the task's own", "counts": rows, **figures}
    return record.finish(args.json, data, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
