"""The kit's page: its figures as Markdown."""

from __future__ import annotations

import time

from bench.gpu_kit.kit import Kit
from bench.gpu_kit.targets import targets


def _cell(spread: dict, scale: float = 1.0, fmt: str = ".2f") -> str:
    return f"{spread['median'] * scale:{fmt}} ({spread['min'] * scale:{fmt}}–{spread['max'] * scale:{fmt}})"


def markdown(
    kit: Kit,
    info: dict,
    train_rows: list[dict],
    scoring: dict | None,
    command: str,
    vision: dict | None = None,
    errors: dict[str, str] | None = None,
    gemm: dict | None = None,
) -> str:
    lines = [
        "# keyshot GPU benchmark kit (bench/gpu.py)",
        "",
        f"Device: **{info['device']}**; peak {kit.peak_tflops:g} TFLOP/s ({kit.peak_source}); shape `{kit.shape}`, "
        f"dtype {str(kit.dtype).removeprefix('torch.')}. Command: `{command}`. {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "Versions: "
        + ", ".join(f"{k} {v}" for k, v in info["versions"].items())
        + f". Commit {info['commit']}.",
        "",
    ]
    met = targets(train_rows, scoring, vision, gemm)
    if met:
        lines += ["## Targets", "", "| target | measured | met |", "|---|---:|---|"]
        lines += [f"| {name} | {value} | {'yes' if ok else '**no**'} |" for name, value, ok in met]
        lines.append("")
    if gemm:
        lines += [
            "## The practical ceiling: bf16 products at the language model's shapes",
            "",
            f"{gemm['tokens']:,} rows (one micro-batch's tokens); weighted by a decoder layer's products: "
            f"**{gemm['tflops_per_s']:.3g} TFLOP/s** ({100 * gemm['tflops_per_s'] / kit.peak_tflops:.0f} % of the data sheet's peak).",
            "",
            "| product | form | m, k, n | TFLOP/s |",
            "|---|---|---|---:|",
        ]
        lines += [
            f"| {r['shape']} | {r['form']} | {', '.join(f'{x:,}' for x in r['m_k_n'])} | {r['tflops_per_s']:.3g} |"
            for r in gemm["rows"]
        ]
        lines.append("")
    lines += [
        "## Training (the recipe's step: keyshot.train.step.train_step and build_optimizer under accelerate)",
        "",
        "Each row: the shipped 7B config of its mode with the overrides it names, one window of micro-batches "
        "drawn once from the recipe's sampler; a warm-up until every shape bucket of the window ran, then timed "
        "passes over the window (per-step CUDA events, no synchronise, garbage collection off) and one profiled "
        "pass over the same batches. Step s amortises the optimizer step over the recipe's accumulation (one "
        "rank of its global batch), as the recipe pays it. Medians of the timed passes, their range in "
        "brackets. MFU counts the model's FLOPs (`keyshot.train.throughput.FlopsModel`, LoRA at 4N); HFU adds "
        "what checkpointing recomputes. Timed/profiled: the timed pass's mean step over the profiled one's "
        "(5 % apart at most).",
        "",
        "| mode | overrides | tokens/row | micro-batch | depth | samples/s | step s | TFLOP/s | MFU | HFU | timed/profiled | peak GiB |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in train_rows:
        if r.get("oom"):
            lines.append(f"| {r['mode']} | | | {r['micro_batch']} | does not fit | | | | | | | |")
            continue
        depth = f"{r['depth']}/{r['full_depth']}" + (
            " (reduced: full depth does not fit)" if r["depth"] < r["full_depth"] else ""
        )
        mem = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "n/a"
        sp = r["spread"]
        timing = f"{r['timed_vs_profiled']:.3f}" + (
            "" if r["timing_agrees"] else " (**more than 5 % apart**)"
        )
        lines.append(
            f"| {r['mode']} | {', '.join(f'`{o}`' for o in r['overrides']) or '—'} | {r['row_tokens']:,.0f} "
            f"| {r['micro_batch']} | {depth} | {_cell(sp['samples_per_s'])} | {_cell(sp['step_s'], fmt='.3f')} "
            f"| {r['tflops_per_s']:.3g} | {_cell(sp['mfu'], 100, '.1f')} % | {_cell(sp['hfu'], 100, '.1f')} % "
            f"| {timing} | {mem} |"
        )
    lines += ["", "Checkpointing and the optimizer, per row:", ""]
    for r in train_rows:
        if not r.get("oom"):
            lines.append(
                f"- {r['mode']}: {r['memory_plan']}; the window's largest micro-batch {r['max_batch_tokens']:,} "
                f"token slots; the optimizer step {r['optimizer_s']:.3f} s once per {r['accumulation']} micro-batches; "
                f"{r['shape_buckets']} shape bucket(s) in {r['warmup']} warm-up step(s); rendering "
                f"{r['render_s_per_batch']:.3f} s a batch in {r['workers']} DataLoader workers"
            )
    lines += [
        "",
        "### Where a training step's time goes (the profiled pass, each phase closed by a synchronise)",
        "",
        "The vision backward runs from the gradient's arrival at the tower's output to the backward's end "
        "(the merger's, and the tower's where it trains); the language model's phases exclude both tower phases; "
        "the optimizer's share is of the profiled pass (one step in it).",
        "",
    ]
    names = [
        "host→device copy",
        "vision forward",
        "language-model forward",
        "language-model backward",
        "vision backward",
        "optimizer",
        "logging",
        "unaccounted",
    ]
    lines.append(
        "| mode | "
        + " | ".join(names)
        + " | profiled step s | vision forwards/step | LM fwd+bwd MFU | LM fwd+bwd TFLOP/s (recompute included) |"
    )
    lines.append("|---|" + "---:|" * (len(names) + 4))
    for r in train_rows:
        if r.get("oom"):
            continue
        cells = " | ".join(f"{100 * r['phases'].get(n, 0.0):.1f}%" for n in names)
        lines.append(
            f"| {r['mode']} | {cells} | {r['profiled_step_s']:.3f} | {r['vision_calls_per_step']:.1f} "
            f"| {100 * r['llm_mfu']:.1f}% | {r['llm_tflops_per_s']:.3g} |"
        )
    if scoring:
        lines += [
            "",
            "## Scoring (in-process TransformersScorer, prefill, 1280×720, the real scorer prompt)",
            "",
            f"One request: {scoring['request_tokens']:,} tokens ({scoring['visual_tokens']:,} visual), "
            f"{scoring['flops_per_screenshot'] / 1e12:.2f} TFLOP forward (the LM head on the one position kept); "
            f"compute ceiling {scoring['ceiling_screenshots_per_s']:.1f} screenshots/s at the data sheet's peak.",
            "",
            "| back-end | batch | screenshots/s | of the ceiling | CPU preprocessing s/screenshot |",
            "|---|---:|---:|---:|---:|",
        ]
        for r in scoring["rows"]:
            lines.append(
                f"| transformers | {r['batch']} | {r['screenshots_per_s']:.2f} | {100 * r['ceiling_fraction']:.1f}% | {r['preprocess_s']:.4f} |"
            )
        for r in scoring.get("variants", []):
            lines.append(
                f"| transformers {r['variant']} | {r['batch']} | {r['screenshots_per_s']:.2f} | {100 * r['ceiling_fraction']:.1f}% | {r['preprocess_s']:.4f} |"
            )
        lines.append(f"| vLLM (keyshot serve) | | {scoring['vllm']} | | |")
        lines += [f"- not measured: {note}" for note in scoring.get("failed", [])]
        p = scoring["parity"]
        lines += [
            "",
            f"Train/serve parity on {info['device']}: token ids {'identical' if p['token_ids_equal'] else 'DIFFER'}, "
            f"pixel tensors {'identical' if p['pixels_equal'] else 'DIFFER'} ({p['tokens']:,} tokens).",
        ]
    if vision:
        sizes = list(vision["variants"][0]["rates"]) if vision.get("variants") else []
        lines += [
            "",
            "## Vision tower alone (1280×720 screenshots, the shape's tower, inference)",
            "",
            f"{vision['patches_per_image']:,} patches per screenshot, {vision['flops_per_screenshot'] / 1e12:.2f} TFLOP "
            "(blocks with attention, the merger once per merged token); each row adds one change to the row above; "
            f"|difference| is the largest against transformers' output (which reaches {vision['ref_abs_max']:.3g}).",
            "",
            "| variant | |difference| | "
            + " | ".join(f"batch {n}: screenshots/s (MFU)" for n in sizes)
            + " |",
            "|---|---:|" + "---:|" * len(sizes),
        ]
        for v in vision.get("variants", []):
            cells = " | ".join(f"{v['rates'][n]:.2f} ({100 * v['mfu'][n]:.1f}%)" for n in sizes)
            lines.append(f"| {v['name']} | {v['max_abs_diff']:.3g} | {cells} |")
        lines += [f"- not measured: {note}" for note in vision.get("failed", [])]
        if vision.get("profile"):
            lines += [
                "",
                "Kernels of the last variant (torch.profiler, CUDA time):",
                "",
                "```",
                vision["profile"],
                "```",
            ]
    if errors:
        lines += ["", "## Sections that failed", ""]
        lines += [f"- {name}: `{message}`" for name, message in errors.items()]
    return "\n".join(lines) + "\n"
