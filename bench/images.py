"""Image-policy throughput against plain PIL decoding of the same screenshots, in one process.

    python -m bench.images                                  # the real WorkArena shots in ../shared/data, else the fixtures'
    python -m bench.images '../shared/data/agentlab_workarena/*/screenshot_step_*.png' --json out.json

Arguments are files, folders or glob patterns (quoted, so the shell leaves them to the bench). Every
method runs over all files single-threaded (OpenCV at one thread, libvips at one worker): one untimed
warm-up pass, then timed passes taken in turn, method after method, until each has ``--min-seconds``
of CPU time. Rates are per CPU second of this process (every thread of it counted), so that other jobs
on a shared machine, which stretch wall time by whatever they take, do not move the ratios; the JSON
keeps the wall seconds too. The baseline is ``Image.open(p).load()``:
the cost of merely decoding each file. The ratio column is each method's throughput divided by the
baseline's, measured in this run; ``dB`` is the PSNR of the method's image against PIL's bicubic resize
of the same crop (what the Qwen2.5-VL processor would do; JPEG decoded, so q75's own loss is in it).

The candidates, each decode + resize to the policy's size + JPEG q75 of the same files:

* ``prepare_image``: keyshot's one function (header check, libspng/OpenCV decode, OpenCV resize, encode);
* PIL as keyshot did before (decode, bicubic resize, encode), and with ``reducing_gap`` (PIL's
  ``reduce()`` before the resample; ``draft()`` does the same for JPEG input);
* OpenCV alone (``cv2.imdecode`` for the PNG too);
* pyvips (libvips: decode, cubic reduce, ``jpegsave``), simplejpeg (libjpeg-turbo encode after PIL's
  decode) and imagecodecs (its libpng/zlib-ng PNG decode, which releases the GIL, unlike pyspng), when
  installed (``pip install 'pyvips[binary]' simplejpeg imagecodecs``); a missing one is listed, not timed.
"""

from __future__ import annotations

import argparse
import glob
import io
import logging
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("VIPS_CONCURRENCY", "1")  # before pyvips loads libvips: one worker, as the others

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from bench import record  # noqa: E402
from bench.record import REPO, Headline, Rows, ratio_table  # noqa: E402
from keyshot.infer.protocol.images import (  # noqa: E402
    DEFAULT_POLICY,
    REFERENCE_POLICY,
    encode_jpeg,
    fit,
    plan_image,
    prepare_image,
)

logger = logging.getLogger(__name__)

#: The default input: the real WorkArena screenshots of the shared data beside the repository (65, from
#: 1280×713 to 3024×1592) where they are, else the fixture run's 7 (1280×720 and 1282×713).
REAL_SHOTS = "../shared/data/agentlab_workarena/*/screenshot_step_*.png"
FIXTURE_SHOTS = (
    REPO
    / "tests/fixtures/trajectories/agentlab/2024-12-18_12-51-50_DemoAgentArgs_on_workarena.servicenow.knowledge-base-search_5"
)
SUFFIXES = {".png", ".jpg", ".jpeg", ".webp"}
BASELINE = "PIL decode (baseline)"
PREPARE = "prepare_image, keyshot policy"


@dataclass(frozen=True)
class Result:
    method: str
    images: int
    seconds: float
    per_second: float
    ms_per_image: float
    ratio_to_decode: float
    psnr_db: float | None = None
    wall_seconds: float | None = None


def _decode(data: bytes) -> None:
    Image.open(io.BytesIO(data)).load()


def _plan(width: int, height: int):
    return plan_image(width, height, DEFAULT_POLICY)


def _pil_path(data: bytes, reducing_gap: float | None = None) -> bytes:
    """keyshot's path before: PIL decode, crop, one bicubic resize to the policy's size, PIL JPEG."""
    img = Image.open(io.BytesIO(data))
    plan = _plan(*img.size)
    img = img.crop((0, 0, plan.crop_width, plan.crop_height)).convert("RGB")
    if img.size != (plan.width, plan.height):
        img = img.resize((plan.width, plan.height), Image.Resampling.BICUBIC, reducing_gap=reducing_gap)
    buffer = io.BytesIO()
    img.save(buffer, format="JPEG", quality=DEFAULT_POLICY.jpeg_quality)
    return buffer.getvalue()


def _opencv_alone(data: bytes) -> bytes:
    """OpenCV for everything: ``imdecode`` (libpng for a PNG), keyshot's resize rule, ``imencode``."""
    bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
    plan = _plan(bgr.shape[1], bgr.shape[0])
    out = fit(bgr[: plan.crop_height, : plan.crop_width], plan.width, plan.height)
    return cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, DEFAULT_POLICY.jpeg_quality])[1].tobytes()


def _pyvips() -> Callable[[bytes], bytes] | str:
    try:
        import pyvips
    except (ImportError, OSError) as exc:  # OSError: pyvips without a libvips
        return f"not installed ({type(exc).__name__}: pip install 'pyvips[binary]')"
    pyvips.cache_set_max(0)

    def run(data: bytes) -> bytes:
        img = pyvips.Image.new_from_buffer(data, "", access="sequential")
        plan = _plan(img.width, img.height)
        img = img.crop(0, 0, plan.crop_width, plan.crop_height)
        if img.height > plan.height:  # cubic reduce (antialiased, centres aligned) where it shrinks
            img = img.reducev(img.height / plan.height, kernel="cubic")
        if img.width > plan.width:
            img = img.reduceh(img.width / plan.width, kernel="cubic")
        if (img.width, img.height) != (plan.width, plan.height):  # bicubic enlargement, centres aligned
            sx, sy = plan.width / img.width, plan.height / img.height
            img = img.affine(
                [sx, 0, 0, sy],
                interpolate=pyvips.Interpolate.new("bicubic"),
                odx=0.5 * sx - 0.5,
                ody=0.5 * sy - 0.5,
                oarea=[0, 0, plan.width, plan.height],
                extend="copy",
            )
        return img.jpegsave_buffer(Q=DEFAULT_POLICY.jpeg_quality)

    return run


def _simplejpeg() -> Callable[[bytes], bytes] | str:
    try:
        import simplejpeg
    except ImportError:
        return "not installed (pip install simplejpeg)"

    def run(data: bytes) -> bytes:
        img = Image.open(io.BytesIO(data)).convert("RGB")
        plan = _plan(*img.size)
        out = fit(np.asarray(img)[: plan.crop_height, : plan.crop_width], plan.width, plan.height)
        return simplejpeg.encode_jpeg(
            out, DEFAULT_POLICY.jpeg_quality, colorspace="RGB", colorsubsampling="420"
        )

    return run


def _imagecodecs() -> Callable[[bytes], bytes] | str:
    try:
        import imagecodecs
    except ImportError:
        return "not installed (pip install imagecodecs)"

    def run(data: bytes) -> bytes:
        pixels = imagecodecs.png_decode(data) if data[:4] == b"\x89PNG" else imagecodecs.imread(data)
        if pixels.ndim == 2:
            pixels = cv2.cvtColor(pixels, cv2.COLOR_GRAY2RGB)
        plan = _plan(pixels.shape[1], pixels.shape[0])
        out = fit(pixels[: plan.crop_height, : plan.crop_width, :3], plan.width, plan.height)
        return encode_jpeg(np.ascontiguousarray(out), DEFAULT_POLICY.jpeg_quality)

    return run


def _both_from_one_decode(data: bytes) -> tuple:
    """The scorer's image and the judge's original-size image from one decode of the file."""
    img = Image.open(io.BytesIO(data))
    img.load()
    return prepare_image(img, DEFAULT_POLICY), prepare_image(img, REFERENCE_POLICY)


def candidates() -> tuple[list[tuple[str, Callable[[bytes], object]]], list[str]]:
    """The timed methods (the baseline first) and the lines of those that could not run here."""
    methods: list[tuple[str, Callable[[bytes], object]]] = [
        (BASELINE, _decode),
        (PREPARE, lambda d: prepare_image(d, DEFAULT_POLICY).jpeg),
        ("prepare_image, reference policy", lambda d: prepare_image(d, REFERENCE_POLICY).jpeg),
        ("PIL decode+bicubic+encode (before)", _pil_path),
        ("PIL, reducing_gap=2 (reduce first)", lambda d: _pil_path(d, reducing_gap=2.0)),
        ("OpenCV alone (imdecode+fit+imencode)", _opencv_alone),
    ]
    missing = []
    for name, made in (
        ("pyvips decode+reduce+jpegsave", _pyvips()),
        ("PIL decode+fit+simplejpeg", _simplejpeg()),
        ("imagecodecs PNG decode+fit+encode", _imagecodecs()),
    ):
        if isinstance(made, str):
            missing.append(f"{name}: {made}")
        else:
            methods.append((name, made))
    methods.append(("scorer + original from one decode", _both_from_one_decode))
    return methods, missing


def psnr_against_pil_bicubic(fn: Callable[[bytes], object], files: list[bytes]) -> float | None:
    """PSNR (dB) of a method's JPEG against PIL's bicubic resize of the same crop, over all files."""
    squared, count = 0.0, 0
    for data in files:
        out = fn(data)
        if not isinstance(out, bytes):
            return None
        img = Image.open(io.BytesIO(data))
        plan = _plan(*img.size)
        if plan.width * plan.height > plan.crop_width * plan.crop_height * 4:
            return None
        ref = img.crop((0, 0, plan.crop_width, plan.crop_height)).convert("RGB")
        ref = np.asarray(ref.resize((plan.width, plan.height), Image.Resampling.BICUBIC), dtype=np.float64)
        got = np.asarray(Image.open(io.BytesIO(out)).convert("RGB"), dtype=np.float64)
        if got.shape != ref.shape:
            return None
        squared += float(((got - ref) ** 2).sum())
        count += ref.size
    mse = squared / count
    return 99.0 if mse == 0 else 10 * math.log10(255**2 / mse)


def run(
    methods: list[tuple[str, Callable[[bytes], object]]], files: list[bytes], min_seconds: float
) -> list[Result]:
    for _, fn in methods:  # warm-up: lazy imports, first-call costs
        for data in files:
            fn(data)
    spent = {name: 0.0 for name, _ in methods}  # CPU seconds of this process (all its threads)
    wall = {name: 0.0 for name, _ in methods}
    done = {name: 0 for name, _ in methods}
    while min(spent.values()) < min_seconds:
        for name, fn in methods:  # in turn: a busy neighbour slows every method alike
            start, start_wall = time.process_time(), time.perf_counter()
            for data in files:
                fn(data)
            spent[name] += time.process_time() - start
            wall[name] += time.perf_counter() - start_wall
            done[name] += len(files)
    base_rate = done[BASELINE] / spent[BASELINE]
    results = []
    for name, fn in methods:
        n, secs = done[name], spent[name]
        quality = (
            None
            if name in (BASELINE, "scorer + original from one decode")
            else psnr_against_pil_bicubic(fn, files)
        )
        results.append(
            Result(name, n, secs, n / secs, 1000 * secs / n, (n / secs) / base_rate, quality, wall[name])
        )
    return results


def screenshot_files(args: list[str]) -> list[Path]:
    """Files named, found in folders, or matched by glob patterns; sorted, each once."""
    files: list[Path] = []
    for arg in args:
        matched = sorted(glob.glob(arg, recursive=True)) if glob.has_magic(arg) else [arg]
        if not matched:
            raise SystemExit(f"bench.images: {arg}: no file matches")
        for name in matched:
            path = Path(name)
            if path.is_dir():
                files += sorted(p for p in path.iterdir() if p.suffix.lower() in SUFFIXES)
            elif path.is_file():
                files.append(path)
            else:
                raise SystemExit(f"bench.images: {path}: no such file or folder")
    return sorted(set(files))


def rows_of(data: dict) -> Rows:
    by = {r["method"]: r for r in data["results"]}
    base = by[BASELINE]
    sizes = data["sizes"]
    span = ", ".join("×".join(map(str, size)) for size in sizes)
    if len(sizes) > 3:
        span = f"{len(sizes)} sizes, {'×'.join(map(str, sizes[0]))} to {'×'.join(map(str, sizes[-1]))}"
    source = data.get("source", "screenshots")
    shots = f"{len(data['files'])} {source} ({span}), 1 thread"
    compared = [
        (
            f"{method} vs plain PIL decode, screenshots per CPU second",
            f"{r['ratio_to_decode']:.2f}×",
            f"{r['per_second']:.1f} vs {base['per_second']:.1f} /s on {shots}"
            + (f"; {r['psnr_db']:.1f} dB against PIL's bicubic resize" if r["psnr_db"] is not None else ""),
        )
        for method, r in by.items()
        if method not in (BASELINE, "scorer + original from one decode")
    ]
    once = data["decode_once"]
    compared.append(
        (
            "outcome_images=original: kept screenshots prepared again vs every screenshot decoded once for "
            "both, CPU ms per trajectory",
            f"{once['twice_ms'] / once['once_ms']:.2f}×",
            f"{once['twice_ms']:.0f} vs {once['once_ms']:.0f} ms ({once['screenshots']} screenshots, "
            f"{once['kept']} kept); the kept set is known only after scoring, so decoding once means making "
            "every original",
        )
    )
    prepare = by[PREPARE]
    headline = Headline(
        "Screenshots prepared per CPU second: keyshot's image policy (decode, resize, JPEG) / PIL's decode "
        f"alone, {len(data['files'])} {data.get('source', 'screenshots')}",
        f"{prepare['ratio_to_decode']:.2f}×",
    )
    notes = tuple(f"Not run: {line}." for line in data["not_run"])
    return Rows((ratio_table(compared),), (headline,), notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "paths", nargs="*", help="screenshots, folders or glob patterns (default: the fixtures)"
    )
    parser.add_argument("--min-seconds", type=float, default=1.0, help="timed seconds per method (default 1)")
    record.json_option(parser)
    args = parser.parse_args(argv)

    if args.paths:
        source, paths = "the screenshots named", screenshot_files(args.paths)
    elif glob.glob(str(REPO / REAL_SHOTS)):
        source, paths = "real WorkArena screenshots", screenshot_files([str(REPO / REAL_SHOTS)])
    else:
        source, paths = "the fixture run's screenshots", screenshot_files([str(FIXTURE_SHOTS)])
    if not paths:
        parser.error("no screenshots found")
    files = [p.read_bytes() for p in paths]
    sizes = sorted({Image.open(p).size for p in paths})
    methods, missing = candidates()
    results = run(methods, files, args.min_seconds)
    print(f"{len(files)} screenshots, sizes {sizes}; single thread, Python {platform.python_version()}")
    print(f"{'method':<38}{'img/s':>8}{'ms/img':>9}{'ratio':>8}{'dB':>7}")
    for r in results:
        db = f"{r.psnr_db:7.1f}" if r.psnr_db is not None else f"{'':>7}"
        print(f"{r.method:<38}{r.per_second:>8.1f}{r.ms_per_image:>9.2f}{r.ratio_to_decode:>8.2f}{db}")
    for line in missing:
        print(f"not run: {line}")
    by_name = {r.method: r.ms_per_image for r in results}
    shots, kept = (
        27,
        2,
    )  # Online-Mind2Web's mean length; ~1.5 of ~19 kept in the released run (docs/protocol.md)
    scorer, original = by_name[PREPARE], by_name["prepare_image, reference policy"]
    twice = shots * scorer + kept * original
    once = shots * by_name["scorer + original from one decode"]
    print(
        f"outcome_images=original, {shots} screenshots, {kept} kept: decoding the kept ones again costs "
        f"{twice:.0f} ms per trajectory; decoding each once for both (the kept set is known only after "
        f"scoring, so every screenshot's original must be made) {once:.0f} ms: {twice / once:.2f}x"
    )
    data = {
        "source": source,
        "files": [str(p) for p in paths],
        "sizes": sizes,
        "cpu": platform.processor() or platform.machine(),
        "results": [asdict(r) for r in results],
        "not_run": missing,
        "decode_once": {"screenshots": shots, "kept": kept, "twice_ms": twice, "once_ms": once},
    }
    return record.finish(args.json, data, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
