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
from keyshot.infer.common.errors import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_USAGE
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.runs.run_record import read_engine, read_protocol
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.watch import kill_when, line_count, wait_until
from tests.support import paths
from tests.support.judge_inputs import N_TRAJECTORIES, TINY_CPU, TRAJ, judge_argv
from tests.support.ray_cluster import ray_cluster
from tests.support.reward import write_config


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


@pytest.mark.slow
@pytest.mark.timeout(600)
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
    assert engine["endpoint_caps"] == "cluster" and engine["slots_taken_back"] == 0
    assert read_engine(tmp_path / "one") is None


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_each_endpoint_cap_holds_over_the_whole_cluster(cluster, tmp_path):
    """Judge 1 and scorer 3 requests in flight in all, over two actors: the server (judge and scorer both)
    never sees more than 4 at once. Caps split into fixed shares (1 judge and 2 scorer slots each) would
    let 6 through; each actor with the whole caps, 8."""
    caps = {"judge.max_concurrency": "1", "scorer.endpoint.max_concurrency": "3", "concurrency": "4"}
    with FakeOpenAI(latency_s=0.4) as server:
        argv = judge_argv(server, tmp_path / "out", **caps)
        assert keyshot(argv + ["--engine", "ray", "--ray-address", cluster.address]) == 0
        peak = server.stats.max_in_flight
    assert len(verdict_facts(tmp_path / "out")) == N_TRAJECTORIES
    assert 2 <= peak <= 4, peak


@pytest.mark.timeout(300)
def test_a_slot_whose_holder_died_comes_back_when_its_lease_ends(cluster):
    """The gate lends an endpoint's slots one request at a time: the cap's worth at once, the next when one
    is returned, and one never returned (its holder died) once its lease has run out."""
    import asyncio

    from keyshot.infer.engines.ray_cluster import connect
    from keyshot.infer.engines.ray_engine import ClusterLedger, SlotCaps

    conn = connect(cluster.address)
    try:
        ledger = ClusterLedger.create(SlotCaps({"e": (2, 1.0)}))

        async def go() -> tuple[float, float]:
            held = [ledger.request_slot("e") for _ in range(2)]
            for slot in held:
                await slot.__aenter__()
            third = asyncio.ensure_future(ledger.request_slot("e").__aenter__())
            await asyncio.sleep(0.3)
            waited = third.done()
            await held[0].__aexit__(None, None, None)  # returned: the third request goes
            await asyncio.wait_for(third, 10)
            t0 = asyncio.get_running_loop().time()
            await asyncio.wait_for(ledger.request_slot("e").__aenter__(), 10)  # held[1] never returned
            return waited, asyncio.get_running_loop().time() - t0

        waited, lease_wait = asyncio.run(go())
        state = ledger.gate_state()
    finally:
        conn.close()
    assert waited is False  # the cap held
    assert 0.3 <= lease_wait <= 5.0, lease_wait
    assert state["reclaimed"] >= 1 and state["lent"] == {"e": 2}, state
    assert ledger.request_slot("other").__class__.__name__ == "nullcontext"  # only capped endpoints wait


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


def judged_through(cluster, out: Path, strike, *, first_on_node: int | None = None) -> None:
    """``keyshot judge --engine ray`` in a process of its own, ``strike()`` once its first verdict is written
    (and, with ``first_on_node``, once that node runs an actor); the run must still judge everything once."""
    with FakeOpenAI(latency_s=0.3) as server:
        argv = judge_argv(server, out) + ["--engine", "ray", "--ray-address", cluster.address]
        proc = keyshot_process(argv, cluster)
        if first_on_node is not None:
            on_node = lambda: bool(worker_pids(cluster, node=first_on_node))  # noqa: E731
            wait_until(on_node, f"an actor on node {first_on_node}", 120, proc=proc)
        wait_until(lambda: line_count(out / "verdicts.jsonl") >= 1, "a first verdict", 120, proc=proc)
        strike()
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err.decode()[-2000:]
    assert_all_judged_once(out)


def kill_a_worker(cluster) -> None:
    victims = worker_pids(cluster)
    assert victims, "no stage actor found"
    os.kill(victims[0], signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_killed_mid_run_loses_nothing(cluster, tmp_path):
    judged_through(cluster, tmp_path / "out", lambda: kill_a_worker(cluster))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_node_killed_mid_run_loses_nothing(cluster, tmp_path):
    judged_through(cluster, tmp_path / "out", lambda: cluster.kill_node(1), first_on_node=1)
    cluster.add_node()  # the module's cluster has two nodes again


#: What one process sends for the fixtures (test_equal_to_one_process): 14 judge and 24 scorer calls.
CALLS = 38
#: The most calls in flight on the whole cluster: judge and scorer each at most max_concurrency 4 (tiny_cpu),
#: shared out over the actors.
IN_FLIGHT = 8


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_killed_driver_resumes_repaying_at_most_the_calls_in_flight(cluster, tmp_path):
    out = tmp_path / "out"
    with FakeOpenAI(latency_s=0.3) as server:
        argv = judge_argv(server, out) + ["--engine", "ray", "--ray-address", cluster.address]
        kill_when(
            keyshot_process(argv, cluster), lambda: line_count(out / "verdicts.jsonl") >= 2, "2 verdicts"
        )
        server.settled_stats()
        assert keyshot(argv) == 0
        stats = server.settled_stats()
    assert_all_judged_once(out)
    distinct = len(request_contents(server))
    assert distinct == CALLS
    repaid = stats.requests - distinct
    assert 0 <= repaid <= IN_FLIGHT, f"{repaid} calls paid twice"


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_local_cluster_ends_with_keyshot_even_killed(cluster, tmp_path):
    out = tmp_path / "out"
    ours = set(cluster_pids())
    with FakeOpenAI(latency_s=0.3) as server:
        proc = keyshot_process(judge_argv(server, out) + ["--engine", "ray"])
        wait_until(lambda: bool(set(cluster_pids()) - ours), "a local cluster", 120, proc=proc)
        kill_when(proc, lambda: line_count(out / "verdicts.jsonl") >= 1, "a first verdict", 180)
    wait_until(lambda: not set(cluster_pids()) - ours, "the local cluster's end", 60)


def cluster_pids() -> list[int]:
    """The processes of every local cluster keyshot started on this machine (their temp folders)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            if b"/tmp/ksray-" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(int(pid))
        except (ValueError, OSError):
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_budget_holds_over_the_whole_cluster(cluster, tmp_path):
    """One ledger for both actors: no call starts once the cluster's spending (with its calls in flight)
    reaches the budget, so at most the calls then in flight pass it: one per actor here (one trajectory
    each, its judge calls one after another). Each actor with a ledger of its own would spend the budget
    once per actor."""
    out = tmp_path / "out"
    prices = {"judge.price_input_per_mtok": "1000", "judge.budget_usd": "10"}  # ~$2.3 a judge call
    with FakeOpenAI() as server:
        argv = judge_argv(server, out, **prices)
        argv += ["--engine", "ray", "--ray-address", cluster.address, "--ray-per-actor", "1"]
        assert keyshot(argv) == EXIT_BUDGET
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["budget_stop"] and run["engine"]["actors"] == 2
    assert run["engine"]["endpoint_caps"] == "per actor"  # --ray-per-actor: each actor its own caps
    judge = run["ledger"]["fake-judge"]
    assert judge["budget_stops"] >= 1
    costliest = max(v.usage["judge"].cost_usd for v in read_verdicts(out / "verdicts.jsonl"))  # >= one call
    assert 0 < judge["cost_usd"] <= 10 + 2 * costliest, judge


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_failed_call_fails_its_trajectory_not_the_job(cluster, tmp_path):
    out = tmp_path / "out"
    with FakeOpenAI(faults={"500": 0.15}) as server:
        argv = judge_argv(server, out, **{"judge.max_retries": "0", "scorer.endpoint.max_retries": "0"})
        assert keyshot(argv + ["--engine", "ray", "--ray-address", cluster.address]) == EXIT_INCOMPLETE
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert len({v.key for v in verdicts}) == len(verdicts) == N_TRAJECTORIES
    assert any(v.incomplete for v in verdicts)


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["concurrency=0"], "concurrency must be >= 1"),
        (["--ray-per-actor", "0"], "--ray-per-actor must be >= 1"),
        (["--shard", "3/2"], "shard"),
    ],
)
def test_errors_are_refused_in_one_line_before_the_cluster_works(tmp_path, capsys, extra, says):
    argv = ["judge", str(TRAJ / "agentlab"), "--config", TINY_CPU, f"out={tmp_path / 'out'}"]
    # an address nothing listens on: joining it would fail, so the refusal came before
    assert keyshot([*argv, "--engine", "ray", "--ray-address", "127.0.0.1:9", *extra]) == EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err
    assert not (tmp_path / "out").exists()


def test_ray_options_need_the_ray_engine(tmp_path, capsys):
    argv = ["judge", str(TRAJ / "agentlab"), "--config", TINY_CPU, "--ray-address", "auto"]
    assert keyshot(argv) == EXIT_USAGE
    assert "--ray-address needs --engine ray" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_reward_filter_on_ray_keeps_what_one_process_keeps(cluster, tmp_path):
    rollouts = str(TRAJ / "online_mind2web_v1")
    results = {}
    with FakeOpenAI(make_judge()) as server:
        config = write_config(tmp_path / "reward.yaml", server)
        for engine in ("process", "ray"):
            out = tmp_path / engine
            argv = [
                "reward",
                "filter",
                rollouts,
                "--config",
                str(config),
                "--min-reward",
                "1",
                "--out",
                str(out),
            ]
            argv += ["--engine", engine] + (["--ray-address", cluster.address] if engine == "ray" else [])
            assert keyshot(argv) == 0
            results[engine] = [(out / name).read_text() for name in ("rewards.jsonl", "accepted.jsonl")]
    assert results["ray"] == results["process"]
    assert results["ray"][0].count("\n") == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_synth_on_ray_gives_the_labels_and_rows_of_one_process(cluster, tmp_path):
    from datasets import load_from_disk

    from keyshot.data_synth.labelling_run import run_synth
    from keyshot.data_synth.labels import LABELS_FILE, read_store
    from keyshot.infer.testing.fake_openai import make_teacher
    from tests.support.synth_env import RULES, synth_config, teacher_set

    with FakeOpenAI(make_teacher(RULES["bright"])) as bright, FakeOpenAI(make_teacher(RULES["dark"])) as dark:
        teachers = teacher_set({"bright": bright.base_url, "dark": dark.base_url})
        one = synth_config(tmp_path / "one.yaml", tmp_path / "one", teachers)
        assert run_synth(one).exit_code == 0
        paid = len(bright.requests) + len(dark.requests)
        bright.requests.clear(), dark.requests.clear()
        on_ray = synth_config(tmp_path / "ray.yaml", tmp_path / "ray", teachers)
        argv = ["synth", "run", "--config", str(tmp_path / "ray.yaml"), "--engine", "ray"]
        assert keyshot([*argv, "--ray-address", cluster.address]) == 0
        assert len(bright.requests) + len(dark.requests) == paid
    found = {}
    for run in (one.run_dir, on_ray.run_dir):
        by_step = read_store(Path(run) / LABELS_FILE).labels_by_step()
        dataset = load_from_disk(f"{run}/dataset")
        found[run] = (
            {step: sorted((r.teacher, r.score) for r in rs) for step, rs in by_step.items()},
            {split: sorted(map(str, ds["messages"])) for split, ds in dataset.items()},
        )
    assert found[one.run_dir] == found[on_ray.run_dir] and found[one.run_dir][0]


def test_a_pools_members_are_capped_under_the_names_their_clients_count_by():
    """The gate's caps are keyed as the clients' ledger calls name their endpoints: a pool's members as the
    pool names them (model@host:port), each with its own cap; a judge and a scorer of one name share the sum."""
    from keyshot.infer.client.pool import EndpointPool
    from keyshot.infer.client.usage import UsageLedger
    from keyshot.infer.common.config import load_config
    from keyshot.infer.engines.ray_engine import SlotCaps
    from keyshot.infer.judge.config import JudgeRunConfig
    from keyshot.infer.judge.scorer_factory import scorer_served_at

    urls = ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    cfg = scorer_served_at(load_config(JudgeRunConfig, TINY_CPU, ["scorer.endpoint.max_concurrency=3"]), urls)
    caps = SlotCaps.of(cfg.called_endpoints()).caps
    pool = EndpointPool(cfg.scorer.endpoints, None, UsageLedger())
    assert {m.client.endpoint.name for m in pool.members} <= set(caps)
    assert [caps[m.client.endpoint.name][0] for m in pool.members] == [3, 3]
    same = load_config(JudgeRunConfig, TINY_CPU, ["judge.name=shared", "scorer.endpoint.name=shared"])
    assert SlotCaps.of(same.called_endpoints()).caps["shared"][0] == (
        same.judge.max_concurrency + same.scorer.endpoint.max_concurrency
    )
