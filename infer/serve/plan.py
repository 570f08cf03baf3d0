"""What ``keyshot serve`` will run: a serve config checked against the checkpoint (prompt version, pixel
bounds, answer length, local path) and turned into vLLM's command line and environment (:func:`plan_server`).
Starting, watching and stopping the process is :class:`keyshot.infer.serve.server.VLLMServer`'s.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import free_port
from keyshot.infer.model.checkpoint import (
    META_FILE,
    CheckpointDescription,
    CheckpointError,
    describe_checkpoint,
    looks_like_local_path,
    model_folder_problem,
)
from keyshot.infer.protocol.prompts import load_prompt_set

logger = logging.getLogger(__name__)

# vLLM binds its ZeroMQ sockets at $VLLM_RPC_BASE_PATH/<uuid4> ($TMPDIR by default) and a Unix socket's path
# holds 107 bytes: under a deep tmpdir (a job's or a test's folder) vLLM would die at start, so its sockets
# go to a short folder there (an explicit VLLM_RPC_BASE_PATH is kept)
SOCKET_DIR_MAX = 107 - len("/") - 36
SHORT_SOCKET_DIR = "/tmp"

ENV_VLLM_PYTHON = "KEYSHOT_VLLM_PYTHON"
DEFAULT_CPU_KV_BYTES = 1 << 30  # 1 GiB


class ServeError(KeyshotError, RuntimeError):
    """The server could not be configured or started; the message says why (and shows the log tail)."""


class PromptVersionMismatchError(ServeError, CheckpointError):
    """The checkpoint was trained on another prompt set than the one the client sends."""


@dataclass
class ServeConfig:
    """How to serve a scorer checkpoint with vLLM (see the module docstring)."""

    #: the shipped configs' folder a name two folders share is read from (``--config tiny_cpu``)
    SHIPPED_FOLDER: ClassVar[str] = "serve"
    model: str = ""
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    vllm_python: str | None = None  # default: $KEYSHOT_VLLM_PYTHON, else this interpreter
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: str = "auto"
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    mm_processor_cache_gb: float | None = None  # vLLM's cache of processed images (None: vLLM's default)
    kv_cache_memory_bytes: int | None = None  # required on CPU (default 1 GiB there)
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1  # GPUs one model copy is split over (a 72B teacher: 4)
    data_parallel_size: int = 1  # model copies behind one endpoint, one per GPU group (7B scorer: GPUs)
    enforce_eager: bool = False
    enable_prefix_caching: bool = True
    min_pixels: int | None = None  # default: the checkpoint's training bounds
    max_pixels: int | None = None
    # answer tokens a request that names no max_tokens gets; default: the longest answer the checkpoint was
    # trained on (keyshot.json's answer_tokens), and a value below that is refused
    max_tokens: int | None = None
    prompt_variant: str = "online_mind2web"
    allow_missing_meta: bool = True  # serve a plain model folder (no keyshot.json), with a warning
    lora_modules: dict[str, str] = field(default_factory=dict)
    max_lora_rank: int = 16
    # A scorer request holds one screenshot. Raise it only when the same server also answers
    # outcome calls (a local open-model judge, or the CPU demo where the tiny model plays both).
    max_images_per_prompt: int = 1
    greedy: bool = True
    seed: int = 0
    max_logprobs: int = 20
    startup_timeout_s: float = 900.0
    log_file: str | None = None
    shutdown_timeout_s: int = 10  # on stop, let requests in flight finish (≤ this long) before exiting
    cache_root: str | None = None  # VLLM_CACHE_ROOT
    tmpdir: str | None = None  # TMPDIR for vLLM's sockets and compile caches
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_model_len < 1:
            raise ValueError("max_model_len must be >= 1")
        if self.tensor_parallel_size < 1 or self.data_parallel_size < 1:
            raise ValueError("tensor_parallel_size and data_parallel_size must be >= 1")
        if self.max_images_per_prompt < 1:
            raise ValueError("max_images_per_prompt must be >= 1")
        if (self.min_pixels is None) != (self.max_pixels is None):
            raise ValueError("set both min_pixels and max_pixels, or neither")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1 (or null), got {self.max_tokens}")


@dataclass(frozen=True)
class ServePlan:
    """Everything resolved before launch: the command, its environment and what clients must send."""

    command: list[str]
    env: dict[str, str]
    base_url: str
    model_name: str  # what requests name in "model" (the adapter's name when serving LoRA)
    min_pixels: int | None
    max_pixels: int | None
    prompt_version: str
    log_file: Path
    device: str
    max_tokens: int | None = None  # the answer length requests should allow (None: not known)


def vllm_python(configured: str | None = None) -> str:
    """The interpreter that has vLLM, by the one rule of every command and the demo: the config's
    (``vllm_python``, ``--vllm-python``), else ``$KEYSHOT_VLLM_PYTHON``, else this one when it has vLLM,
    else the python of ``.venv-vllm`` beside this environment (``make setup-vllm`` puts it beside
    ``.venv``), else this one (:func:`check_vllm_installed` then says what to do)."""
    if configured or os.environ.get(ENV_VLLM_PYTHON):
        return configured or os.environ[ENV_VLLM_PYTHON]
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    beside = Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"
    return str(beside) if beside.exists() else sys.executable


def check_vllm_installed(python: str) -> None:
    """Refuse at once, with what to do, an interpreter that has no vLLM."""
    probe = subprocess.run(
        [python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"],
        capture_output=True,
        timeout=60,
    )
    if probe.returncode != 0:
        raise ServeError(
            f"{python} has no vLLM: pass --vllm-python PATH (a Python that has it; on CPU `make setup-vllm` "
            f"builds .venv-vllm) or set ${ENV_VLLM_PYTHON}, or pip install vllm into this environment"
        )


def check_prompt_version(
    checkpoint: CheckpointDescription | str | Path, prompt_variant: str, *, allow_missing: bool = True
) -> CheckpointDescription:
    """Refuse a checkpoint (or adapter) trained on another prompt set than ``prompt_variant``'s.

    Takes its description (or a folder or hub id, described here) and returns it. One whose prompt set is
    unknown (a plain folder, a hub id not in keyshot's table of released checkpoints) is served with a
    warning when ``allow_missing``, else refused.
    """
    desc = (
        checkpoint if isinstance(checkpoint, CheckpointDescription) else describe_checkpoint(str(checkpoint))
    )
    expected = load_prompt_set(prompt_variant).version
    if desc.prompt_version is None:
        if not allow_missing:
            raise ServeError(f"{desc.model}: no {META_FILE}; cannot check which prompt set it was trained on")
        logger.warning("%s: using it without a prompt-version check", desc.note)
        return desc
    if desc.prompt_version != expected:
        raise PromptVersionMismatchError(
            f"{desc.source}: the checkpoint was trained on prompt version {desc.prompt_version!r} "
            f"but the client's prompt set ({prompt_variant!r}) is {expected!r}. Using it would score "
            "screenshots with prompts it never saw; retrain, or use the matching prompt_variant."
        )
    if desc.note:
        logger.info("%s", desc.note)
    return desc


def _pixel_bounds(cfg: ServeConfig, desc: CheckpointDescription) -> tuple[int | None, int | None]:
    trained = desc.pixel_bounds
    if cfg.min_pixels is not None:
        asked = (cfg.min_pixels, cfg.max_pixels)
        if trained is not None and asked != trained:
            raise ServeError(
                f"{cfg.model}: configured pixel bounds {asked} differ from the checkpoint's training bounds "
                f"{trained}; the scorer must see images as it was trained (remove min_pixels/max_pixels)"
            )
        return asked  # type: ignore[return-value]
    if trained is None:
        logger.warning("%s: no pixel bounds known; vLLM uses its processor defaults", cfg.model)
        return None, None
    return trained


def answer_limit(cfg: ServeConfig, desc: CheckpointDescription) -> int | None:
    """The answer tokens to allow: the configured ``max_tokens``, else the checkpoint's longest trained
    answer; a configured value below that is refused (answers the scorer was trained on would be cut)."""
    longest = desc.answer_tokens or 0
    if cfg.max_tokens is not None and cfg.max_tokens < longest:
        raise ServeError(
            f"{cfg.model}: max_tokens={cfg.max_tokens} is below the longest answer the checkpoint was trained "
            f"on ({longest} tokens, keyshot.json answer_tokens): its answers would be cut; remove max_tokens "
            f"or set it to at least {longest}"
        )
    if cfg.max_tokens is None and longest:
        logger.info(
            "%s: answers allowed up to %d tokens, the longest the checkpoint was trained on (99th percentile %s)",
            cfg.model,
            longest,
            desc.answer_tokens_p99,
        )
    return cfg.max_tokens or longest or None


def _device(cfg: ServeConfig) -> str:
    if cfg.device != "auto":
        return cfg.device
    return "cuda" if shutil.which("nvidia-smi") else "cpu"


def plan_server(cfg: ServeConfig, checkpoint: CheckpointDescription | None = None) -> ServePlan:
    """Check the checkpoint and build the vLLM command; launches nothing. ``checkpoint``: the description
    of ``cfg.model`` its caller read (:func:`keyshot.infer.model.checkpoint.describe_checkpoint`); read here
    when not given."""
    if not cfg.model:
        raise ServeError("no model: set model=<checkpoint folder>")
    problem = model_folder_problem(cfg.model) if looks_like_local_path(cfg.model) else None
    if problem == "no such folder":
        raise ServeError(
            f"{cfg.model}: no such checkpoint folder; pass the folder a training run wrote (RUN/final) "
            "or a Hugging Face model id (org/name)"
        )
    if problem:
        raise ServeError(
            f"{cfg.model}: {problem}, not a model checkpoint; pass the folder a training run wrote (RUN/final)"
        )
    if checkpoint is None or checkpoint.model != cfg.model:
        checkpoint = describe_checkpoint(cfg.model)
    desc = check_prompt_version(checkpoint, cfg.prompt_variant, allow_missing=cfg.allow_missing_meta)
    for name, adapter in cfg.lora_modules.items():
        if not Path(adapter).is_dir():
            raise ServeError(f"LoRA adapter {name!r}: {adapter} is not a folder")
        adapter_desc = check_prompt_version(
            describe_checkpoint(adapter), cfg.prompt_variant, allow_missing=cfg.allow_missing_meta
        )
        desc = desc if desc.meta is not None or adapter_desc.meta is None else adapter_desc
    min_px, max_px = _pixel_bounds(cfg, desc)
    max_tokens = answer_limit(cfg, desc)
    device = _device(cfg)
    port = cfg.port or free_port(cfg.host)
    served = cfg.served_model_name or Path(cfg.model.rstrip("/")).name or "keyshot-scorer"

    cmd = [
        vllm_python(cfg.vllm_python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(cfg.model),
        "--host",
        cfg.host,
        "--port",
        str(port),
        "--served-model-name",
        served,
        "--max-model-len",
        str(cfg.max_model_len),
        "--dtype",
        cfg.dtype,
        "--seed",
        str(cfg.seed),
        "--max-logprobs",
        str(cfg.max_logprobs),
        "--limit-mm-per-prompt",
        json.dumps({"image": cfg.max_images_per_prompt, "video": 0}),
        "--generation-config",
        "auto",
        "--enable-prefix-caching" if cfg.enable_prefix_caching else "--no-enable-prefix-caching",
    ]
    if min_px is not None:
        cmd += ["--mm-processor-kwargs", json.dumps({"min_pixels": min_px, "max_pixels": max_px})]
    generation = {"temperature": 0.0} if cfg.greedy else {}
    if max_tokens is not None:
        generation["max_new_tokens"] = max_tokens  # vLLM's max_tokens for a request that names none
    if generation:
        cmd += ["--override-generation-config", json.dumps(generation)]
    if cfg.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(cfg.max_num_seqs)]
    if cfg.mm_processor_cache_gb is not None:
        cmd += ["--mm-processor-cache-gb", f"{cfg.mm_processor_cache_gb:g}"]
    if cfg.enforce_eager:
        cmd.append("--enforce-eager")
    if cfg.shutdown_timeout_s:
        # drain in-flight requests on SIGTERM instead of aborting them (an abort logs EngineDeadError)
        cmd += ["--shutdown-timeout", str(cfg.shutdown_timeout_s)]
    kv = cfg.kv_cache_memory_bytes
    if kv is None and device == "cpu":
        kv = DEFAULT_CPU_KV_BYTES
        logger.info("CPU serving: KV cache set to %d bytes (set kv_cache_memory_bytes to change it)", kv)
    if kv is not None:
        cmd += ["--kv-cache-memory-bytes", str(kv)]
    if cfg.gpu_memory_utilization is not None:
        cmd += ["--gpu-memory-utilization", str(cfg.gpu_memory_utilization)]
    if cfg.tensor_parallel_size != 1:
        cmd += ["--tensor-parallel-size", str(cfg.tensor_parallel_size)]
    if cfg.data_parallel_size != 1:
        if device == "cpu":
            raise ServeError("data_parallel_size > 1 needs GPUs (one model copy per GPU group); use 1 on CPU")
        cmd += ["--data-parallel-size", str(cfg.data_parallel_size)]
    model_name = served
    if cfg.lora_modules:
        cmd += ["--enable-lora", "--max-lora-rank", str(cfg.max_lora_rank), "--lora-modules"]
        cmd += [f"{name}={path}" for name, path in cfg.lora_modules.items()]
        model_name = next(iter(cfg.lora_modules))
    cmd += list(cfg.extra_args)

    env = dict(os.environ)
    env.update({"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"})
    if checkpoint.hub_id:  # vLLM downloads the weights into the hub cache on its first start
        logger.info(
            "%s is a Hugging Face model id: vLLM loads it from the hub cache, downloading it on the first start",
            cfg.model,
        )
    else:  # a local folder: nothing is fetched
        env.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    if device == "cpu":
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "auto")
    tmpdir = cfg.tmpdir or tempfile.gettempdir()
    env["TMPDIR"] = tmpdir
    if len(os.fsencode(tmpdir)) > SOCKET_DIR_MAX and "VLLM_RPC_BASE_PATH" not in env:
        env["VLLM_RPC_BASE_PATH"] = SHORT_SOCKET_DIR
        logger.info(
            "vLLM's sockets go to %s: tmpdir %s is longer than the %d bytes a socket's folder may have",
            SHORT_SOCKET_DIR, tmpdir, SOCKET_DIR_MAX,
        )  # fmt: skip
    if cfg.cache_root:
        env["VLLM_CACHE_ROOT"] = cfg.cache_root
    env.update(cfg.env)
    log_file = Path(cfg.log_file) if cfg.log_file else Path(tmpdir) / f"keyshot-vllm-{port}.log"
    return ServePlan(
        command=cmd,
        env=env,
        base_url=f"http://{_client_host(cfg.host)}:{port}/v1",
        model_name=model_name,
        min_pixels=min_px,
        max_pixels=max_px,
        prompt_version=load_prompt_set(cfg.prompt_variant).version,
        log_file=log_file,
        device=device,
        max_tokens=max_tokens,
    )


def _client_host(host: str) -> str:
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
