"""keyshot judge --engine ray on a real two-node Ray cluster: the one-process run's requests and verdicts,
nothing lost when a worker or a node dies, a killed driver resumed, the budget over the cluster, errors
refused before any work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.runs.run_record import read_engine, read_protocol
from keyshot.infer.testing.fake_openai import FakeOpenAI
from keyshot.infer.testing.watch import line_count, wait_until
from tests.support import paths
from tests.support.judge_inputs import N_TRAJECTORIES, judge_argv
from tests.support.ray_cluster import ray_cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster():
    with ray_cluster(nodes=2) as c:
        yield c


def request_contents(server: FakeOpenAI) -> Counter:
    return Counter(json.dumps(r, sort_keys=True) for r in server.requests)


def verdict_facts(out: Path) -> dict:
    """What a verdict says, task by task: success, kept screenshots, key points, scores."""
    return {
        v.key: (v.success, v.kept, v.key_points, [s.score for s in v.screenshots], v.incomplete)
        for v in read_verdicts(out / "verdicts.jsonl")
    }


def test_equal_to_one_process(cluster, tmp_path):
    with FakeOpenAI() as one:
        assert keyshot(judge_argv(one, tmp_path / "one")) == 0
    with FakeOpenAI() as on_ray:
        argv = judge_argv(on_ray, tmp_path / "ray") + ["--engine", "ray", "--ray-address", cluster.address]
        assert keyshot(argv) == 0
    sent = request_contents(on_ray)
    assert sent == request_contents(one)
    assert max(sent.values()) == 1  # each request once
    facts = verdict_facts(tmp_path / "ray")
    assert len(facts) == N_TRAJECTORIES
    assert facts == verdict_facts(tmp_path / "one")
    assert read_protocol(tmp_path / "ray") == read_protocol(tmp_path / "one")
    engine = read_engine(tmp_path / "ray")
    assert engine["name"] == "ray" and engine["nodes"] == 2
    assert read_engine(tmp_path / "one") is None


def keyshot_process(argv: list[str], cluster=None) -> subprocess.Popen:
    """``keyshot ARGV`` in a process of its own (to be killed), with the cluster's token."""
    env = {**os.environ, **(cluster.env if cluster else {})}
    return subprocess.Popen(
        [sys.executable, "-m", "keyshot.infer.cli", *argv],
        cwd=paths.REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def worker_pids(cluster, node: int | None = None) -> list[int]:
    """The processes of the cluster's stage actors (``ray::MapWorker``), of one node or all."""
    sessions = cluster.sessions() if node is None else [cluster.sessions()[node]]
    found = []
    for pid in os.listdir("/proc"):
        try:
            if os.getsid(int(pid)) in sessions and b"MapWorker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except (ValueError, OSError):
            continue
    return found


def assert_all_judged_once(out: Path) -> None:
    verdicts = read_verdicts(out / "verdicts.jsonl")
    keys = [v.key for v in verdicts]
    assert len(keys) == len(set(keys)) == N_TRAJECTORIES
    assert all(v.finished for v in verdicts)


def test_a_worker_killed_mid_run_loses_nothing(cluster, tmp_path):
    out = tmp_path / "out"
    with FakeOpenAI(latency_s=0.3) as server:
        argv = judge_argv(server, out) + ["--engine", "ray", "--ray-address", cluster.address]
        proc = keyshot_process(argv, cluster)
        wait_until(lambda: line_count(out / "verdicts.jsonl") >= 1, "a first verdict", 120, proc=proc)
        victims = worker_pids(cluster)
        assert victims, "no stage actor found"
        os.kill(victims[0], signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert_all_judged_once(out)


def test_a_node_killed_mid_run_loses_nothing(cluster, tmp_path):
    out = tmp_path / "out"
    with FakeOpenAI(latency_s=0.3) as server:
        argv = judge_argv(server, out) + ["--engine", "ray", "--ray-address", cluster.address]
        proc = keyshot_process(argv, cluster)
        wait_until(lambda: bool(worker_pids(cluster, node=1)), "an actor on the second node", 120, proc=proc)
        wait_until(lambda: line_count(out / "verdicts.jsonl") >= 1, "a first verdict", 120, proc=proc)
        cluster.kill_node(1)
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert_all_judged_once(out)
    cluster.add_node()  # the module's cluster has two nodes again
