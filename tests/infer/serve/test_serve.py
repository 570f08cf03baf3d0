"""``keyshot serve``: the vLLM command it builds, the checks it makes, and the real server it starts."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
import uuid
from pathlib import Path

import httpx2
import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import load_config
from keyshot.infer.model.checkpoint import read_meta, write_meta
from keyshot.infer.model.tiny_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.serve.plan import (
    SOCKET_DIR_MAX,
    PromptVersionMismatchError,
    ServeConfig,
    ServeError,
    check_prompt_version,
    plan_server,
)
from keyshot.infer.serve.server import VLLMServer
from tests.support import paths
from tests.support.frameworks import python_or_skip
from tests.support.vllm import SERVED_NAME, tiny_serve_config

REPO = paths.REPO


def _flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def _with_meta(src: Path, dst: Path, **changes) -> Path:
    shutil.copytree(src, dst)
    meta = read_meta(dst)
    for key, value in changes.items():
        setattr(meta, key, value)
    write_meta(dst, meta)
    return dst


def test_plan_has_the_flags_that_matter(scorer_checkpoint, tmp_path):
    cfg = ServeConfig(
        model=str(scorer_checkpoint), device="cpu", dtype="float32", tmpdir=str(tmp_path), port=8123
    )
    plan = plan_server(cfg)
    cmd = plan.command
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert _flag(cmd, "--host") == "127.0.0.1" and _flag(cmd, "--port") == "8123"
    assert json.loads(_flag(cmd, "--limit-mm-per-prompt")) == {"image": 1, "video": 0}
    assert json.loads(_flag(cmd, "--mm-processor-kwargs")) == {
        "min_pixels": TINY_MIN_PIXELS,
        "max_pixels": TINY_MAX_PIXELS,
    }
    assert json.loads(_flag(cmd, "--override-generation-config")) == {"temperature": 0.0}
    assert _flag(cmd, "--generation-config") == "auto"
    assert "--enable-prefix-caching" in cmd
    assert int(_flag(cmd, "--kv-cache-memory-bytes")) > 0  # mandatory on CPU, given by default
    assert _flag(cmd, "--dtype") == "float32"
    assert "--enable-lora" not in cmd
    assert plan.env["VLLM_CPU_OMP_THREADS_BIND"] == "auto" and plan.env["TMPDIR"] == str(tmp_path)
    assert plan.env["HF_HUB_OFFLINE"] == "1" and plan.env["VLLM_NO_USAGE_STATS"] == "1"
    assert plan.base_url == "http://127.0.0.1:8123/v1"
    assert plan.prompt_version == load_prompt_set().version


def test_plan_lora_and_processor_bounds(tiny_model_dir, scorer_checkpoint, tmp_path):
    # A plain model folder (no keyshot.json): bounds come from its processor config.
    plan = plan_server(ServeConfig(model=str(tiny_model_dir), device="cpu", tmpdir=str(tmp_path)))
    assert json.loads(_flag(plan.command, "--mm-processor-kwargs")) == {
        "min_pixels": TINY_MIN_PIXELS,
        "max_pixels": TINY_MAX_PIXELS,
    }
    cfg = ServeConfig(
        model=str(tiny_model_dir),
        device="cpu",
        tmpdir=str(tmp_path),
        lora_modules={"scorer": str(scorer_checkpoint)},
        max_lora_rank=8,
    )
    plan = plan_server(cfg)
    assert "--enable-lora" in plan.command and _flag(plan.command, "--max-lora-rank") == "8"
    assert _flag(plan.command, "--lora-modules") == f"scorer={scorer_checkpoint}"
    assert plan.model_name == "scorer"  # requests name the adapter


def test_a_deep_tmpdir_keeps_vllms_sockets_in_a_short_folder(tiny_model_dir, tmp_path, monkeypatch):
    """vLLM dies at start when $TMPDIR/<uuid4> passes a Unix socket path's 107 bytes (a job's or an xdist
    worker's folder does): its sockets go to a short folder then, and the tmpdir stays for the rest."""
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    deep = tmp_path / ("d" * max(1, SOCKET_DIR_MAX + 1 - len(str(tmp_path)) - 1))
    assert len(str(deep)) > SOCKET_DIR_MAX
    plan = plan_server(ServeConfig(model=str(tiny_model_dir), device="cpu", tmpdir=str(deep)))
    assert plan.env["TMPDIR"] == str(deep)
    socket_dir = plan.env["VLLM_RPC_BASE_PATH"]
    assert len(f"{socket_dir}/{uuid.uuid4()}".encode()) <= 107 and os.access(socket_dir, os.W_OK)
    shallow = plan_server(ServeConfig(model=str(tiny_model_dir), device="cpu", tmpdir="/tmp"))
    assert "VLLM_RPC_BASE_PATH" not in shallow.env
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", str(tmp_path))  # the user's own choice is kept
    plan = plan_server(ServeConfig(model=str(tiny_model_dir), device="cpu", tmpdir=str(deep)))
    assert plan.env["VLLM_RPC_BASE_PATH"] == str(tmp_path)


def test_refuses_other_pixel_bounds(scorer_checkpoint, tmp_path):
    cfg = ServeConfig(model=str(scorer_checkpoint), device="cpu", min_pixels=3136, max_pixels=1003520)
    with pytest.raises(ServeError, match="training bounds"):
        plan_server(cfg)


def test_refuses_a_prompt_version_mismatch(scorer_checkpoint, tmp_path, capsys):
    stale = _with_meta(scorer_checkpoint, tmp_path / "stale", prompt_version="online_mind2web@0123456789")
    with pytest.raises(PromptVersionMismatchError, match="online_mind2web@0123456789"):
        check_prompt_version(stale, "online_mind2web")
    # Trained on online_mind2web, but the client would send the general prompts.
    with pytest.raises(PromptVersionMismatchError, match=load_prompt_set("general").version):
        plan_server(ServeConfig(model=str(scorer_checkpoint), prompt_variant="general", device="cpu"))
    # The CLI refuses before launching anything, and says why.
    assert keyshot(["serve", "--config", str(REPO / "configs/serve/tiny_cpu.yaml"), f"model={stale}"]) == 2
    err = capsys.readouterr().err
    assert "keyshot.json" in err and "online_mind2web@0123456789" in err and load_prompt_set().version in err


def test_missing_meta_can_be_required(tiny_model_dir):
    described = check_prompt_version(tiny_model_dir, "online_mind2web")
    assert described.meta is None and described.prompt_version is None
    with pytest.raises(ServeError, match="no keyshot.json"):
        check_prompt_version(tiny_model_dir, "online_mind2web", allow_missing=False)


def test_shipped_serve_configs_plan(scorer_checkpoint, capsys):
    configs = sorted((REPO / "configs" / "serve").glob("*.yaml"))
    assert {p.name for p in configs} >= {"tiny_cpu.yaml", "webjudge7b_gpu.yaml"}
    for path in configs:
        assert path.read_text().startswith("# keyshot serve")
        cfg = load_config(ServeConfig, path, [f"model={scorer_checkpoint}", "port=8000"])
        plan = plan_server(cfg)
        assert "--mm-processor-kwargs" in plan.command
    assert keyshot(["serve", "--config", str(configs[0]), f"model={scorer_checkpoint}", "--dry-run"]) == 0
    assert "vllm.entrypoints.openai.api_server" in capsys.readouterr().out


def test_data_and_tensor_parallel_reach_the_command(scorer_checkpoint, capsys):
    dp = load_config(
        ServeConfig,
        REPO / "configs/serve/webjudge7b_gpu.yaml",
        [f"model={scorer_checkpoint}", "data_parallel_size=4"],
    )
    command = plan_server(dp).command
    assert (
        command[command.index("--data-parallel-size") + 1] == "4" and "--tensor-parallel-size" not in command
    )
    tp = load_config(ServeConfig, REPO / "configs/serve/teacher72b_tp4.yaml", [f"model={scorer_checkpoint}"])
    command = plan_server(tp).command
    assert (
        command[command.index("--tensor-parallel-size") + 1] == "4" and "--data-parallel-size" not in command
    )
    assert json.loads(command[command.index("--limit-mm-per-prompt") + 1])["image"] == 50  # outcome calls
    argv = [
        "serve",
        "--config",
        "configs/serve/tiny_cpu.yaml",
        f"model={scorer_checkpoint}",
        "data_parallel_size=2",
    ]
    assert keyshot([*argv, "--dry-run"]) == 2
    assert "data_parallel_size > 1 needs GPUs" in capsys.readouterr().err


@pytest.mark.slow
def test_vllm_accepts_the_command(scorer_checkpoint, tmp_path):
    """vLLM's own argument parser (the one its server runs) accepts and reads every flag we pass."""
    python = python_or_skip("vllm")
    cfg = ServeConfig(
        model=str(scorer_checkpoint),
        device="cpu",
        dtype="float32",
        enforce_eager=True,
        lora_modules={"scorer": str(scorer_checkpoint)},
        max_lora_rank=8,
        tmpdir=str(tmp_path),
    )
    plan = plan_server(cfg)
    script = textwrap.dedent(
        """
        import json, sys
        from vllm.utils.argparse_utils import FlexibleArgumentParser
        from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
        validate_parsed_serve_args(args)
        print("ARGS" + json.dumps(vars(args), default=str))
        """
    )
    argv = plan.command[3:]  # after "python -m module"
    out = subprocess.run(
        [python, "-c", script, *argv], capture_output=True, text=True, env=plan.env, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    args = json.loads(out.stdout.split("ARGS", 1)[1])
    assert args["mm_processor_kwargs"] == {"min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS}
    assert args["limit_mm_per_prompt"] == {"image": 1, "video": 0}
    assert args["override_generation_config"] == {"temperature": 0.0}
    assert args["enable_prefix_caching"] is True and args["enable_lora"] is True
    assert args["kv_cache_memory_bytes"] > 0 and args["dtype"] == "float32" and args["enforce_eager"] is True
    assert "name='scorer'" in args["lora_modules"][0]


@pytest.mark.slow
def test_server_is_up_and_serves_the_checkpoint(vllm_server):
    assert vllm_server.base_url.startswith("http://127.0.0.1:")
    assert httpx2.get(f"{vllm_server.root_url}/health", timeout=10).status_code == 200
    models = httpx2.get(f"{vllm_server.base_url}/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [SERVED_NAME]


@pytest.mark.slow
def test_start_fails_fast_with_the_log_tail(scorer_checkpoint, tmp_path):
    python = python_or_skip("vllm")
    broken = tmp_path / "broken"
    shutil.copytree(scorer_checkpoint, broken)
    (broken / "config.json").write_text('{"model_type": "no_such_architecture"}')
    cfg = tiny_serve_config(broken, tmp_path, python)
    with pytest.raises(ServeError, match="exited with code") as info:
        VLLMServer(cfg).start()
    assert "no_such_architecture" in str(info.value)  # the log tail says what went wrong


def test_image_limit_is_one_unless_the_server_also_judges(scorer_checkpoint, tmp_path):
    # A scorer request holds one screenshot; a server that also answers outcome calls (the CPU demo,
    # a local open-model judge) needs more images per prompt, and a bad value is refused.
    base = {"model": str(scorer_checkpoint), "device": "cpu", "tmpdir": str(tmp_path)}
    both = plan_server(ServeConfig(**base, max_images_per_prompt=4))
    assert json.loads(_flag(both.command, "--limit-mm-per-prompt")) == {"image": 4, "video": 0}
    with pytest.raises(ValueError, match="max_images_per_prompt"):
        ServeConfig(**base, max_images_per_prompt=0)
    demo = load_config(ServeConfig, REPO / "infer" / "demo_configs" / "serve.yaml")
    assert demo.max_images_per_prompt == 4


def test_a_missing_checkpoint_and_a_python_without_vllm_are_refused_with_what_to_do(tiny_model_dir, tmp_path):
    import sys

    from keyshot.infer.serve.plan import ServeConfig, ServeError, plan_server
    from keyshot.infer.serve.server import VLLMServer

    with pytest.raises(ServeError, match=r"/no/such/ckpt: no such checkpoint folder"):
        plan_server(ServeConfig(model="/no/such/ckpt"))
    with pytest.raises(ServeError, match=r"a folder without config.json, not a model checkpoint"):
        plan_server(ServeConfig(model=str(tmp_path)))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ServeError, match=r"weights.bin: a file, not a model checkpoint"):
        plan_server(ServeConfig(model=str(tmp_path / "weights.bin")))
    server = VLLMServer(
        ServeConfig(
            model=str(tiny_model_dir), vllm_python=sys.executable, device="cpu", log_file=str(tmp_path / "l")
        )
    )
    with pytest.raises(ServeError, match=r"has no vLLM: pass --vllm-python PATH"):
        server.start()
    assert server.process is None  # nothing was started
