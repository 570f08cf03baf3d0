"""Image-policy throughput against plain PIL decoding of the same screenshots, in one process.

    python bench/bench_images.py                       # the real screenshots in tests/fixtures
    python bench/bench_images.py shots/*.png --json runs/bench_images.json

Every method runs over all files (one untimed warm-up pass, then passes until ``--min-seconds``),
single-threaded. The baseline is ``Image.open(p).load()``: the cost of merely decoding each file.
The ratio column is each method's throughput divided by the baseline's, measured in this run.
"minimal decode+resize+encode" is a hand-written lower bound for the same output (no mode handling,
no checks): prepare_image should be about as fast. The keyshot policy pays for one bicubic resize to
the Qwen2.5-VL grid (1280×720 → 1288×728) that the processor would otherwise do server-side.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from PIL import Image

from keyshot.infer.protocol.images import DEFAULT_POLICY, REFERENCE_POLICY, plan_image, prepare_image

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SHOTS = (
    REPO
    / "tests/fixtures/trajectories/agentlab/2024-12-18_12-51-50_DemoAgentArgs_on_workarena.servicenow.knowledge-base-search_5"
)


@dataclass(frozen=True)
class Result:
    method: str
    images: int
    seconds: float
    per_second: float
    ms_per_image: float
    ratio_to_decode: float


def _decode(path: Path) -> None:
    Image.open(path).load()


def _minimal_pipeline(path: Path) -> bytes:
    """The least any equivalent pipeline does: decode, one bicubic resize to the same target, encode."""
    img = Image.open(path).convert("RGB")
    plan = plan_image(img.width, img.height, DEFAULT_POLICY)
    if img.size != (plan.width, plan.height):
        img = img.resize((plan.width, plan.height), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=DEFAULT_POLICY.jpeg_quality)
    return buffer.getvalue()


def _both_from_one_decode(path: Path) -> tuple:
    """The scorer's image and the judge's original-size image from one decode of the file."""
    img = Image.open(path)
    img.load()
    return prepare_image(img, DEFAULT_POLICY), prepare_image(img, REFERENCE_POLICY)


def _time(fn: Callable[[Path], object], files: list[Path], min_seconds: float) -> tuple[int, float]:
    for path in files:  # warm-up: page cache, lazy imports
        fn(path)
    done, start = 0, time.perf_counter()
    while True:
        for path in files:
            fn(path)
        done += len(files)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return done, elapsed


def run(files: list[Path], min_seconds: float) -> list[Result]:
    methods: list[tuple[str, Callable[[Path], object]]] = [
        ("PIL decode (baseline)", _decode),
        ("prepare_image, keyshot policy", lambda p: prepare_image(p, DEFAULT_POLICY)),
        ("prepare_image, reference policy", lambda p: prepare_image(p, REFERENCE_POLICY)),
        ("minimal decode+resize+encode", _minimal_pipeline),
        ("scorer + original from one decode", _both_from_one_decode),
    ]
    timed = [(name, *_time(fn, files, min_seconds)) for name, fn in methods]
    base_rate = timed[0][1] / timed[0][2]
    return [
        Result(name, n, secs, n / secs, 1000 * secs / n, (n / secs) / base_rate) for name, n, secs in timed
    ]


def _write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as out:
        json.dump(payload, out, indent=2)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", nargs="*", type=Path, help="screenshots or folders of them (default: fixtures)"
    )
    parser.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per method (default 1)")
    parser.add_argument("--json", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args(argv)

    files: list[Path] = []
    for path in args.paths or [DEFAULT_SHOTS]:
        if path.is_dir():
            files += sorted(
                p for p in path.iterdir() if p.suffix.lower() in {".png", ".jpg", ".jpeg", ".webp"}
            )
        elif path.is_file():
            files.append(path)
        else:
            parser.error(f"{path}: no such file or folder")
    if not files:
        parser.error("no screenshots found")

    sizes = sorted({Image.open(p).size for p in files})
    results = run(files, args.min_seconds)
    print(f"{len(files)} screenshots, sizes {sizes}; single process, Python {platform.python_version()}")
    print(f"{'method':<34}{'img/s':>9}{'ms/img':>9}{'ratio':>8}")
    for r in results:
        print(f"{r.method:<34}{r.per_second:>9.1f}{r.ms_per_image:>9.2f}{r.ratio_to_decode:>8.2f}")
    by_name = {r.method: r.ms_per_image for r in results}
    shots, kept = (
        27,
        2,
    )  # Online-Mind2Web's mean length; ~1.5 of ~19 kept in the released run (docs/protocol.md)
    scorer, original = by_name["prepare_image, keyshot policy"], by_name["prepare_image, reference policy"]
    twice = shots * scorer + kept * original
    once = shots * by_name["scorer + original from one decode"]
    print(
        f"outcome_images=original, {shots} screenshots, {kept} kept: decoding the kept ones again costs "
        f"{twice:.0f} ms per trajectory; decoding each once for both (the kept set is known only after "
        f"scoring, so every screenshot's original must be made) {once:.0f} ms: {twice / once:.2f}x"
    )
    if args.json:
        _write_json(
            args.json,
            {
                "files": [str(p) for p in files],
                "sizes": sizes,
                "cpu": platform.processor() or platform.machine(),
                "results": [asdict(r) for r in results],
                "decode_once": {"screenshots": shots, "kept": kept, "twice_ms": twice, "once_ms": once},
            },
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
