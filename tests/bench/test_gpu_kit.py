"""bench/gpu.py, the GPU benchmark kit, end to end on the CPU with the tiny shape (the GPU run is the same
code with ``--shape 7b``), and the 7B shape it builds (on the meta device: no memory)."""

from __future__ import annotations

import json

import pytest
import torch

from bench import gpu
from bench.gpu_kit import kit, training
from bench.record import read, rows_path


def test_kit_runs_end_to_end_on_cpu(tmp_path, monkeypatch):
    """The tiny shape through every section; each training row runs the recipe's own train_step, amortises
    its optimizer as the recipe does, and prints its timed step over its profiled step."""
    from keyshot.train import step

    calls: list[int] = []

    def recipe_step(*args, **kwargs):  # the recipe's step itself, counted
        calls.append(1)
        return step.train_step(*args, **kwargs)

    monkeypatch.setattr(training, "train_step", recipe_step)
    out, raw = tmp_path / "RESULTS-gpu.md", tmp_path / "kit.json"
    argv = ["--shape", "tiny", "--warmup", "1", "--steps", "2", "--repeats", "2", "--rows", "8"]
    argv += ["--score-batches", "1,2", "--score-reps", "1", "--batchings", "random", "--vision-batches", "1"]
    argv += ["--train", "lora;fused at the cap=lora@2048:lora.fused=true,unchecked_token_cap=4096;full"]
    assert gpu.main([*argv, "--no-vllm", "--out", str(out), "--json", str(raw)]) == 0
    text = out.read_text()
    for needle in (
        "| lora | `liger_kernel=False (CUDA only: off here)`, `vision_attention=batched (CUDA only: off here)` |",
        "| full | `liger_kernel=False (CUDA only: off here)`, `vision_attention=batched (CUDA only: off here)` |",
        "| fused at the cap | `lora.fused=true`, `unchecked_token_cap=4096`, `liger_kernel=False (CUDA only: off here)`",
        "| transformers | 2 |",
        "vLLM (keyshot serve)",
        "| batched windows |",
        "| + MLP padded to 128, gate and up in one product |",
        "| + packing from the grid (no host sync in the forward) |",
        "## Targets",
        "| timed step within 5 % of the profiled step (full) |",
        "| LoRA: the language model's forward and backward ≥ 65 % of the GEMM rate (lora) |",
        "## The practical ceiling",
        "timed/profiled",
    ):
        assert needle in text, needle
    assert "token ids identical, pixel tensors identical" in text
    # beside the JSON, its row file: the report's blocks as notes, of which bench.results makes RESULTS-gpu.md
    run = read(rows_path(raw))
    assert run.title == "the kit on " + json.loads(raw.read_text())["info"]["device"]
    assert "## Targets" in run.rows.notes and all(note in text for note in run.rows.notes)
    assert run.command.startswith("python -m bench.gpu --shape tiny")
    assert "Sections that failed" not in text
    data = json.loads(raw.read_text())
    assert len(data["training"]) == 3 and data["errors"] == {}
    assert all(v["max_abs_diff"] < 1e-4 for v in data["vision"]["variants"])  # float32 on the CPU
    lora, capped, full = data["training"]
    # every micro-batch ran through train_step: warm-up, two timed passes and the profiled one, each row
    assert len(calls) == sum(r["warmup"] + 3 * r["steps"] for r in data["training"])
    # the optimizer amortised over the recipe's accumulation on one rank: LoRA 256/4, the full config's 16
    assert (lora["accumulation"], full["accumulation"], capped["accumulation"]) == (64, 16, 128)
    # the shipped LoRA config: micro-batches of 4 short rows fit its cap and run without checkpointing
    assert lora["recomputed_share"] == 0 and lora["memory_plan"].startswith("no activation checkpointing")
    assert full["recomputed_share"] == 1 and "on every micro-batch" in full["memory_plan"]
    # rows of ~2,048 tokens, as many as the cap holds in a micro-batch: none checkpointed
    assert 1900 < capped["row_tokens"] <= 2048 and capped["micro_batch"] == 2
    assert capped["max_batch_tokens"] <= 4096 and capped["recomputed_share"] == 0
    for row in data["training"]:
        assert row["depth"] == row["full_depth"] and row["repeats"] == 2
        assert row["warmup"] >= row["shape_buckets"] >= 1
        assert row["timed_vs_profiled"] > 0 and row["timing_agrees"] == (
            abs(row["timed_vs_profiled"] - 1) <= 0.05
        )
        spread = row["spread"]["step_s"]
        assert spread["min"] <= row["step_s"] <= spread["max"]
        # the optimizer step paid once per accumulation: less of it in the step than in the timed pass's mean
        assert row["optimizer_s"] > 0 and row["step_s"] <= row["timed_step_s"]
        # HFU counts the recompute of the checkpointed decoder: above MFU exactly when a layer is recomputed
        assert (row["hfu"] > row["mfu"]) == (row["recomputed_share"] > 0)
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
    assert sum(n.startswith("timed step within 5 %") for n in names) == 3


def test_a_training_row_names_its_config_overrides_and_long_rows():
    setting = training.TrainSetting.parse("cap=lora@4096:lora.fused=true,unchecked_token_cap=8192")
    assert (setting.label, setting.mode, setting.row_tokens) == ("cap", "lora", 4096)
    assert setting.overrides == ("lora.fused=true", "unchecked_token_cap=8192")
    assert training.TrainSetting.parse("full") == training.TrainSetting("full", "full")
    cfg, dropped = setting.config(torch.device("cpu"))
    assert cfg.model.lora.fused and cfg.model.unchecked_token_cap == 8192 and dropped
    assert training.micro_batch(cfg, 4096, None) == 2 and training.micro_batch(cfg, 3000, None) == 2
    assert training.micro_batch(cfg, None, None) == cfg.per_device_batch_size == 4
    assert (
        training.micro_batch(cfg, 4096, 3) == 2
    )  # a divisor of the global batch: the accumulation must divide
    defaults = [training.TrainSetting.parse(t) for t in training.DEFAULT_TRAIN.split(";")]
    assert [s.mode for s in defaults] == ["lora"] * 5 + ["full"]
    for bad in ("dora", "x=lora@many:lora.r=4"):
        with pytest.raises(SystemExit, match="the mode must be one of"):
            training.TrainSetting.parse(bad)


def test_the_7b_shape_is_qwen25_vl_7b(tmp_path):
    from transformers import AutoProcessor, Qwen2_5_VLForConditionalGeneration

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    fixture = build_tiny_qwen25vl(tmp_path / "fixture")
    shape = kit.Kit(
        torch.device("cpu"), torch.bfloat16, "7b", AutoProcessor.from_pretrained(fixture), fixture, 1.0, ""
    )
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration._from_config(kit.model_config(shape), dtype=torch.bfloat16)
    total = sum(p.numel() for p in model.parameters())
    assert total == pytest.approx(8.29e9, rel=0.01)  # Qwen2.5-VL-7B-Instruct: 8,292,166,656 parameters
    visual = sum(p.numel() for n, p in model.named_parameters() if ".visual." in f".{n}")
    assert visual == pytest.approx(676e6, rel=0.02)
    half = kit.model_config(shape, depth=14).get_text_config()
    assert half.num_hidden_layers == 14
