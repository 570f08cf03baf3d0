"""A vLLM server keyshot starts for a scorer checkpoint (:class:`VLLMServer`), under the process guard.

The command that runs one in the foreground is ``keyshot serve`` (:mod:`keyshot.infer.serve.command`);
``keyshot judge --serve-scorer``, ``keyshot reward serve --serve-scorer``, the demo, tests and benches start
one through this class (:func:`keyshot.infer.judge.scorer_factory.served_scorer`). What the server
guarantees (prompt version, pixel bounds, greedy decoding ...) is planned by :mod:`keyshot.infer.serve.plan`.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2

from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.common.processes import stop_process
from keyshot.infer.model.checkpoint import CheckpointDescription
from keyshot.infer.serve.plan import ServeConfig, ServeError, check_vllm_installed, plan_server

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
        guard = [sys.executable, "-I", "-m", "keyshot.infer.serve.process_guard", "--grace-s", "20", "--"]
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
        """SIGTERM (vLLM shuts its engine down cleanly), then SIGKILL of its process group: children left
        in the group (an engine core that outlived the API server) go too."""
        if self.process is not None:
            stop_process(self.process, timeout_s, group=True, what="vLLM")
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
