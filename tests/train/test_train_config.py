"""Every shipped training config loads; the batch arithmetic; the SLURM launcher's node ranks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keyshot.infer.common.config import ConfigError, load_config
from keyshot.train.train_config import LLM_LORA_TARGET, TrainConfig
from tests.support import paths

REPO = paths.REPO
TRAIN_CONFIGS = sorted((REPO / "configs" / "train").glob("*.yaml"))
ACCELERATE_CONFIGS = sorted((REPO / "configs" / "accelerate").glob("*.yaml"))
DEEPSPEED_CONFIGS = sorted((REPO / "configs" / "deepspeed").glob("*.json"))


def _opening_comment(path: Path) -> str:
    return path.read_text(encoding="utf-8").splitlines()[0]


@pytest.mark.parametrize("path", TRAIN_CONFIGS, ids=lambda p: p.name)
def test_train_configs_load_and_name_their_command(path):
    cfg = load_config(TrainConfig, path)
    text = path.read_text(encoding="utf-8")
    assert _opening_comment(path).startswith("#")
    launch = ("-m keyshot.train.sft --config configs/train/", "train/sft.py --config configs/train/")
    assert any(form + path.name in text for form in launch)
    world = cfg.world_size or 1
    assert cfg.gradient_accumulation_steps(world) * cfg.per_device_batch_size * world == cfg.global_batch_size


def test_the_paper_recipe():
    cfg = load_config(TrainConfig, REPO / "configs/train/webjudge7b_full.yaml")
    assert cfg.model.name_or_path == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert (cfg.mixed_precision, cfg.model.dtype) == ("bf16", "bfloat16")
    assert (cfg.global_batch_size, cfg.world_size, cfg.gradient_accumulation_steps(4)) == (256, 4, 16)
    assert (cfg.data.max_length, cfg.epochs, cfg.optim.lr) == (4096, 5, 5e-6)
    assert (cfg.optim.scheduler, cfg.optim.warmup_ratio) == ("cosine", 0.1)
    assert not cfg.model.lora.enabled and not cfg.model.train_vision_tower
    lora = load_config(TrainConfig, REPO / "configs/train/webjudge7b_lora.yaml")
    assert lora.model.lora.enabled and lora.model.lora.target_modules == LLM_LORA_TARGET


def test_gradient_accumulation_must_divide():
    cfg = TrainConfig(global_batch_size=256, per_device_batch_size=4)
    assert cfg.gradient_accumulation_steps(4) == 16
    assert cfg.gradient_accumulation_steps(1) == 64
    with pytest.raises(
        ConfigError, match=r"256 is not a multiple of per_device_batch_size \(4\) × world_size \(3\)"
    ):
        cfg.gradient_accumulation_steps(3)
    with pytest.raises(ConfigError, match="not a multiple"):
        load_config(TrainConfig, REPO / "configs/train/webjudge7b_full.yaml", ["per_device_batch_size=5"])
    pinned = TrainConfig(global_batch_size=256, per_device_batch_size=4, world_size=4)
    with pytest.raises(ConfigError, match="expects world_size=4 processes but the launch has 2"):
        pinned.gradient_accumulation_steps(2)


def test_unknown_and_bad_keys_are_rejected():
    path = REPO / "configs/train/tiny_cpu.yaml"
    with pytest.raises(ConfigError, match=r"unknown key\(s\) 'learning_rate' \(did you mean 'lr'\?\)"):
        load_config(TrainConfig, path, ["optim.learning_rate=1e-4"])
    with pytest.raises(ConfigError, match="batching"):
        load_config(TrainConfig, path, ["data.batching=packed"])
    with pytest.raises(ConfigError, match="max_length must be >= 64"):
        load_config(TrainConfig, path, ["data.max_length=10"])
    cfg = load_config(TrainConfig, path, ["optim.lr=2e-4", "max_steps=7", "model.lora.enabled=true"])
    assert (cfg.optim.lr, cfg.max_steps, cfg.model.lora.enabled) == (2e-4, 7, True)


def test_the_learning_rate_is_checked_once_by_the_config():
    """``optim.lr > 0`` has one home, ``OptimSettings``: the recipe's schedule check refuses only what the
    config cannot know (warmup as long as the run), so the two refusals cannot drift apart."""
    path = REPO / "configs/train/tiny_cpu.yaml"
    with pytest.raises(ConfigError, match=r"optim.lr=0.*: optim.lr must be > 0, got 0.0$"):
        load_config(TrainConfig, path, ["optim.lr=0"])
    checks = sorted(
        p.relative_to(REPO).as_posix()
        for p in (REPO / "train").glob("*.py")
        if "optim.lr must be > 0" in p.read_text(encoding="utf-8")
    )
    assert checks == ["train/train_config.py"]


def test_checkpoint_every_zero_means_only_the_final_one_and_a_negative_is_refused():
    """checkpoint.every_steps=0 once divided by zero at the first optimizer step (tests/e2e/test_real_data.py
    trains with it to the last step)."""
    path = REPO / "configs/train/tiny_cpu.yaml"
    assert load_config(TrainConfig, path, ["checkpoint.every_steps=0"]).checkpoint.every_steps == 0
    with pytest.raises(ConfigError, match=r"checkpoint.every_steps must be >= 0 \(0: only the final one\)"):
        load_config(TrainConfig, path, ["checkpoint.every_steps=-5"])


@pytest.mark.parametrize("path", ACCELERATE_CONFIGS, ids=lambda p: p.name)
def test_accelerate_configs(path):
    cfg = yaml.safe_load(path.read_text(encoding="utf-8"))
    header = "\n".join(ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.startswith("#"))
    assert _opening_comment(path).startswith("#")
    assert f"accelerate launch --config_file configs/accelerate/{path.name}" in header or "sbatch" in header
    assert cfg["distributed_type"] in {"NO", "MULTI_GPU", "DEEPSPEED"}
    assert cfg["num_processes"] >= 1
    ds = cfg.get("deepspeed_config")
    if ds:
        assert (REPO / ds["deepspeed_config_file"]).exists()
        # accelerate refuses these beside a deepspeed_config_file; precision comes from the train config
        assert "mixed_precision" not in cfg and "gradient_accumulation_steps" not in ds
    if path.name.startswith("cpu2") and cfg["distributed_type"] == "MULTI_GPU":
        assert "ACCELERATE_USE_CPU=1" in path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", DEEPSPEED_CONFIGS, ids=lambda p: p.name)
def test_deepspeed_configs_leave_batch_optimizer_and_schedule_to_the_recipe(path):
    cfg = json.loads(path.read_text(encoding="utf-8"))
    assert "optimizer" not in cfg and "scheduler" not in cfg
    for key in (
        "train_batch_size",
        "train_micro_batch_size_per_gpu",
        "gradient_accumulation_steps",
        "gradient_clipping",
    ):
        assert cfg[key] == "auto", key
    assert cfg["bf16"]["enabled"] == "auto"
    stage = cfg["zero_optimization"]["stage"]
    assert stage == int(path.stem[-1])
    if stage == 3:
        assert cfg["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


def _fake_tool(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/bash\n" + body + "\n", encoding="utf-8")
    path.chmod(0o755)


def test_slurm_launch_gives_each_node_its_own_rank(tmp_path):
    """Run slurm/train.sh with stand-ins for srun/scontrol/accelerate: two nodes, ranks 0 and 1."""
    script = REPO / "slurm" / "train.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "launches.txt"
    # srun runs its command once per node with that node's SLURM_NODEID, as SLURM does
    _fake_tool(bin_dir, "srun", 'shift; for n in 0 1; do SLURM_NODEID=$n "$@"; done')
    # a long host list: `| head -n1` closes the pipe early, which must not fail the job (SIGPIPE)
    _fake_tool(bin_dir, "scontrol", "printf 'gpu-a17\\ngpu-b03\\n'; seq 1 100000 | sed s/^/gpu-c/")
    _fake_tool(bin_dir, "accelerate", f'echo "$*" >> {log}')
    checks = tmp_path / "checks.txt"  # the inputs are checked once, before srun (a stand-in python here)
    _fake_tool(
        bin_dir,
        "python",
        f'echo "$*" >> {checks}; [ -s {log} ] && echo "checked after a launch" >> {checks}; true',
    )
    # the srun task ignores USR1 before exec'ing the launcher (SLURM signals every process of the step)
    assert "trap '' USR1; exec accelerate launch" in script.read_text()
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-[a17,b03]",
        "SLURM_NNODES": "2",
        "SLURM_NODEID": "0",  # the submitting shell's own value must NOT be what the nodes use
    }
    subprocess.run(
        ["bash", str(script), "configs/train/webjudge7b_full.yaml", "world_size=8"],
        cwd=REPO,
        env=env,
        check=True,
    )
    launches = log.read_text(encoding="utf-8").splitlines()
    assert len(launches) == 2
    assert checks.read_text(encoding="utf-8").splitlines() == [
        "-m keyshot.train.sft --config configs/train/webjudge7b_full.yaml world_size=8 --check"
    ]
    text = script.read_text()
    assert "#SBATCH --signal=USR1@" in text and "#SBATCH --requeue" in text  # preemption-safe
    for rank, line in enumerate(launches):
        args = line.split()
        assert args[args.index("--machine_rank") + 1] == str(rank)
        assert args[args.index("--main_process_ip") + 1] == "gpu-a17"
        assert args[args.index("--num_processes") + 1] == "8"
        assert args[args.index("--num_machines") + 1] == "2"
        assert line.endswith("-m keyshot.train.sft --config configs/train/webjudge7b_full.yaml world_size=8")


@pytest.mark.parametrize("name", ["serve.sh", "synth.sh", "synth_merge.sh", "judge.sh", "merge.sh"])
def test_other_slurm_scripts_show_their_sbatch_line_and_exec_keyshot(name):
    path = REPO / "slurm" / name
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    text = path.read_text(encoding="utf-8")
    header = [ln for ln in text.splitlines() if ln.startswith("#")]
    body = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert any("sbatch " in ln and f"slurm/{name}" in ln for ln in header)  # the exact line to run it
    assert body[0] == "set -euo pipefail" and body[-1].startswith("exec keyshot ")


@pytest.mark.parametrize(
    ("parallel", "flag"), [("data", "data_parallel_size=4"), ("tensor", "tensor_parallel_size=4")]
)
def test_slurm_serve_splits_the_model_over_the_allocated_gpus(tmp_path, parallel, flag):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_tool(bin_dir, "keyshot", 'echo "keyshot $*"')
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_GPUS_ON_NODE": "4",
        "PARALLEL": parallel,
    }
    out = subprocess.run(
        ["bash", str(REPO / "slurm/serve.sh"), "CKPT", "port=8001"], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("keyshot serve --config configs/serve/webjudge7b_gpu.yaml model=CKPT host=0.0.0.0")
    assert flag in line.split() and line.endswith("port=8001")


def test_slurm_train_requeues_a_preempted_job(tmp_path):
    """When training stops for SLURM's warning signal (marker file written by rank 0), the batch
    script requeues the job instead of failing it."""
    script = REPO / "slurm" / "train.sh"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.txt"
    _fake_tool(bin_dir, "srun", 'shift; SLURM_NODEID=0 "$@"')
    _fake_tool(bin_dir, "scontrol", f'echo "$*" >> {calls}; [ "$1" = show ] && echo gpu-a17; true')
    _fake_tool(bin_dir, "python", "true")  # the inputs check passes (a requeued job checks again)
    # the launcher's training process was preempted: marker written, exit 75 through the launcher
    _fake_tool(
        bin_dir, "accelerate", 'echo \'{"step": 7, "signal": "SIGUSR1"}\' > "$KEYSHOT_PREEMPTED_FILE"; exit 1'
    )
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SLURM_JOB_NODELIST": "gpu-a17",
        "SLURM_NNODES": "1",
        "SLURM_JOB_ID": "4242",
    }
    proc = subprocess.run(
        ["bash", str(script), "configs/train/webjudge7b_full.yaml"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "requeue 4242" in calls.read_text() and "preempted" in proc.stdout
    assert not (tmp_path / ".keyshot-preempted-4242").exists()
    # an ordinary failure is not requeued: the job fails with the launcher's status
    _fake_tool(bin_dir, "accelerate", "exit 3")
    proc = subprocess.run(["bash", str(script), "configs/train/webjudge7b_full.yaml"], cwd=tmp_path, env=env)
    assert proc.returncode == 3 and calls.read_text().count("requeue") == 1


def test_the_entry_runs_as_a_script_without_path_tricks(tmp_path):
    """`accelerate launch train/sft.py` runs the file as a script (train/ first on sys.path): no module in
    train/ may shadow a library, and the entry needs no sys.path edit to import keyshot."""
    shadowed = {p.stem for p in (REPO / "train").glob("*.py")} & {
        "config",
        "data",
        "evaluate",
        "model",
        "datasets",
    }
    assert not shadowed
    assert "sys.path" not in (REPO / "train" / "sft.py").read_text(encoding="utf-8")
    missing = tmp_path / "missing.yaml"
    proc = subprocess.run(
        [sys.executable, str(REPO / "train" / "sft.py"), "--config", str(missing)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert f"{missing}: config file not found" in proc.stderr


def test_check_names_a_bad_dataset_or_model_path_in_one_line(tmp_path, tiny_model_dir):
    """`train/sft.py --check` (run by slurm/train.sh before launching): every wrong data.path or model
    path is one line naming it, exit 2, before anything is written; a good one says what it found and
    that the rows render at their planned length."""
    from keyshot.infer.testing.scorer_data import build_scorer_dataset

    dataset = build_scorer_dataset(tmp_path / "ds", n_train=4, n_val=2)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    run_folder = tmp_path / "synth-run"
    (run_folder / "dataset").mkdir(parents=True)
    corrupt = tmp_path / "corrupt"
    shutil.copytree(dataset, corrupt)
    for arrow in corrupt.rglob("*.arrow"):
        arrow.write_bytes(b"not arrow at all")
    cases = [
        (f"data.path={tmp_path / 'missing'}", "missing: dataset folder not found"),
        (f"data.path={dataset / 'dataset_dict.json'}", "dataset_dict.json: a file, not a dataset folder"),
        (
            f"data.path={run_folder}",
            f"synth-run: a keyshot synth run folder; its dataset is {run_folder / 'dataset'}",
        ),
        (f"data.path={corrupt}", "corrupt: not a readable dataset saved with save_to_disk"),
    ]
    base = [sys.executable, str(REPO / "train/sft.py"), "--config", str(REPO / "configs/train/tiny_cpu.yaml")]
    for override, message in cases:
        proc = subprocess.run(
            [*base, override, f"model.name_or_path={model}", f"run_dir={tmp_path / 'run'}", "--check"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 2 and message in proc.stderr, (override, proc.stderr[-1500:])
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*base, f"data.path={dataset}", f"model.name_or_path={tmp_path / 'nomodel'}", "--check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert (
        proc.returncode == 2
        and "nomodel: model.name_or_path is not a model folder (no such folder)" in proc.stderr
    )
    good = [*base, f"data.path={dataset}", f"run_dir={tmp_path / 'run'}", "--check"]
    proc = subprocess.run([*good, f"model.name_or_path={model}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "model: model.name_or_path has no loadable processor (" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    proc = subprocess.run(
        [*good, f"model.name_or_path={tiny_model_dir}", "data.max_length=530"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("ok: dataset ") and "4 train" in proc.stdout, (
        proc.stderr
    )
    assert "\nok: train: 4 shrunk and 0 other rows render at their planned length" in proc.stdout, proc.stdout
    assert not (tmp_path / "run").exists()  # a check writes nothing
