"""The GPU benchmark kit: the recipe's training step timed and profiled, scorer throughput against its compute
ceiling, the vision tower, and train/serve parity, at Qwen2.5-VL-7B's shape, in one command with nothing
to download.

    python -m bench.gpu --json OUT/gpu.json  # on a CUDA machine: the 7B shape; its rows OUT/gpu.rows.json
                                             # (bench/rows/gpu/ keeps them: python -m bench.results makes
                                             # bench/RESULTS-gpu.md of them)
    python -m bench.gpu --shape tiny       # the same code paths with the tiny model (what CPU machines run)
    bash bench/gpu_session.sh OUT          # on a lent GPU: the CUDA tests, then this kit (issue 57's rows)

The model is built from ``configs/models/qwen2.5-vl-7b.json`` with random bf16 weights created on the
device (no checkpoint is read or written); the processor and tokenizer are the tiny fixture's
(``keyshot.infer.model.tiny_model``) with the scorer's pixel bounds, so a 1280×720 screenshot is 1,196
visual tokens as for the real model (text tokenises differently: the fixture's vocabulary is small; the
counts are printed).

**Training rows measure the recipe.** Each row is a shipped 7B config (``configs/train/webjudge7b_*.yaml``)
with ``key=value`` overrides of its ``model:`` section; the rows are rendered by train/batches.py
(``ScorerRenderer``, ``ScorerCollator``, the batch samplers), the model is set up by
``keyshot.train.scorer_model.prepare_for_training`` and each micro-batch runs the recipe's own
``keyshot.train.step.train_step`` (accelerate's accumulation and autocast, the memory plan, the loss at the
labelled positions, the clipped AdamW of ``build_optimizer``), never a copy of it. The optimizer step is
amortised over the recipe's accumulation, as a run pays it.

**Timing that agrees with the profile.** One window of micro-batches is drawn once from the sampler; a
warm-up runs every shape bucket of it (and an optimizer step); the timed passes and the profiled pass run
those same batches, garbage collection off. A timed pass marks every step with CUDA events (the host's
clock on a CPU) and never synchronises; the profiled pass closes each phase (host→device copy, vision
forward, language-model forward and backward, vision backward, optimizer, logging) with a synchronise.
Each row prints its timed step over its profiled step and says so where they are more than 5 % apart.

**MFU** = model FLOPs per second ÷ the device's dense bf16 peak, FLOPs from
``keyshot.train.throughput.FlopsModel`` on the batches run (``lm_head`` only at labelled positions, LoRA's
language model at 4N, the frozen tower once); HFU adds what checkpointing recomputes.

**Scorer**: the in-process ``TransformersScorer`` over the same model, prefill of batches of 1280×720
screenshots with the real scorer prompt (``logits_to_keep=1``), next to the ceiling: forward FLOPs of one
screenshot's request ÷ peak. With vLLM available (importable, or ``KEYSHOT_VLLM_PYTHON``) and without
``--no-vllm``, the model is saved and served by ``keyshot serve`` and scored over HTTP; otherwise that row
says so.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import sys
import tempfile
from pathlib import Path

import torch

from bench.gpu_kit.ceiling import gemm_ceiling
from bench.gpu_kit.kit import SIZES, Kit, device_peak, versions
from bench.gpu_kit.page import markdown
from bench.gpu_kit.scoring import scorer_bench, vllm_row
from bench.gpu_kit.targets import targets
from bench.gpu_kit.training import DEFAULT_TRAIN, Rendered, TrainSetting, train_fitting
from bench.gpu_kit.vision import vision_bench
from bench.record import REPO, Rows, commit, dumps, markdown_notes, row_file, rows_path
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.model.tiny_model import build_tiny_qwen25vl
from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for, set_processor_pixel_bounds
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.testing.scorer_data import scorer_rows

logger = logging.getLogger("bench.gpu")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=("7b", "tiny"), help="default: 7b on CUDA, tiny elsewhere")
    ap.add_argument("--device", help="default: cuda when available, else cpu")
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="warm-up steps at least (every shape bucket of the window runs once)",
    )
    ap.add_argument("--steps", type=int, default=8, help="micro-batches of the window, timed and profiled")
    ap.add_argument(
        "--repeats", type=int, default=2, help="timed passes over the window (their range is shown)"
    )
    ap.add_argument("--rows", type=int, default=64, help="training examples rendered")
    ap.add_argument(
        "--batch",
        type=int,
        help="micro-batch (default: the config's per_device_batch_size; @TOKENS rows: the cap's)",
    )
    ap.add_argument(
        "--train",
        default=DEFAULT_TRAIN,
        help="training rows, ';'-separated: lora, full, or LABEL=MODE[@TOKENS]:key=value,key=value (overrides of "
        "the shipped config's model: section; @TOKENS: rows of that many tokens, as many as the token cap holds "
        "in a micro-batch); '' to skip",
    )
    ap.add_argument("--batchings", default="length_grouped")
    ap.add_argument("--score-batches", default="1,8")
    ap.add_argument("--score-reps", type=int, default=3)
    ap.add_argument("--gemm", action=argparse.BooleanOptionalAction, default=True, help="the GEMM ceiling")
    ap.add_argument("--peak", type=float, help="device peak TFLOP/s (default: from the device name)")
    ap.add_argument(
        "--cpu-peak", type=float, default=0.2, help="nominal CPU TFLOP/s for the tiny shape's MFU"
    )
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--vision-batches", default="1,8", help="vision tower alone ('' to skip)")
    ap.add_argument(
        "--workers", type=int, help="DataLoader workers (default: 8 on CUDA as the 7B configs, else 0)"
    )
    ap.add_argument(
        "--out", type=Path, default=REPO / "runs" / "gpu-kit.md", help="the run's report (Markdown)"
    )
    ap.add_argument(
        "--json",
        type=Path,
        help="the figures as JSON, and beside it their row file (X.rows.json: bench/rows/gpu/ keeps it, and "
        "python -m bench.results makes bench/RESULTS-gpu.md of it)",
    )
    ap.add_argument("--title", help="what the run was, the heading of its section of RESULTS-gpu.md")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = [TrainSetting.parse(t.strip()) for t in args.train.split(";") if t.strip()]

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    shape = args.shape or ("7b" if device.type == "cuda" else "tiny")
    peak, source = (args.peak, "--peak") if args.peak else device_peak(device, args.cpu_peak)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    workers = args.workers if args.workers is not None else (8 if device.type == "cuda" else 0)
    command = "python -m bench.gpu " + " ".join(argv if argv is not None else sys.argv[1:])
    train_rows: list[dict] = []
    scoring: dict | None = None
    vision: dict | None = None
    gemm: dict | None = None
    errors: dict[str, str] = {}

    def save() -> None:
        """Written after every section: a run cut short by its time limit keeps what it measured."""
        text = markdown(kit, info, train_rows, scoring, command.strip(), vision, errors, gemm)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(args.out, text)
        if args.json:
            title = args.title or f"the kit on {info['device']}"
            run = row_file(
                Rows((), (), markdown_notes(text.split("\n", 1)[1].strip())), "bench.gpu", argv, title
            )
            write_text_atomic(rows_path(args.json), dumps(run))
            data = {
                "info": info,
                "targets": [list(t) for t in targets(train_rows, scoring, vision, gemm)],
                "gemm": gemm,
                "training": train_rows,
                "scoring": scoring,
                "vision": vision,
                "errors": errors,
            }
            write_text_atomic(args.json, json.dumps(data, indent=2, default=str))

    def section(name: str, work) -> object:
        try:
            return work()
        except Exception as exc:  # noqa: BLE001 (one section's failure is reported; the others still run)
            logger.exception("%s failed", name)
            errors[name] = f"{type(exc).__name__}: {exc}"[:500]
            return None
        finally:
            gc.collect()  # the section's model and optimizer (peft makes reference cycles)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            save()

    with tempfile.TemporaryDirectory(prefix="keyshot-gpu-kit-") as tmp:
        from transformers import AutoProcessor

        fixture = build_tiny_qwen25vl(Path(tmp) / "fixture")
        processor = AutoProcessor.from_pretrained(fixture)
        set_processor_pixel_bounds(processor, DEFAULT_POLICY.min_pixels, DEFAULT_POLICY.max_pixels)
        kit = Kit(device, dtype, shape, processor, fixture, peak, source)
        info = {
            "device": torch.cuda.get_device_name(device)
            if device.type == "cuda"
            else platform.processor() or "CPU",
            "versions": versions(),
            "commit": commit(),
            "workers": workers,
        }
        rows = list(scorer_rows(args.rows, seed=0, agent="bench", sizes=SIZES))
        if args.gemm:
            logger.info("GEMM ceiling")
            renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=4096)
            lengths = sorted(Rendered(rows, renderer).lengths)
            tokens = (args.batch or 4) * lengths[len(lengths) // 2]  # one micro-batch of the 7B configs
            gemm = section("GEMM ceiling", lambda: gemm_ceiling(kit, tokens))
        if args.vision_batches:
            logger.info("vision tower")
            vision_sizes = [int(b) for b in args.vision_batches.split(",")]
            vision = section("vision tower", lambda: vision_bench(kit, vision_sizes, args.score_reps))
        for setting in settings:
            for batching in args.batchings.split(","):
                logger.info("training: %s, %s", setting.label, batching)
                row = section(
                    f"training {setting.label} {batching}",
                    lambda setting=setting, batching=batching: train_fitting(
                        kit,
                        rows,
                        setting=setting,
                        batching=batching,
                        batch=args.batch,
                        steps=args.steps,
                        warmup=args.warmup,
                        repeats=args.repeats,
                        workers=workers,
                    ),
                )
                if row is not None:
                    train_rows.append(row)
        logger.info("scoring")
        batches = [int(b) for b in args.score_batches.split(",") if b]

        def score_all() -> dict:
            result, model = scorer_bench(kit, batches, args.score_reps)
            result["vllm"] = vllm_row(kit, model, not args.no_vllm, max(batches), Path(tmp))
            return result

        if batches:
            scoring = section("scoring", score_all)
    save()
    print(args.out.read_text())
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
