"""``keyshot reward env``: live MiniWoB pages on OpenEnv's own server, driven by OpenEnv's own client
(``GenericEnvClient`` over its WebSocket, tests/framework/openenv_client.py), in the OpenEnv venv (make
setup-openenv; ``$KEYSHOT_OPENENV_PYTHON``) with Debian's Chromium (make setup-browser). One server for the
module, against the fake judge: several sessions at once sharing one key-point call, keyshot's reward
beside MiniWoB's, OpenEnv's own BrowserGym models field for field, the server's max_steps, both OpenEnv
client generations (BrowserGymEnv of openenv 0.10 and of openenv-core, .venv-openenv-core), a verdict past
the server's deadline, a judge gone dead, and SIGTERM closing every browser.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.infer.testing.launch import OutputLines, start_reward_env
from keyshot.infer.testing.watch import wait_until
from tests.support.frameworks import python_or_skip
from tests.support.paths import FRAMEWORK
from tests.support.processes import gone
from tests.support.reward import write_config

pytestmark = pytest.mark.slow

MAX_STEPS = 3
ANSWER_WITHIN_S = 30.0  # a loaded 2-core machine takes seconds for a step before the verdict
WIRE_FIELDS = ["axtree_txt", "error", "goal", "last_action_error", "pruned_html", "screenshot", "text", "url"]


@pytest.fixture(scope="module")
def env_server(tmp_path_factory):
    """``keyshot reward env --miniwob click-test`` on a free port, the fake judge and scorer behind it."""
    python = python_or_skip("openenv")
    tmp = tmp_path_factory.mktemp("openenv-server")
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp / "reward.yaml", judge, scorer, timeout_s=90)
        with open(tmp / "stderr.log", "w") as log:
            extra = ("--miniwob", "click-test", "--max-steps", str(MAX_STEPS), "--keep", str(tmp / "kept"))
            extra += ("--answer-within-s", str(ANSWER_WITHIN_S), "--viewport", "miniwob")
            server = start_reward_env(python, config, *extra, stderr=log)
            proc = server.proc
            try:
                yield {
                    "url": server.url,
                    "proc": proc,
                    "judge": judge,
                    "kept": tmp / "kept",
                    "stderr": tmp / "stderr.log",
                }
            finally:
                if proc.poll() is None:
                    for child in psutil.Process(proc.pid).children(recursive=True):
                        child.kill()
                    proc.kill()
                proc.wait()


@pytest.fixture(scope="module")
def clients(env_server):
    """Three OpenEnv clients (tests/framework/openenv_client.py), open for the module: a session keeps its
    browser between its episodes."""
    driver = subprocess.Popen(
        [python_or_skip("openenv"), str(FRAMEWORK / "openenv_client.py"), env_server["url"], "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    answers = OutputLines(driver, "the OpenEnv clients")

    def play(*episodes: dict) -> list[dict]:
        driver.stdin.write(json.dumps(list(episodes)) + "\n")
        driver.stdin.flush()
        return json.loads(answers.wait_for("", 300))

    try:
        yield play
    finally:
        driver.stdin.close()
        driver.wait(timeout=60)


def test_openenv_clients_get_keyshot_reward_beside_miniwob_and_share_key_points(env_server, clients):
    summaries = clients(
        {"client": 0, "seed": 1}, {"client": 1, "seed": 2}, {"client": 2, "seed": 3, "agent": "noop"}
    )
    for summary in summaries:
        # OpenEnv's BrowserGym observation, field for field: its own model's fields, which read the answer
        assert summary["fields"] == summary["model_fields"] == WIRE_FIELDS
        assert summary["goal"] == "Click the button." and "[13] button 'Click Me!'" in summary["first_text"]
        # pruned_html as OpenEnv's server makes it (BrowserGym's prune_html of the DOM, with its ids)
        assert "<button" in summary["pruned_html"] and 'bid="13"' in summary["pruned_html"]
        # --viewport miniwob: the task's own page (the default, 1280x720, is tests/env/test_trl_browsergym_example.py's)
        assert summary["shape"][2] == 3 and 100 < summary["shape"][1] < 1280
        assert summary["rewards"][0] is None  # no reward at reset
        meta = summary["metadata"]
        assert meta["keyshot_reward"] == summary["rewards"][-1] and summary["rewards"][-1] in (0.0, 1.0)
        assert meta["keyshot_error"] is None and meta["keyshot_failed"] == 0.0
        assert (
            meta == summary["observation_metadata"]
        )  # top-level and in the observation, as OpenEnv sends it
        assert "the episode is over" in summary["after_done"]
    scripted, noop = summaries[:2], summaries[2]
    for summary, seed in zip(scripted, (1, 2), strict=True):
        assert summary["steps"] == 1 and summary["metadata"]["miniwob_reward"] == 1.0
        assert (
            summary["state"]["task_id"] == f"miniwob.click-test.{seed}"
            and summary["state"]["cum_reward"] == 1.0
        )
    # the server ends an episode the agent never finishes, and scores it
    assert noop["steps"] == MAX_STEPS and noop["rewards"][1:MAX_STEPS] == [None] * (MAX_STEPS - 1)
    assert noop["metadata"]["miniwob_reward"] == 0.0 and noop["state"]["step_count"] == MAX_STEPS
    steps = [identify_step(r) for r in env_server["judge"].requests]
    assert (
        steps.count("key_points") == 1 and steps.count("outcome") == 3
    )  # one key-point call for three sessions
    kept = {t.task_id: t for t in load_trajectories(env_server["kept"])}
    assert len(kept["miniwob.click-test.1"].screenshots) == 2 and kept["miniwob.click-test.1"].actions == [
        "click('13')"
    ]
    assert kept["miniwob.click-test.3"].actions == ["noop()"] * MAX_STEPS


@pytest.mark.parametrize("generation", ["openenv", "openenv-core"])
def test_both_openenv_client_generations_get_keyshots_reward_in_the_observation(env_server, generation):
    python = python_or_skip("openenv", "" if generation == "openenv" else "core")
    done = subprocess.run(
        [python, str(FRAMEWORK / "openenv_browsergym_client.py"), env_server["url"], "11"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["package"] == generation and summary["is_openenv_model"]
    # openenv 0.10 resolves a bare call (TRL's example works as shipped); openenv-core's are coroutines
    assert summary["bare_reset_is_coroutine"] is (generation == "openenv-core")
    assert summary["rewards"][0] is None and summary["rewards"][-1] in (0.0, 1.0)
    meta = summary["observation_metadata"]  # where BrowserGymEnv puts it: StepResult.metadata stays None
    assert meta["keyshot_reward"] == summary["rewards"][-1] and meta["keyshot_error"] is None
    assert summary["result_metadata"] is None and summary["task_id"] == "miniwob.click-test.11"


def test_a_verdict_past_the_deadline_is_answered_in_time_without_reward_and_finished_into_the_cache(
    env_server, clients
):
    judge, log = env_server["judge"], env_server["stderr"]
    outcomes = sum(identify_step(r) == "outcome" for r in judge.requests)
    came = "the verdict past the deadline came"
    judge.latency_s = ANSWER_WITHIN_S + 10  # the outcome call answers after the server's deadline
    try:
        [summary] = clients({"client": 1, "seed": 7})
        late_before = log.read_text().count(came)
    finally:
        judge.latency_s = 0
    meta = summary["metadata"]
    assert summary["rewards"][-1] is None and meta["keyshot_reward"] is None and meta["keyshot_failed"] == 1.0
    assert meta["keyshot_error"].startswith("deadline: no verdict within")
    assert meta["miniwob_reward"] == 1.0
    # the step was answered at its deadline, before the judge answered; the judging went on: its outcome
    # call was answered (into the call cache) and the late verdict logged
    wait_until(lambda: log.read_text().count(came) == late_before + 1, "the late verdict was logged", 90)
    assert sum(identify_step(r) == "outcome" for r in judge.requests) == outcomes + 1


def test_a_dead_judge_gives_none_with_the_reason_beside_miniwob_reward(env_server, clients):
    env_server["judge"].stop()
    [summary] = clients({"client": 0, "seed": 5})  # the session's browser serves its second episode
    meta = summary["metadata"]
    assert summary["rewards"][-1] is None and meta["keyshot_reward"] is None  # never a silent 0
    assert meta["keyshot_failed"] == 1.0 and meta["keyshot_error"].startswith("outcome")
    assert meta["miniwob_reward"] == 1.0  # MiniWoB's own reward is there all the same


def is_chromium(pid: int) -> bool:
    try:
        return "chrom" in psutil.Process(pid).name()
    except psutil.Error:  # ended meanwhile
        return False


def chromium_of(venv: Path) -> set[int]:
    """The Chromium processes whose environment points playwright at ``venv``'s browsers (what the OpenEnv
    venv's workers start), whoever their parent is now: Chromium's crash handlers are re-parented to init."""
    found = set()
    for proc in psutil.process_iter():
        try:
            if is_chromium(proc.pid) and proc.environ().get("PLAYWRIGHT_BROWSERS_PATH", "").startswith(
                str(venv)
            ):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


def test_sigterm_closes_every_browser_the_server_opened(env_server, clients):
    proc = env_server["proc"]
    under = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}  # workers and their browsers
    assert sum(is_chromium(pid) for pid in under) >= 3
    started = under | chromium_of(Path(python_or_skip("openenv")).parent.parent)  # and the crash handlers
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    assert gone(sorted(started), within_s=30) == []  # the workers and every Chromium process
    assert (
        "stopped by SIGTERM; the environment server closed its browsers" in env_server["stderr"].read_text()
    )


def test_an_unknown_task_is_refused_before_the_server_listens(tmp_path):
    config = write_config(tmp_path / "r.yaml", "http://127.0.0.1:9/v1")
    done = subprocess.run(
        [
            python_or_skip("openenv"),
            "-m",
            "keyshot.infer.cli",
            "reward",
            "env",
            "--config",
            str(config),
            "--miniwob",
            "no-such",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert "unknown MiniWoB task 'no-such'" in line and "click-button" in line
