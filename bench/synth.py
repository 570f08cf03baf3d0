"""Dataset building (``keyshot synth build``): rows per second and peak memory, against baselines.

    python -m bench.synth                     # 1,000 rows from the real screenshots in tests/fixtures
    python -m bench.synth --rows 1000 --small 100 --shots DIR --json runs/bench/synth.json

A label store of ``--rows`` screenshots (two teachers each, fixture screenshots reused round-robin) is
written to a temporary run folder; no teacher is called. Each build runs in a fresh subprocess that
reports its own peak RSS (``resource.getrusage``), once with ``--rows`` and once with ``--small``
rows (and ``--large`` rows if given): rows are streamed, so the peak does not grow with the row
count beyond one save batch (datasets' ``save_to_disk`` copies one Arrow shard batch at a time;
shards are capped at 32 MB). Throughput baselines, in this process on the same files: plain PIL
decode + JPEG encode (the least any pipeline does per row) and ``prepare_image`` alone (the image
policy without datasets' Arrow writing, the card and the save). Wall-clock rows/s depend on what
else runs on the machine; CPU milliseconds per row (process time, all threads) are steadier.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from PIL import Image

from bench import record
from bench.record import REPO, Rows, ratio_table
from keyshot.data_synth.dataset import BuildConfig, SplitConfig, build_dataset
from keyshot.data_synth.labels import KeyPointsRecord, LabelRecord, LabelStore, TrajectoryRecord
from keyshot.data_synth.run_folder import open_manifest
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.infer.protocol.prompts import load_prompt_set

DEFAULT_SHOTS = [REPO / "tests/fixtures/trajectories", REPO / "tests/fixtures/agentlab_small"]
AGENTS = ("SeeAct", "Browser_Use", "Claude_Computer_Use_3.5", "Agent-E", "Operator")
STEPS_PER_TRAJECTORY = 10
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg"}


def find_screenshots(roots: list[Path]) -> list[Path]:
    shots = sorted(p for root in roots for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not shots:
        raise SystemExit(f"no screenshots under {', '.join(map(str, roots))}")
    return shots


def write_run(run: Path, rows: int, shots: list[Path]) -> None:
    """A label store of ``rows`` screenshots with two teachers' labels each (deterministic scores)."""
    prompts = load_prompt_set()
    open_manifest(
        run,
        prompt_variant=prompts.variant,
        prompt_version=prompts.version,
        image_policy=DEFAULT_POLICY.to_dict(),
        parse_mode="strict",
        kind="bench",
        source="bench_synth",
    )
    with LabelStore(run) as store:
        for t in range(-(-rows // STEPS_PER_TRAJECTORY)):
            n = min(STEPS_PER_TRAJECTORY, rows - t * STEPS_PER_TRAJECTORY)
            uid = f"bench/{AGENTS[t % len(AGENTS)]}/task-{t}"
            files = [str(shots[(t * STEPS_PER_TRAJECTORY + i) % len(shots)]) for i in range(n)]
            store.append(
                TrajectoryRecord(uid, f"task-{t}", f"Do task number {t} on the site.", files, AGENTS[t % 5])
            )
            store.append(KeyPointsRecord(uid, "judge", "\n1. Open the site.\n2. Finish the task.", True))
            for step in range(n):
                for teacher in ("teacher-a", "teacher-b"):
                    digest = hashlib.sha256(f"{uid}:{step}:{teacher}".encode()).digest()
                    score = 1 + digest[0] % 5
                    store.append(
                        LabelRecord(
                            uid,
                            step,
                            teacher,
                            score,
                            True,
                            text=f"**Reasoning**: r.\n\n**Score**: {score}",
                            thought=f"The page shows step {step} of task {t}.",
                            model=teacher,
                        )
                    )


class _RssSampler:
    """Peak anonymous and file-backed resident memory, sampled from /proc (Linux) every 20 ms.

    ``ru_maxrss`` counts memory-mapped file pages too (Arrow files are read through mmap): those
    are page cache the kernel can drop, not memory the build holds, so the split is reported."""

    def __init__(self) -> None:
        self.peak = {"RssAnon": 0, "RssFile": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        try:
            text = Path("/proc/self/status").read_text()
        except OSError:
            return
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key in self.peak:
                self.peak[key] = max(self.peak[key], int(value.split()[0]))

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._sample()

    def __enter__(self) -> _RssSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def child(run: Path, out: Path) -> None:
    """Build in this (fresh) process and print rows, seconds and peak RSS as JSON."""
    import datasets  # noqa: F401  (counted in the "after imports" figure, not in the build)

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cfg = BuildConfig(
        splits=SplitConfig(
            agents={"train": list(AGENTS[:3]), "validation": [AGENTS[3]], "test": [AGENTS[4]]}
        ),
        output_dir=str(out),
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    with _RssSampler() as sampler:
        result = build_dataset(run, cfg)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    rows = sum(result.meta.rows.values())
    print(
        json.dumps(
            {
                "rows": rows,
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "peak_rss_mb": peak_kb / 1024,
                "peak_rss_anon_mb": sampler.peak["RssAnon"] / 1024,
                "peak_rss_file_mb": sampler.peak["RssFile"] / 1024,
                "rss_after_imports_mb": rss_before / 1024,
            }
        )
    )


def measure_build(rows: int, shots: list[Path], tmp: Path) -> dict:
    run = tmp / f"run-{rows}"
    write_run(run, rows, shots)
    cmd = [sys.executable, "-m", "bench.synth", "--child", str(run), str(tmp / f"dataset-{rows}")]
    env = dict(os.environ, TQDM_DISABLE="1")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, check=False)
    if done.returncode != 0:
        raise SystemExit(f"build of {rows} rows failed:\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["rows_per_s"] = result["rows"] / result["seconds"]
    result["cpu_ms_per_row"] = 1000 * result["cpu_seconds"] / result["rows"]
    return result


def per_second(fn, files: list[Path]) -> tuple[float, float]:
    """(files per wall second, CPU milliseconds per file)."""
    start, cpu_start = time.perf_counter(), time.process_time()
    for path in files:
        fn(path)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return len(files) / wall, 1000 * cpu / len(files)


def pil_decode_encode(path: Path) -> bytes:
    buffer = io.BytesIO()
    Image.open(path).convert("RGB").save(buffer, format="JPEG", quality=75)
    return buffer.getvalue()


def rows_of(data: dict) -> Rows:
    big, small = data["build"], data["build_small"]
    compared = [
        (
            "CPU ms/row: build vs plain PIL decode+encode",
            f"{data['ratio_cpu_build_vs_pil']:.2f}×",
            f"{big['cpu_ms_per_row']:.1f} vs {data['baseline_pil_decode_encode_cpu_ms_per_row']:.1f} ms/row, "
            f"{big['rows']} rows",
        ),
        (
            f"peak RSS: {big['rows']} rows vs {small['rows']} rows (streamed)",
            f"{data['ratio_peak_rss_anon_big_vs_small']:.2f}×",
            f"{big['peak_rss_anon_mb']:.0f} vs {small['peak_rss_anon_mb']:.0f} MB anonymous RSS",
        ),
    ]
    return Rows((ratio_table(compared),))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--small", type=int, default=100, help="row count of the memory baseline build")
    parser.add_argument(
        "--large", type=int, default=0, help="also build this many rows (does the peak plateau?)"
    )
    parser.add_argument(
        "--shots", type=Path, action="append", help="screenshot folders (default: tests/fixtures)"
    )
    record.json_option(parser)
    parser.add_argument("--child", nargs=2, type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0

    shots = find_screenshots(args.shots or DEFAULT_SHOTS)
    sizes = sorted({Image.open(p).size for p in shots})
    files = [shots[i % len(shots)] for i in range(args.rows)]
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        big = measure_build(args.rows, shots, Path(tmp))
        small = measure_build(args.small, shots, Path(tmp))
        large = measure_build(args.large, shots, Path(tmp)) if args.large else None
    baseline_pil, baseline_pil_cpu = per_second(pil_decode_encode, files)
    baseline_prepare, baseline_prepare_cpu = per_second(lambda p: prepare_image(p, DEFAULT_POLICY), files)

    figures = {
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "screenshots": {"files": len(shots), "sizes": [f"{w}x{h}" for w, h in sizes]},
        "build": big,
        "build_small": small,
        "build_large": large,
        "baseline_pil_decode_encode_rows_per_s": baseline_pil,
        "baseline_prepare_image_rows_per_s": baseline_prepare,
        "baseline_pil_decode_encode_cpu_ms_per_row": baseline_pil_cpu,
        "baseline_prepare_image_cpu_ms_per_row": baseline_prepare_cpu,
        "ratio_cpu_build_vs_pil": big["cpu_ms_per_row"] / baseline_pil_cpu,
        "ratio_cpu_build_vs_prepare_image": big["cpu_ms_per_row"] / baseline_prepare_cpu,
        "ratio_build_vs_pil": big["rows_per_s"] / baseline_pil,
        "ratio_build_vs_prepare_image": big["rows_per_s"] / baseline_prepare,
        "ratio_peak_rss_big_vs_small": big["peak_rss_mb"] / small["peak_rss_mb"],
        "ratio_peak_rss_anon_big_vs_small": big["peak_rss_anon_mb"] / small["peak_rss_anon_mb"],
    }
    print(
        f"screenshots: {len(shots)} files reused round-robin, sizes {', '.join(figures['screenshots']['sizes'])}"
    )
    print("| measure | value | baseline | ratio |")
    print("|---|---:|---:|---:|")
    print(
        f"| build rows/s ({big['rows']} rows) | {big['rows_per_s']:.1f} | PIL decode+JPEG encode {baseline_pil:.1f} | "
        f"{figures['ratio_build_vs_pil']:.2f} |"
    )
    print(
        f"| build rows/s ({big['rows']} rows) | {big['rows_per_s']:.1f} | prepare_image alone {baseline_prepare:.1f} | "
        f"{figures['ratio_build_vs_prepare_image']:.2f} |"
    )
    print(
        f"| build CPU ms/row ({big['rows']} rows) | {big['cpu_ms_per_row']:.1f} | PIL decode+JPEG encode "
        f"{baseline_pil_cpu:.1f} | {figures['ratio_cpu_build_vs_pil']:.2f} |"
    )
    print(
        f"| build CPU ms/row ({big['rows']} rows) | {big['cpu_ms_per_row']:.1f} | prepare_image alone "
        f"{baseline_prepare_cpu:.1f} | {figures['ratio_cpu_build_vs_prepare_image']:.2f} |"
    )
    print(
        f"| peak RSS MB ({big['rows']} rows) | {big['peak_rss_mb']:.0f} | {small['rows']} rows: {small['peak_rss_mb']:.0f} | "
        f"{figures['ratio_peak_rss_big_vs_small']:.2f} |"
    )
    print(
        f"| peak anonymous RSS MB ({big['rows']} rows) | {big['peak_rss_anon_mb']:.0f} | "
        f"{small['rows']} rows: {small['peak_rss_anon_mb']:.0f} | {figures['ratio_peak_rss_anon_big_vs_small']:.2f} |"
    )
    if large is not None:
        print(
            f"| peak anonymous RSS MB ({large['rows']} rows) | {large['peak_rss_anon_mb']:.0f} | "
            f"{small['rows']} rows: {small['peak_rss_anon_mb']:.0f} | "
            f"{large['peak_rss_anon_mb'] / small['peak_rss_anon_mb']:.2f} |"
        )
        print(f"| build rows/s ({large['rows']} rows) | {large['rows_per_s']:.1f} | | |")
    print(
        f"(RSS after imports, before building: {big['rss_after_imports_mb']:.0f} MB; peak file-backed RSS, "
        f"mostly memory-mapped Arrow pages the kernel may drop: {big['peak_rss_file_mb']:.0f} MB vs "
        f"{small['peak_rss_file_mb']:.0f} MB)"
    )
    return record.finish(args.json, figures, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
