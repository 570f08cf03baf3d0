"""Live episodes (keyshot.env.miniwob.browser): BrowserGym's MiniWoB tasks in Debian's Chromium, judged by
keyshot against the fake judge and compared with MiniWoB's own reward. The live tests are in the slow tier
and skip where the browser set-up (make setup-browser) is missing; the set-up's errors and the scripted
agent's reading of a page are checked without a browser."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from keyshot.env.miniwob.browser import (
    CHROMIUM_ENV,
    LivePage,
    MiniWoBBrowser,
    MiniWoBError,
    ScriptedAgent,
    prepare_browser,
    random_action,
    record_failure,
    run_episode,
)
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.reward import Episode, RewardModel

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"
ENTER_TEXT = """Goal: Enter "Kasie" into the text field and press Submit.

Page structure:
RootWebArea 'Enter Text Task', focused
\t[14] textbox ''
\t[16] button 'Submit'"""


def test_a_missing_chromium_is_named_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-chromium"))
    with pytest.raises(MiniWoBError) as caught:
        prepare_browser()
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "no-chromium") in message
    assert f"from {CHROMIUM_ENV}" in message and "apt-get install chromium" in message


def test_the_scripted_agent_types_then_submits_and_clicks_what_the_goal_names():
    agent = ScriptedAgent()
    page = LivePage(ENTER_TEXT, None, 0, False)
    assert agent(page) == "fill('14', 'Kasie')"
    assert agent(page) == "click('16')"  # filled: Submit
    buttons = "Goal: Click on the \"no\" button.\n\nPage structure:\n\t[17] button 'yes'\n\t[19] button 'No'"
    assert ScriptedAgent()(LivePage(buttons, None, 0, False)) == "click('19')"
    assert ScriptedAgent()(LivePage(buttons, None, 1, True)) is None  # the page is done
    rng = random.Random(0)
    assert {random_action(LivePage(buttons, None, 0, False), rng) for _ in range(20)} == {
        "click('17')",
        "click('19')",
    }
    assert random_action(LivePage("Goal: x\n\nPage structure:\n", None, 0, False), rng) == "noop()"


@pytest.fixture(scope="module")
def live():
    """The browser set-up, or a skip naming what is missing."""
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    try:
        return prepare_browser()
    except MiniWoBError as exc:  # no Chromium here
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def config(tmp_path_factory, live):
    """The fake server as judge and scorer; a failed call is a reward of None (on_failure: none)."""
    with FakeOpenAI(make_judge()) as judge:
        path = fake_judge_config(
            tmp_path_factory.mktemp("live") / "reward.yaml",
            judge.base_url,
            {"endpoint": {"base_url": judge.base_url, "model": "webjudge-7b", "api_key_env": None}},
            judge={"backoff_base_s": 0.01, "max_retries": 1, "timeout_s": 10},
        )
        yield path


def gone(pids: list[int], within_s: float = 15.0) -> list[int]:
    """The processes of ``pids`` still running (zombies count as ended) after waiting up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


def chromium_under(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True) if "chrom" in p.name()]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["click-button", "enter-text"])
def test_live_pages_reset_act_and_are_recorded(tmp_path, config, task):
    kept = tmp_path / "kept"
    with MiniWoBBrowser(task, seed=1) as browser:
        first = browser.reset()
        assert first.screenshot.startswith(PNG) and first.image().size[0] > 300
        assert first.text.startswith(f"Goal: {browser.task}") and "Page structure:" in first.text
        assert (first.step, first.done, first.reward, browser.task_id) == (0, False, 0.0, f"miniwob.{task}.1")
        episode = run_episode(browser, ScriptedAgent(), keep_dir=kept)
        assert browser.done and browser.reward == 1.0  # MiniWoB's own reward: the scripted agent did it right
        assert len(episode.screenshots) == browser.step + 1 and len(episode.actions) == browser.step
        assert episode.actions[-1].startswith("click(") and episode.problem() is None
        with pytest.raises(MiniWoBError, match="the episode is over"):
            browser.act("noop()")
        processes = [browser.process.pid, *browser.pids]
    assert gone(processes) == []  # closed: its worker and both Chromium instances
    [trajectory] = load_trajectories(kept)  # keyshot judge reads the kept episode as it is
    assert trajectory.task == browser.task and len(trajectory.screenshots) == browser.step + 1
    rm = RewardModel.from_config(config)
    try:
        [result] = rm.score_sync([str(episode.jsonl_path)])
    finally:
        rm.close()
    assert result.error is None and result.reward in (0.0, 1.0)


@pytest.mark.slow
def test_a_browser_killed_mid_episode_is_not_rewarded_and_the_rest_are(config):
    with ThreadPoolExecutor(3) as pool:  # browsers side by side, one per thread
        browsers = list(pool.map(lambda seed: MiniWoBBrowser("click-button", seed=seed), (3, 4, 5)))
    try:
        with ThreadPoolExecutor(3) as pool:
            pages = list(pool.map(lambda b: b.reset(), browsers))
        episodes = [Episode(b.task, start_url=b.start_url, task_id=b.task_id) for b in browsers]
        for episode, page in zip(episodes, pages, strict=True):
            episode.add_step(page.screenshot)
        os.kill(browsers[1].pids[0], signal.SIGKILL)  # the page's Chromium dies mid-episode
        for b, episode, page in zip(browsers, episodes, pages, strict=True):
            action = ScriptedAgent()(page)
            after = b.act(action)
            if after.screenshot is not None:
                episode.add_step(after.screenshot, action=action)
            record_failure(episode, after)
            episode.finish(None)
        assert [b.reward for b in browsers] == [1.0, None, 1.0]
        assert browsers[1].error.startswith("the browser failed at step 1:")
        rm = RewardModel.from_config(config)
        try:
            results = rm.score_sync(episodes)
        finally:
            rm.close()
        assert [r.reward is None for r in results] == [False, True, False]
        assert "the browser failed at step 1" in results[1].error
        # the failed browser's process is replaced at the next reset
        again = run_episode(browsers[1], ScriptedAgent())
        assert browsers[1].reward == 1.0 and again.problem() is None
    finally:
        processes = [p for b in browsers for p in (b.pids + ([b.process.pid] if b.process else []))]
        for b in browsers:
            b.close()
    assert gone(processes) == []


HOLDER = """
import json, sys, time
from keyshot.env.miniwob.browser import MiniWoBBrowser
browser = MiniWoBBrowser("click-test", seed=0)
browser.reset()
print(json.dumps([browser.process.pid, *browser.pids]), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_no_chromium_is_left_after_sigterm(live):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(holder.stdout.readline())
        every = pids + chromium_under(holder.pid)
        assert (
            len(every) >= 4
        )  # the worker, the page's and BrowserGym's chat window's Chromium, their helpers
        holder.send_signal(signal.SIGTERM)
        holder.wait(timeout=30)
    finally:
        holder.kill()
    assert gone(every) == []


@pytest.mark.slow
def test_browsergym_experiment_loop_runs_are_judged_and_scored_against_miniwob(tmp_path, config):
    runs_root = tmp_path / "study"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "support" / "browsergym_loop.py"),
            str(runs_root),
            "click-button",
        ]
        + ["named:0", "random:2,3"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = [Path(p) for p in json.loads(done.stdout.strip().splitlines()[-1])]
    summaries = {run.name: json.loads((run / "summary_info.json").read_text()) for run in runs}
    assert all(s["err_msg"] is None for s in summaries.values())  # tiktoken counted offline, Chromium found
    assert summaries[runs[0].name]["cum_reward"] == 1.0  # the named target clicked: MiniWoB's success
    out = tmp_path / "judged"
    argv = ["judge", str(runs_root), "--config", str(config), "--no-progress", f"out={out}"]
    assert keyshot(argv) == 0
    verdicts = {v.run: v for v in read_verdicts(out / "verdicts.jsonl")}
    assert len(verdicts) == 3
    for run in runs:
        verdict = next(v for v in verdicts.values() if v.source and Path(v.source).name == run.name)
        shots = sorted(run.glob("screenshot_step_*.png"))
        assert len(verdict.screenshots) == len(shots) and verdict.success is not None
        assert verdict.reward == summaries[run.name]["cum_reward"]  # MiniWoB's reward, carried along
    metrics = tmp_path / "metrics"
    assert keyshot(["metrics", str(out), "--out", str(metrics)]) == 0
    report = json.loads((metrics / "metrics.json").read_text())
    assert report["n_used"] == 3 and sum(report["truth"].values()) == 3
    truth_successes = sum(s["cum_reward"] > 0 for s in summaries.values())
    overall = next(r for r in report["agreement"] if r["scope"] == "overall")
    assert overall["n"] == 3 and round(overall["human_sr"] * 3) == truth_successes
