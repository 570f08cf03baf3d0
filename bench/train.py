"""Training step time: naive padding (shuffled fixed-size batches) vs length-grouped batches, same run.

    python -m bench.train                      # tiny Qwen2.5-VL, 96 synthetic screenshots of mixed sizes
    python -m bench.train --rows 192 --batch-size 8 --rounds 3 --json runs/bench/train.json

Both strategies train a fresh copy of the same tiny model (same init, AdamW) over the same examples,
pre-rendered once (chat template, labels, images under the scorer's policy), so only batching differs:
each epoch is collate + forward + backward + optimizer step for every batch. Rounds alternate the
strategies (different shuffles per round) so drifting load on a shared machine hits both alike. The
tiny model's processor gets ``--max-pixels`` large enough that screenshot sizes, hence sequence lengths,
vary as in real data (320×240 → ~100 visual tokens, 1280×720 → ~1,200, tall pages more).
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from bench import record
from bench.record import Rows, ratio_table
from keyshot.infer.model.tiny_model import build_tiny_qwen25vl
from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for
from keyshot.infer.testing.scorer_data import scorer_rows
from keyshot.train.batches import (
    LengthGroupedBatchSampler,
    RandomBatchSampler,
    ScorerCollator,
    padding_fraction,
)

logger = logging.getLogger(__name__)

STRATEGIES = {
    "naive padding (random batches)": RandomBatchSampler,
    "length-grouped batches": LengthGroupedBatchSampler,
}


@dataclass
class Result:
    strategy: str
    epochs: int
    seconds_per_epoch: float
    samples_per_s: float
    real_tokens_per_s: float
    padding_fraction: float
    speedup_vs_padding: float
    detail: str = ""


def _epoch(model, optimizer, examples, batches, collator) -> float:
    start = time.perf_counter()
    for batch_indices in batches:
        batch = collator([examples[i] for i in batch_indices])
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> dict:
    from transformers import AutoModelForImageTextToText, AutoProcessor

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="keyshot-bench-train-") as tmp:
        model_dir = build_tiny_qwen25vl(Path(tmp) / "tiny", seed=0, max_pixels=args.max_pixels)
        processor = AutoProcessor.from_pretrained(model_dir)
        renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=args.max_length)
        rows = list(scorer_rows(args.rows, seed=0, agent="bench"))
        examples = [renderer.render(r["messages"], r["image"]) for r in rows]
        lengths = [e["input_ids"].numel() for e in examples]
        base = AutoModelForImageTextToText.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
    for name, p in base.named_parameters():  # the recipe's default: vision tower frozen
        p.requires_grad = not ("visual." in name and "merger" not in name)
    collator = ScorerCollator(processor.tokenizer.pad_token_id)
    logger.info(
        "%d examples, %d..%d tokens (mean %.0f), batch %d",
        len(lengths),
        min(lengths),
        max(lengths),
        statistics.mean(lengths),
        args.batch_size,
    )

    states = {}
    for name in STRATEGIES:
        model = copy.deepcopy(base).train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        warm = STRATEGIES[name](lengths, args.batch_size, seed=99)
        _epoch(model, optimizer, examples, list(warm)[:2], collator)  # allocator / kernel warm-up
        states[name] = {"model": model, "optimizer": optimizer, "seconds": [], "padding": [], "tokens": 0}

    for round_ in range(args.rounds):
        order = list(STRATEGIES) if round_ % 2 == 0 else list(reversed(STRATEGIES))
        for name in order:
            sampler = STRATEGIES[name](lengths, args.batch_size, seed=round_)
            batches = list(sampler)
            st = states[name]
            st["seconds"].append(_epoch(st["model"], st["optimizer"], examples, batches, collator))
            st["padding"].append(padding_fraction(batches, lengths))
            st["tokens"] += sum(lengths[i] for b in batches for i in b)
            logger.info("round %d %s: %.2f s", round_ + 1, name, st["seconds"][-1])

    baseline = statistics.mean(states["naive padding (random batches)"]["seconds"])
    results = []
    for name, st in states.items():
        seconds = statistics.mean(st["seconds"])
        samples = len(list(STRATEGIES[name](lengths, args.batch_size))) * args.batch_size
        results.append(
            Result(
                strategy=name,
                epochs=args.rounds,
                seconds_per_epoch=seconds,
                samples_per_s=samples / seconds,
                real_tokens_per_s=st["tokens"] / sum(st["seconds"]),
                padding_fraction=statistics.mean(st["padding"]),
                speedup_vs_padding=baseline / seconds,
                detail=(
                    f"{seconds:.2f} vs {baseline:.2f} s/epoch, padding {100 * statistics.mean(st['padding']):.0f}%, "
                    f"tiny Qwen2.5-VL, {args.rows} rows of {min(lengths)}-{max(lengths)} tokens, batch {args.batch_size}"
                ),
            )
        )
    return {
        "settings": {**vars(args), "json": None},
        "lengths": {"min": min(lengths), "max": max(lengths), "mean": statistics.mean(lengths)},
        "machine": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
        },
        "results": [asdict(r) for r in results],
    }


def rows_of(data: dict) -> Rows:
    compared = [
        (
            f"{r['strategy']} vs naive padding, seconds per epoch",
            f"{r['speedup_vs_padding']:.2f}×",
            r["detail"],
        )
        for r in data["results"]
        if r["speedup_vs_padding"] != 1.0
    ]
    return Rows((ratio_table(compared),))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=96)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=2, help="timed epochs per strategy (alternating)")
    ap.add_argument("--max-pixels", type=int, default=1600 * 28 * 28, help="the tiny processor's max_pixels")
    ap.add_argument("--max-length", type=int, default=4096)
    record.json_option(ap)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    report = run(args)
    print(f"\n{'strategy':34} {'s/epoch':>8} {'samples/s':>10} {'tokens/s':>9} {'padding':>8} {'speedup':>8}")
    for r in report["results"]:
        print(
            f"{r['strategy']:34} {r['seconds_per_epoch']:8.2f} {r['samples_per_s']:10.2f} "
            f"{r['real_tokens_per_s']:9.0f} {100 * r['padding_fraction']:7.1f}% {r['speedup_vs_padding']:7.2f}×"
        )
    return record.finish(args.json, report, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
