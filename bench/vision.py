"""Vision tower forward without flash-attn: transformers' per-window loop vs keyshot's batched windows.

The tiny random Qwen2.5-VL (same window and full-attention layout as the 7B: windowed layers with
the full-attention layers in between) on 1280×720 screenshots at the 7B's default pixel bounds (~4,600
patches, ~290 windows per image): screenshots/s of the vision forward, both paths in one process.

    .venv/bin/python -m bench.vision [--images 8] [--repeats 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from bench import record
from bench.record import Rows, ratio_table


def rows_of(data: dict) -> Rows:
    row = (
        "batched windows vs transformers' per-window loop (sdpa, no flash-attn), screenshots/s",
        f"{data['speedup']:.2f}×",
        f"{data['batched_screenshots_per_s']:.1f} vs {data['per_window_loop_screenshots_per_s']:.1f} /s, tiny "
        f"model, 1280×720 at 7B pixel bounds ({data['patches_per_image']} patches, "
        f"{data['windows_per_image']} windows)",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    record.json_option(ap)
    args = ap.parse_args(argv)
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl
    from keyshot.infer.model.vision_attention import use_batched_window_attention

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_qwen25vl(Path(tmp) / "tiny", seed=0)
        processor = AutoProcessor.from_pretrained(model_dir)
        rng = np.random.default_rng(0)
        images = [
            Image.fromarray(rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)) for _ in range(args.images)
        ]
        batch = processor.image_processor(images=images, return_tensors="pt", max_pixels=1_003_520)
        pixels, grid = batch["pixel_values"], batch["image_grid_thw"]
        loop = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()
        batched = AutoModelForImageTextToText.from_pretrained(model_dir, attn_implementation="sdpa").eval()
        use_batched_window_attention(batched)

        def rate(model) -> float:
            best = float("inf")
            with torch.no_grad():
                model.model.visual(pixels, grid_thw=grid)  # warm-up
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    model.model.visual(pixels, grid_thw=grid)
                    best = min(best, time.perf_counter() - started)
            return args.images / best

        per_window, grouped = rate(loop), rate(batched)
    patches = int((grid[:, 0] * grid[:, 1] * grid[:, 2]).sum()) // args.images
    vision = loop.config.vision_config
    window_patches = vision.window_size // vision.patch_size
    result = {
        "images": args.images,
        "patches_per_image": patches,
        "windows_per_image": patches // (window_patches * window_patches),
        "per_window_loop_screenshots_per_s": per_window,
        "batched_screenshots_per_s": grouped,
        "speedup": grouped / per_window,
        "threads": torch.get_num_threads(),
    }
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
