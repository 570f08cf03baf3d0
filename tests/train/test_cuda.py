"""CUDA checks of the training recipe and the in-process scorer (``-m gpu``; skipped without CUDA).

CI has no GPU: these run on a lent GPU machine (``pytest -m gpu tests/train/test_cuda.py``). The CPU test
that guards the same bug class is ``tests/train/test_model_setup.py::test_log_totals_meet_on_the_model_device``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
import torch

from tests.support import paths

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

REPO = paths.REPO


def test_log_totals_on_cuda():
    from keyshot.train.throughput import FlopsModel, ThroughputMeter, log_totals
    from tests.support.tiny_model import FLOPS_ARGS

    meter = ThroughputMeter(FlopsModel(**FLOPS_ARGS), peak_tflops_per_device=1.0, world_size=1)
    meter.add_batch(
        {"attention_mask": torch.ones(1, 10, dtype=torch.long), "image_grid_thw": torch.tensor([[1, 4, 4]])}
    )
    stats = log_totals([torch.tensor(1.0, device="cuda")], meter, torch.device("cuda"))
    assert stats.is_cuda and stats[0].item() == 1.0


def test_scorer_on_cuda_loads_bf16_and_answers(tiny_model_dir):
    from PIL import Image

    from keyshot.infer.judge.local_scorer import TransformersScorer
    from keyshot.infer.protocol.images import prepare_image
    from keyshot.infer.protocol.prompts import load_prompt_set

    scorer = TransformersScorer(tiny_model_dir, load_prompt_set(), device="cuda", max_new_tokens=8)
    assert scorer.model.dtype == torch.bfloat16
    image = prepare_image(Image.new("RGB", (1280, 720), "white"), scorer.image_policy)
    out = scorer.generate("a task", "1. a key point", [image, image])
    assert len(out) == 2 and out[0].text == out[1].text and out[0].prompt_tokens > 0


def test_recipe_logs_evaluates_checkpoints_and_resumes_on_cuda(tiny_model_dir, tmp_path):
    pytest.importorskip("datasets")
    from keyshot.infer.testing.scorer_data import build_scorer_dataset

    data = build_scorer_dataset(tmp_path / "data", n_train=16, n_val=4, seed=0)
    run_dir = tmp_path / "run"
    command = [
        sys.executable,
        "-m",
        "keyshot.train.sft",
        "--config",
        "configs/train/tiny_cpu.yaml",
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={data}",
        f"run_dir={run_dir}",
        "log.tracker=none",
        "log.every_steps=1",
        "eval.every_steps=2",
        "checkpoint.every_steps=2",
        "mixed_precision=bf16",
    ]
    # preempted mid-run (SIGUSR1 as SLURM sends it), then resumed to the end
    proc = subprocess.Popen([*command, "max_steps=8"], cwd=REPO, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 600
    while not (metrics.exists() and metrics.read_text().count("\n") >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()[-4000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    assert proc.wait(timeout=600) == 75, proc.stderr.read()[-4000:]
    assert (run_dir / "preempted.json").is_file()
    resumed = subprocess.run([*command, "max_steps=8"], cwd=REPO, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "resumed from" in resumed.stderr
    assert (run_dir / "final" / "model.safetensors").is_file()
