"""Rewards per step on live pages (issue 64): ``keyshot reward env --miniwob enter-text`` with
``pipeline.step_rewards`` on, driven by OpenEnv's own client (tests/framework/openenv_client.py, in the
OpenEnv venv) with keyshot's scripted MiniWoB agents in Chromium, judged by a fake judge that answers from
what the pages show (tests/support/page_judge.py). One server, the three agents at once: the solver's
progress reaches 1 as MiniWoB's own reward says it solved the task, and each of its two steps earns the key
point it did; the one that stops before submitting stays below 1; the one that loops earns nothing after
its first hit."""

from __future__ import annotations

import json
import subprocess

import psutil
import pytest
import yaml

from keyshot.infer.testing.fake_openai import FakeOpenAI
from keyshot.infer.testing.launch import OutputLines, start_reward_env
from tests.support.frameworks import python_or_skip
from tests.support.page_judge import page_judge
from tests.support.paths import FRAMEWORK
from tests.support.reward import write_config

pytestmark = pytest.mark.slow

MAX_STEPS = 3


@pytest.fixture(scope="module")
def episodes(tmp_path_factory):
    """The three agents' episodes on one server (a session each), with the judge's requests."""
    python = python_or_skip("openenv")
    tmp = tmp_path_factory.mktemp("step-rewards-live")
    with FakeOpenAI(page_judge) as judge:
        config = write_config(tmp / "reward.yaml", judge, judge, timeout_s=90)
        cfg = yaml.safe_load(config.read_text())
        cfg.setdefault("pipeline", {})["step_rewards"] = True
        config.write_text(yaml.safe_dump(cfg))
        with open(tmp / "stderr.log", "w") as log:
            extra = ("--miniwob", "enter-text", "--max-steps", str(MAX_STEPS), "--viewport", "miniwob")
            server = start_reward_env(python, config, *extra, "--answer-within-s", "60", stderr=log)
        try:
            driver = subprocess.Popen(
                [python, str(FRAMEWORK / "openenv_client.py"), server.url, "3"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            plays = [
                {"client": i, "seed": 1, "agent": a}
                for i, a in enumerate(("scripted", "stopping", "looping"))
            ]
            driver.stdin.write(json.dumps(plays) + "\n")
            driver.stdin.flush()
            summaries = json.loads(OutputLines(driver, "the OpenEnv clients").wait_for("", 300))
            driver.stdin.close()
            driver.wait(timeout=60)
        finally:
            proc = server.proc
            if proc.poll() is None:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    child.kill()
                proc.kill()
            proc.wait()
        yield dict(zip(("solver", "stopper", "looper"), summaries, strict=True)), list(judge.requests)


def test_live_step_rewards_follow_what_each_agent_did(episodes):
    by_agent, _ = episodes
    solver, stopper, looper = (by_agent[k]["metadata"] for k in ("solver", "stopper", "looper"))
    # the solver: filled the field, then submitted; MiniWoB's own reward agrees
    assert solver["miniwob_reward"] == 1.0 and by_agent["solver"]["steps"] == 2
    assert solver["keyshot_progress"] == 1.0 and solver["keyshot_step_progress"] == [0.0, 0.5, 1.0]
    assert solver["keyshot_step_rewards"] == [0.0, 0.5, 0.5]  # each step earned the key point it did
    assert solver["keyshot_key_point_steps"] == [1, 2]
    # stopped before submitting: below 1, and MiniWoB says unsolved
    assert stopper["miniwob_reward"] == 0.0 and stopper["keyshot_progress"] == 0.5
    assert stopper["keyshot_step_rewards"] == [0.0, 0.5, 0.0, 0.0]
    # the same fill again and again: nothing after its first hit
    assert looper["miniwob_reward"] == 0.0 and looper["keyshot_step_rewards"] == [0.0, 0.5, 0.0, 0.0]
    for meta in (solver, stopper, looper):
        assert sum(meta["keyshot_step_rewards"]) == pytest.approx(meta["keyshot_progress"])
        assert meta["keyshot_error"] is None


def test_live_step_rewards_cost_one_judge_call_more_per_episode(episodes):
    from keyshot.infer.testing.fake_openai import identify_step, is_follow_up

    _, requests = episodes
    judge = [r for r in requests if identify_step(r) != "key_screenshot"]
    assert [identify_step(r) for r in judge].count("key_points") == 1  # the three sessions share the task
    assert sum(is_follow_up(r) for r in judge) == 3 and len(judge) == 1 + 3 + 3
