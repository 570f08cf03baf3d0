"""The Ray cluster an engine run works on: one it joins (``--ray-address``), or a local one it starts.

A local cluster is ``ray start --head`` (and, for tests and the benchmark, more nodes with ``ray start
--address``) on this machine, each node run under keyshot's process guard
(:mod:`keyshot.infer.serve.process_guard`, started as a command: it ends the node when keyshot ends, even
when keyshot is killed), each with ports of its own, its own temp folder and Ray's token authentication on
(a fresh token). A cluster of its own is never one the machine already runs: ``ray.init()`` without an
address would join that one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import ipaddress
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import free_port, pid_alive

#: What a node of a local cluster has unless told: one CPU and a 100 MB object store (rows carry paths
#: and verdicts, never screenshots).
NODE_CPUS = 1
OBJECT_STORE_BYTES = 100_000_000
#: How long one node may take to start: seen past 90 s on a 2-CPU machine running other Ray clusters, vLLM and
#: training launches beside it (the test suite); a quiet one takes 3-8 s.
START_TIMEOUT_S = 300.0
#: The address of a local cluster's nodes. Ray reads 127.0.0.1 and localhost as "this machine" and puts the
#: machine's outward address in their place (ray._private.services.resolve_ip_for_localhost), so its nodes
#: would talk over that interface; any other loopback address it keeps, and the cluster stays on loopback.
LOOPBACK_HOST = "127.0.0.2"
#: Ray's dashboard asks the cloud's instance metadata (169.254.169.254) which cloud it runs on unless this
#: file, in the home folder of its process, names the provider: a local cluster's nodes run with a home
#: folder of their own that names it ("local", Ray's name for machines started by hand).
BOOTSTRAP_CONFIG = "ray_bootstrap_config.yaml"
#: The environment Ray's token authentication reads (ray.init and every ``ray start``).
AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")


class RayClusterError(KeyshotError):
    """A Ray cluster that cannot be started or joined."""


def require_ray() -> None:
    """Refuse, in one line, an engine run where Ray Data is not installed (Ray is not imported here: its
    token settings are read when it is, :func:`use_token`)."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.data") is None:
        raise RayClusterError("--engine ray needs Ray Data: pip install 'keyshot[ray]' (ray[data]==2.60.0)")


def use_token(env: dict[str, str]) -> None:
    """Put a cluster's token settings in this process's environment, where Ray reads them; Ray already
    imported reads them again."""
    os.environ.update(env)
    if "ray" in sys.modules:
        from ray._raylet import AuthenticationTokenLoader, Config

        Config.initialize("")
        AuthenticationTokenLoader.instance().reset_cache()


@dataclass
class _Node:
    proc: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class LocalCluster:
    """A Ray cluster on this machine: a head and ``nodes - 1`` more nodes, each ``cpus`` CPUs and an object
    store of ``object_store_bytes``, under ``temp_dir`` (a new folder when not given), with ports of its own
    and a token of its own. :meth:`start`, then :attr:`address`; :meth:`stop` (or the end of keyshot) ends
    every process of it."""

    nodes: int = 1
    cpus: float = NODE_CPUS
    object_store_bytes: int = OBJECT_STORE_BYTES
    temp_dir: Path | None = None
    host: str = LOOPBACK_HOST
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    _nodes: list[_Node] = field(default_factory=list, repr=False)
    _made_temp: bool = False
    port: int = 0
    started_s: float = 0.0

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a process joining this cluster needs in its environment (token authentication)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.token, "RAY_USAGE_STATS_ENABLED": "0"}

    @property
    def node_env(self) -> dict[str, str]:
        """A node's environment: :attr:`env`, a home folder that keeps Ray's dashboard from asking for cloud
        metadata (:func:`local_home`), and a lost node noticed within ~3 s (Ray's health checks)."""
        assert self.temp_dir is not None
        return {
            **self.env,
            "HOME": str(local_home(self.temp_dir)),
            "RAY_health_check_period_ms": "1000",
            "RAY_health_check_failure_threshold": "3",
        }

    def start(self) -> LocalCluster:
        t0 = time.perf_counter()
        if self.temp_dir is None:  # short: Ray's socket paths under it must stay under 108 characters
            self.temp_dir = Path(tempfile.mkdtemp(prefix="ksray-", dir="/tmp"))
            self._made_temp = True
        self.port = free_port(self.host)
        try:
            for i in range(self.nodes):
                self.add_node(head=i == 0)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.perf_counter() - t0
        return self

    def add_node(self, *, head: bool = False) -> _Node:
        """Start one more node (the head first) and wait until it is up."""
        assert self.temp_dir is not None
        index = len(self._nodes)
        folder = self.temp_dir / f"n{index}"
        folder.mkdir(parents=True, exist_ok=True)
        ports = {
            "--node-manager-port": free_port(self.host),
            "--object-manager-port": free_port(self.host),
            "--dashboard-agent-listen-port": free_port(self.host),
            "--dashboard-agent-grpc-port": free_port(self.host),
            "--runtime-env-agent-port": free_port(self.host),
            "--metrics-export-port": free_port(self.host),
        }
        if head:
            ports |= {
                "--port": self.port,
                "--ray-client-server-port": free_port(self.host),
                "--dashboard-port": free_port(self.host),
            }
        command = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            *(["--head"] if head else [f"--address={self.address}"]),
            f"--node-ip-address={self.host}",
            f"--num-cpus={self.cpus:g}",
            f"--object-store-memory={self.object_store_bytes}",
            f"--temp-dir={folder}",
            *(["--include-dashboard=false"] if head else []),
            "--disable-usage-stats",
            "--block",
            *(f"{flag}={port}" for flag, port in ports.items()),
        ]
        guard = [sys.executable, "-I", "-m", "keyshot.infer.serve.process_guard", "--grace-s", "10", "--"]
        log = folder / "ray-start.log"
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                guard + command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.node_env},
                start_new_session=True,
            )
        node = _Node(proc, log)
        self._nodes.append(node)
        self._wait_started(node, "the head" if head else f"node {index}")
        return node

    def _wait_started(self, node: _Node, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            text = node.log.read_text(errors="replace") if node.log.exists() else ""
            if "Ray runtime started" in text:
                return
            if not node.alive():
                tail = "\n".join(text.splitlines()[-8:])
                raise RayClusterError(f"ray start ({what}) ended before the node was up: {tail}")
            time.sleep(0.2)
        text = node.log.read_text(errors="replace") if node.log.exists() else ""
        tail = "\n".join(text.splitlines()[-8:]) or "(nothing written)"
        raise RayClusterError(
            f"ray start ({what}) was not up within {START_TIMEOUT_S:g}s; its log's end: {tail}"
        )

    def kill_node(self, index: int) -> None:
        """SIGKILL every process of node ``index`` at once (a node lost mid-run: its guard, ``ray start``,
        raylet, object store and workers, all of one session)."""
        node = self._nodes[index]
        _kill_session(node.proc.pid)
        node.proc.wait(timeout=10)

    def sessions(self) -> list[int]:
        """The session of each node: every process of a node is in its guard's session (Ray's workers
        lead process groups of their own, not sessions)."""
        return [n.proc.pid for n in self._nodes]

    def stop(self) -> None:
        """End every node, the head last, then remove the temp folder it made."""
        for node in reversed(self._nodes):
            if node.alive():
                node.proc.send_signal(signal.SIGTERM)  # the guard stops ray start, then kills its group
                with contextlib.suppress(subprocess.TimeoutExpired):
                    node.proc.wait(timeout=30)
            _kill_session(node.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(timeout=10)
        if self._made_temp and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def leftover(self, wait_s: float = 15.0) -> list[int]:
        """The processes of this cluster still running after up to ``wait_s`` (none after :meth:`stop`;
        a killed process is gone once it is reaped)."""
        deadline = time.monotonic() + wait_s
        while True:
            left = [pid for pid in _running_pids() if _session_of(pid) in self.sessions()]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.2)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _running_pids() -> list[int]:
    """Every process of this host that is not a zombie."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z" and pid_alive(int(entry)):
                pids.append(int(entry))
    return pids


def _session_of(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def _kill_session(sid: int) -> None:
    """SIGKILL every process of session ``sid``."""
    for pid in _running_pids():
        if _session_of(pid) == sid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Connection:
    """The cluster a run works on: its address, how many nodes are alive, whether keyshot started it."""

    address: str
    nodes: int
    started: LocalCluster | None
    start_s: float

    def close(self) -> None:
        import ray

        ray.shutdown()
        if self.started is not None:
            self.started.stop()

    def record(self) -> dict:
        """What run.json records of the engine (apart from the protocol)."""
        import ray

        return {
            "name": "ray",
            "ray": ray.__version__,
            "address": "local" if self.started else self.address,
            "nodes": self.nodes,
        }


def local_home(folder: Path) -> Path:
    """``folder/home`` with the :data:`BOOTSTRAP_CONFIG` of a local cluster: the home folder a Ray process
    started on this machine gets, so that nothing it does leaves the machine."""
    home = folder / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / BOOTSTRAP_CONFIG).write_text("provider:\n  type: local\n")
    return home


def node_ip_of(address: str) -> str | None:
    """The address this machine's driver joins a cluster from: the cluster's own where it is a loopback one
    (Ray would otherwise take the machine's outward address for the driver), else None (Ray's choice)."""
    host = address.rsplit(":", 1)[0].strip("[]")
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_loopback:
            return host
    return None


def connect(address: str | None, *, cpus: float | None = None) -> Connection:
    """Join the cluster at ``address`` (``auto``: the one ``RAY_ADDRESS`` or this machine's running head
    names), or start a local one of one node that ends with keyshot. The token of a joined cluster is the
    caller's (``RAY_AUTH_TOKEN``, as for ``ray`` itself)."""
    require_ray()
    t0 = time.perf_counter()
    started = None
    if address is None:
        started = LocalCluster(nodes=1, cpus=cpus or max(1, os.cpu_count() or 1)).start()
        use_token(started.env)
        address = started.address
    import ray

    try:
        ray.init(
            address=address,
            _node_ip_address=node_ip_of(address),
            logging_level="WARNING",
            log_to_driver=False,
        )
    except Exception as exc:
        if started is not None:
            started.stop()
        raise RayClusterError(f"--ray-address {address}: cannot join the Ray cluster: {exc}") from None
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return Connection(address, nodes, started, time.perf_counter() - t0)
