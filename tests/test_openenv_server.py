"""``keyshot reward env``: live MiniWoB pages on OpenEnv's own server, driven by OpenEnv's own client
(``GenericEnvClient`` over its WebSocket, tests/framework/openenv_client.py), in the OpenEnv venv (make
setup-openenv; ``$KEYSHOT_OPENENV_PYTHON``) with Debian's Chromium (make setup-browser). One server for the
module, against the fake judge: several sessions at once sharing one key-point call, keyshot's reward
beside MiniWoB's, the server's max_steps, a judge gone dead, and SIGTERM closing every browser.
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from tests.support.openenv import FRAMEWORK, openenv_python
from tests.support.processes import gone
from tests.support.reward import write_config

pytestmark = pytest.mark.slow

MAX_STEPS = 3
WIRE_FIELDS = ["axtree_txt", "error", "goal", "last_action_error", "pruned_html", "screenshot", "text", "url"]


def start_env(python: str, config: Path, *extra: str, stderr) -> subprocess.Popen:
    return subprocess.Popen(
        [python, "-m", "keyshot.infer.cli", "reward", "env", "--config", str(config), "--port", "0", *extra],
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The process's first output line, or a failure when it ends or says nothing in ``timeout_s``."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no start-up line in {timeout_s:g} s"
    line = proc.stdout.readline()
    assert line, f"the server ended (exit {proc.wait()}) before it listened"
    return line


@pytest.fixture(scope="module")
def env_server(tmp_path_factory):
    """``keyshot reward env --miniwob click-test`` on a free port, the fake judge and scorer behind it."""
    python = openenv_python()
    tmp = tmp_path_factory.mktemp("openenv-server")
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp / "reward.yaml", judge, scorer, timeout_s=5)
        with open(tmp / "stderr.log", "w") as log:
            extra = ("--miniwob", "click-test", "--max-steps", str(MAX_STEPS), "--keep", str(tmp / "kept"))
            proc = start_env(python, config, *extra, stderr=log)
            try:
                line = first_line(proc, 180)
                url = re.search(r"on (http://\S+)", line)
                assert url, line
                yield {
                    "url": url[1],
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
        [openenv_python(), str(FRAMEWORK / "openenv_client.py"), env_server["url"], "3"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )

    def play(*episodes: dict) -> list[dict]:
        driver.stdin.write(json.dumps(list(episodes)) + "\n")
        driver.stdin.flush()
        return json.loads(first_line(driver, 300))

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
        assert summary["fields"] == WIRE_FIELDS  # OpenEnv's BrowserGym observation, field for field
        assert summary["goal"] == "Click the button." and "[13] button 'Click Me!'" in summary["first_text"]
        assert len(summary["shape"]) == 3 and summary["shape"][2] == 3 and summary["shape"][0] > 100
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
    started = under | chromium_of(Path(openenv_python()).parent.parent)  # and the crash handlers
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
            openenv_python(),
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
