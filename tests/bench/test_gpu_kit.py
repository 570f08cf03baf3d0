"""bench/gpu.py, the GPU benchmark kit, end to end on the CPU with the tiny shape (the GPU run is the same
code with ``--shape 7b``), and the 7B shape it builds (on the meta device: no memory)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import gpu


def test_kit_runs_end_to_end_on_cpu(tmp_path):
    out, raw = tmp_path / "RESULTS-gpu.md", tmp_path / "kit.json"
    argv = ["--shape", "tiny", "--warmup", "1", "--steps", "1", "--repeats", "2", "--rows", "8"]
    argv += ["--score-batches", "1,2", "--score-reps", "1", "--batchings", "random", "--vision-batches", "1"]
    argv += ["--train", "lora;full;lora (no checkpointing)=lora:gradient_checkpointing=false"]
    assert gpu.main([*argv, "--no-vllm", "--out", str(out), "--json", str(raw)]) == 0
    text = out.read_text()
    for needle in (
        "| lora | `liger_kernel=False (CUDA only: off here)`, `vision_attention=batched (CUDA only: off here)` | random |",
        "| full | `liger_kernel=False (CUDA only: off here)`, `vision_attention=batched (CUDA only: off here)` | random |",
        "| lora (no checkpointing) | `gradient_checkpointing=false`, `liger_kernel=False (CUDA only: off here)`, `vision_attention=batched (CUDA only: off here)` | random |",
        "| transformers | 2 |",
        "vLLM (keyshot serve)",
        "| batched windows |",
        "| + MLP padded to 128, gate and up in one product |",
        "## Targets",
        "| LoRA step ≤ 0.8x the full fine-tune's",
        "## The practical ceiling",
    ):
        assert needle in text
    assert "token ids identical, pixel tensors identical" in text
    assert "Sections that failed" not in text
    data = json.loads(raw.read_text())
    assert len(data["training"]) == 3 and data["errors"] == {}
    assert all(v["max_abs_diff"] < 1e-4 for v in data["vision"]["variants"])  # float32 on the CPU
    lora, full, unchecked = data["training"]
    # the shipped configs: LoRA r=64 on the language model, checkpointing on; the override switches it off
    assert (lora["checkpointed_share"], full["checkpointed_share"], unchecked["checkpointed_share"]) == (
        1,
        1,
        0,
    )
    for row in data["training"]:
        assert row["depth"] == row["full_depth"] and row["repeats"] == 2
        spread = row["spread"]["step_s"]
        assert spread["min"] <= row["step_s"] <= spread["max"]
        # HFU counts the recompute of the checkpointed decoder: above MFU exactly when checkpointing
        assert (row["hfu"] > row["mfu"]) == (row["checkpointed_share"] > 0)
        shares = row["phases"]
        assert abs(sum(shares.values()) - 1.0) < 1e-6 and shares["vision forward"] > 0
        assert shares["language-model backward"] > 0 and shares["language-model forward"] > 0
        assert row["vision_calls_per_step"] == 1.0  # the frozen tower runs once per step (no recompute)
    # the merger trains in a full fine-tune: its backward is timed apart; under LoRA nothing reaches the tower
    assert full["phases"]["vision backward"] > 0 and lora["phases"].get("vision backward", 0.0) == 0
    gemm = data["gemm"]
    assert gemm["tflops_per_s"] > 0 and len(gemm["rows"]) == 12
    scoring = data["scoring"]
    assert scoring["visual_tokens"] == 1196  # 1280×720 at the scorer's pixel bounds, as for the 7B
    # the ceiling leaves out the LM head on the positions a prefill skips (logits_to_keep=1)
    assert scoring["head_flops_skipped"] > 0
    assert all(0 < r["ceiling_fraction"] < 1 for r in scoring["rows"])
    names = [t[0] for t in data["targets"]]
    assert any(n.startswith("in-process scorer") for n in names) and any("GEMM rate" in n for n in names)


def test_the_7b_shape_is_qwen25_vl_7b(tmp_path):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    fixture = build_tiny_qwen25vl(tmp_path / "fixture")
    kit = gpu.Kit(
        torch.device("cpu"), torch.bfloat16, "7b", AutoProcessor.from_pretrained(fixture), fixture, 1.0, ""
    )
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(gpu.model_config(kit), dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    assert total == pytest.approx(8.29e9, rel=0.01)  # Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters
    visual = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    assert visual == pytest.approx(676e6, rel=0.02)
    half = gpu.model_config(kit, depth=14).get_text_config()
    assert half.num_hidden_layers == 14
