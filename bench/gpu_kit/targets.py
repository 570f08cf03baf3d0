"""The kit's targets and whether each row meets them."""

from __future__ import annotations

# ----------------------------------------------------------------------------- report
#: The targets (issue 56; the scorer's of issue 47), as ratios on one GPU.
TARGETS = {
    "lora_step_vs_full": 0.85,
    "lora_mfu_checkpointed": 0.30,
    "lora_mfu_unchecked": 0.42,
    "llm_of_gemm": 0.65,
    "tower_batch1": 35.0,
    "scorer_batch1": 0.40,
    "scorer_batch8": 0.50,
}


def _measured(train_rows: list[dict]) -> list[dict]:
    return [r for r in train_rows if not r.get("oom")]


def _best(rows: list[dict], key: str) -> dict | None:
    return max(rows, key=lambda r: r[key]) if rows else None


def targets(
    train_rows: list[dict], scoring: dict | None, vision: dict | None, gemm: dict | None
) -> list[tuple]:
    """(target, measured, met) for each target that this run measured. LoRA counts 4N per token (its
    language model's forward and input gradients); "checkpointed" rows recompute every decoder layer for
    every micro-batch, "without checkpointing" rows none."""
    out = []
    rows = _measured(train_rows)
    lora = [r for r in rows if r["mode"].startswith("lora")]
    checked = [r for r in lora if r["recomputed_share"] >= 1.0]
    unchecked = [r for r in lora if r["recomputed_share"] == 0.0]
    full = next((r for r in rows if r["mode"] == "full"), None)
    if (best := _best(checked, "mfu")) is not None:
        out.append(
            (
                f"LoRA checkpointed ≥ 30 % MFU ({best['mode']})",
                f"{100 * best['mfu']:.1f} %",
                best["mfu"] >= TARGETS["lora_mfu_checkpointed"],
            )
        )
        if full is not None:
            ratio = best["step_s"] / full["step_s"]
            out.append(
                (
                    f"LoRA checkpointed step ≤ 0.85x the full fine-tune's, optimizers amortised as the recipe's ({best['mode']})",
                    f"{ratio:.2f}x",
                    ratio <= TARGETS["lora_step_vs_full"],
                )
            )
    if (best := _best(unchecked, "mfu")) is not None:
        out.append(
            (
                f"LoRA without checkpointing ≥ 42 % MFU ({best['mode']})",
                f"{100 * best['mfu']:.1f} %",
                best["mfu"] >= TARGETS["lora_mfu_unchecked"],
            )
        )
    if gemm:
        for r in lora:
            share = r["llm_tflops_per_s"] / gemm["tflops_per_s"]
            out.append(
                (
                    f"LoRA: the language model's forward and backward ≥ 65 % of the GEMM rate ({r['mode']})",
                    f"{100 * share:.1f} %",
                    share >= TARGETS["llm_of_gemm"],
                )
            )
    if vision and any(1 in v["rates"] for v in vision.get("variants", [])):
        best = max(vision["variants"], key=lambda v: v["rates"].get(1, 0.0))
        out.append(
            (
                f"vision tower ≥ 35 screenshots/s at batch 1 ({best['name']})",
                f"{best['rates'][1]:.1f}/s",
                best["rates"][1] >= TARGETS["tower_batch1"],
            )
        )
    for r in rows:
        out.append(
            (
                f"timed step within 5 % of the profiled step ({r['mode']})",
                f"{r['timed_vs_profiled']:.3f}x",
                r["timing_agrees"],
            )
        )
    if scoring:
        for r in scoring["rows"]:
            goal = TARGETS["scorer_batch1"] if r["batch"] < 8 else TARGETS["scorer_batch8"]
            same = [v for v in scoring.get("variants", []) if v["batch"] == r["batch"]]
            best = max([r, *same], key=lambda v: v["ceiling_fraction"])
            out.append(
                (
                    f"in-process scorer ≥ {100 * goal:.0f} % of its ceiling at batch {r['batch']} ({best['variant']}; issue 47)",
                    f"{100 * best['ceiling_fraction']:.1f} %",
                    best["ceiling_fraction"] >= goal,
                )
            )
    return out
