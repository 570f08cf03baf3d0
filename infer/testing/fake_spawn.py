"""The fake server as a subprocess, so a test can kill -9 a judging process while the server keeps
counting::

    python -m keyshot.infer.testing.fake_openai --port 0 --responder judge --fault-rate 0.2 --seed 0

prints ``FAKE_OPENAI_READY http://127.0.0.1:PORT/v1`` once listening; ``GET /stats`` returns the
counters as JSON (:func:`fetch_stats`). :func:`spawn_fake_openai` wraps that for tests.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from keyshot.infer.common.processes import stop_process
from keyshot.infer.testing.fake_faults import FaultPlan
from keyshot.infer.testing.fake_responders import get_responder
from keyshot.infer.testing.fake_server import FakeOpenAI, ServerStats, wait_settled
from keyshot.infer.testing.launch import OutputLines

READY_PREFIX = "FAKE_OPENAI_READY "


def _parse_faults(spec: str) -> dict[str, float]:
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, _, rate = item.partition("=")
        out[kind.strip()] = float(rate)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m keyshot.infer.testing.fake_openai",
        description="A local OpenAI-compatible chat server for tests, with deterministic judges and injected faults.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = a free port (printed on the READY line)")
    parser.add_argument(
        "--responder", default="judge", help="judge[:RULE], teacher:RULE[:GARBAGE_RATE] or echo"
    )
    parser.add_argument(
        "--fault-rate", type=float, default=0.0, help="total fault rate, split evenly over all kinds"
    )
    parser.add_argument(
        "--faults", default="", help="per-kind rates, e.g. 429=0.1,timeout=0.05 (overrides --fault-rate)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-sleep", type=float, default=5.0)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--model", default=None, help="the model /v1/models lists (default: none, any name)")
    args = parser.parse_args(argv)

    if args.faults:
        plan: FaultPlan | None = FaultPlan(_parse_faults(args.faults), seed=args.seed)
    elif args.fault_rate:
        plan = FaultPlan.uniform(args.fault_rate, seed=args.seed)
    else:
        plan = None
    server = FakeOpenAI(
        get_responder(args.responder),
        plan,
        model=args.model,
        host=args.host,
        port=args.port,
        timeout_sleep_s=args.timeout_sleep,
        latency_s=args.latency,
        record_requests=False,
    ).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(f"{READY_PREFIX}{server.base_url}", flush=True)
    done.wait()
    server.stop()
    return 0


@contextmanager
def spawn_fake_openai(
    responder: str = "judge",
    *,
    fault_rate: float = 0.0,
    faults: dict[str, float] | None = None,
    seed: int = 0,
    latency_s: float = 0.0,
    timeout_sleep_s: float = 5.0,
    startup_timeout_s: float = 30.0,
) -> Iterator[tuple[str, subprocess.Popen]]:
    """Run the server as a subprocess; yields ``(base_url, process)`` and terminates it on exit."""
    cmd = [
        sys.executable,
        "-m",
        "keyshot.infer.testing.fake_openai",
        "--port",
        "0",
        "--responder",
        responder,
        "--seed",
        str(seed),
        "--latency",
        str(latency_s),
        "--timeout-sleep",
        str(timeout_sleep_s),
    ]
    if faults:
        cmd += ["--faults", ",".join(f"{k}={v}" for k, v in faults.items())]
    elif fault_rate:
        cmd += ["--fault-rate", str(fault_rate)]
    root = Path(__file__).resolve().parents[2]
    # stderr goes to a file, so a chatty server never blocks on a full pipe
    with tempfile.TemporaryFile(mode="w+") as stderr:
        proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            base_url = _wait_ready(proc, startup_timeout_s, stderr)
            yield base_url, proc
        finally:
            stop_process(proc, 10, what="fake OpenAI server")
            if proc.stdout is not None:
                proc.stdout.close()


def _wait_ready(proc: subprocess.Popen, timeout_s: float, stderr: IO[str]) -> str:
    try:
        line = OutputLines(proc, "fake OpenAI server").wait_for(READY_PREFIX, timeout_s)
    except RuntimeError as exc:
        proc.kill()
        proc.wait(timeout=10)
        stderr.seek(0)
        raise RuntimeError(f"{exc}; its stderr: {stderr.read()[-2000:]}") from None
    return line.split(READY_PREFIX, 1)[1].strip()


def fetch_stats(base_url: str, *, settled: bool = False) -> ServerStats:
    """Counters of a (subprocess) server, read over HTTP; ``settled``: once no request is being answered."""
    import urllib.request

    root = base_url.rstrip("/").removesuffix("/v1")

    def read() -> ServerStats:
        with urllib.request.urlopen(f"{root}/stats", timeout=10) as resp:
            return ServerStats(**json.load(resp))

    return wait_settled(read, 30.0) if settled else read()
