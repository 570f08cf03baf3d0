"""``keyshot report`` at size: 1,000 trajectories × 27 screenshots (the Online-Mind2Web average).

Writes a verdict file of that size (every screenshot a distinct image file), builds the report twice
on one core and prints: the first build (every screenshot converted), the rebuild with thumbnails
cached (the figure the target is about: ≤ 60 s), their ratio, and the index page's size (≤ 2 MB).

    .venv/bin/python -m bench.report [--trajectories 1000] [--screenshots 27] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from bench import record
from bench.record import Rows, ratio_table
from keyshot.infer.protocol.verdicts import OutcomeCall, RoleUsage, ScreenshotRecord, Verdict, VerdictWriter


def write_run(root: Path, n: int, shots: int) -> Path:
    images = root / "shots"
    images.mkdir(parents=True)
    run = root / "run"
    config = {
        "prompt_variant": "online_mind2web",
        "prompt_version": "online_mind2web@bench",
        "outcome_mode": "cot",
        "parse_mode": "strict",
        "threshold": 3.0,
        "max_kept": 50,
        "judge_model": "gpt-4o",
        "scorer_model": "webjudge-7b",
    }
    with VerdictWriter(run / "verdicts.jsonl", fsync=False) as writer:
        for t in range(n):
            records = []
            for i in range(shots):
                path = images / f"{t:05d}_{i:02d}.png"
                # distinct content per screenshot (a real run's pages differ), small on disk
                img = Image.new("RGB", (128, 72), ((t * 7) % 256, (i * 9) % 256, (t + i) % 256))
                img.putpixel((0, 0), (t % 256, t // 256, i))  # every screenshot's content distinct
                img.save(path)
                score = 1 + (t + i) % 5
                records.append(
                    ScreenshotRecord(
                        index=i,
                        path=str(path),
                        score=score,
                        thought=f"Screenshot {i} of task {t}: the page shows the search results for the query.",
                        valid=True,
                        raw=f"**Reasoning**: …\n\n**Score**: {score}",
                    )
                )
            kept = [r.index for r in records if r.score >= 3]
            writer.append(
                Verdict(
                    task_id=f"task-{t:05d}",
                    task=f"Find a round-trip flight for task {t} and compare the cheapest fares on two sites",
                    agent=f"agent-{t % 6}",
                    benchmark="online_mind2web",
                    success=t % 3 != 0,
                    status_valid=True,
                    key_points="1. Search flights\n2. Compare fares",
                    outcome_text='Thoughts: the key screenshots show the comparison.\nStatus: "success"',
                    outcome_calls=[OutcomeCall(text="…", success=t % 3 != 0, valid=True)],
                    screenshots=records,
                    kept=kept,
                    usage={
                        "judge": RoleUsage(2, 0, 0, 20000, 300, 0.05),
                        "scorer": RoleUsage(shots, 0, 0, 0, 0, 0.0),
                    },
                    config=config,
                    human_label="success" if t % 4 else "failure",
                )
            )
    return run


def timed_build(run: Path, out: Path) -> float:
    from keyshot.infer.report import build_report

    started = time.perf_counter()
    build_report(run, out, progress=False)
    return time.perf_counter() - started


def rows_of(data: dict) -> Rows:
    size = (
        f"{data['trajectories']:,} trajectories × {data['screenshots_per_trajectory']} screenshots, one core"
    )
    row = (
        "first build vs rebuild with thumbnails cached, seconds",
        f"{data['ratio_first_over_cached']:.2f}×",
        f"{data['first_build_s']:.1f} s vs {data['cached_build_s']:.1f} s (target ≤ 60 s); index.html "
        f"{data['index_html_mb']:.2f} MB (target ≤ 2 MB); {size}",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=1000)
    ap.add_argument("--screenshots", type=int, default=27)
    record.json_option(ap)
    args = ap.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # one core, as the target says
    with tempfile.TemporaryDirectory(prefix="keyshot-bench-report-") as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        run = write_run(root, args.trajectories, args.screenshots)
        setup = time.perf_counter() - t0
        first = timed_build(run, root / "report")
        cached = timed_build(run, root / "report")
        index_mb = (root / "report" / "index.html").stat().st_size / 1e6
    result = {
        "trajectories": args.trajectories,
        "screenshots_per_trajectory": args.screenshots,
        "setup_s": setup,
        "first_build_s": first,
        "cached_build_s": cached,
        "ratio_first_over_cached": first / cached,
        "index_html_mb": index_mb,
        "targets": {"cached_build_s": 60, "index_html_mb": 2},
    }
    return record.finish(
        args.json, result, rows_of, __spec__.name, argv, 0 if cached <= 60 and index_mb <= 2 else 1
    )


if __name__ == "__main__":
    sys.exit(main())
