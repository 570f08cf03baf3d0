"""Live episodes (keyshot.env.miniwob): BrowserGym's MiniWoB tasks in Debian's Chromium, judged by keyshot
against the fake judge and compared with MiniWoB's own reward; the browser pool and budget that keep a
trainer's live pages within the machine, through the TRL example's environment class. The live tests are
in the slow tier, share one prepared set-up, and skip where the browser set-up (make setup-browser) is
missing; the set-up's errors, the budget's arithmetic and refusal, and the scripted agent's reading of a
page are checked without a browser."""

from __future__ import annotations

import asyncio
import importlib.util
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

from keyshot.env.miniwob.agents import ScriptedAgent, random_action
from keyshot.env.miniwob.budget import MIB_PER_BROWSER, BrowserBudget, BrowserBudgetError
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.setup import CHROMIUM_ENV, HOME_ENV, MiniWoBError, browser_setup
from keyshot.env.page import Browser, Page
from keyshot.env.play import record_failure, run_episode
from keyshot.env.replay import ReplayBrowser
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.reward import Episode, RewardModel
from keyshot.reward.trl import environment_reward
from tests.support.processes import gone

REPO = Path(__file__).resolve().parents[1]
TRL_EXAMPLE = REPO / "examples" / "reward" / "trl_browsergym_grpo.py"
PNG = b"\x89PNG\r\n\x1a\n"
ENTER_TEXT = """Goal: Enter "Kasie" into the text field and press Submit.

Page structure:
RootWebArea 'Enter Text Task', focused
\t[14] textbox ''
\t[16] button 'Submit'"""


def load_example():
    spec = importlib.util.spec_from_file_location("trl_browsergym_grpo", TRL_EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_missing_chromium_is_named_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-chromium"))
    with pytest.raises(MiniWoBError) as caught:
        browser_setup()
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "no-chromium") in message
    assert f"from {CHROMIUM_ENV}" in message and "apt-get install chromium" in message


def test_the_scripted_agent_types_then_submits_and_clicks_what_the_goal_names():
    agent = ScriptedAgent()
    page = Page(ENTER_TEXT, None, 0, False)
    assert agent(page) == "fill('14', 'Kasie')"
    assert agent(page) == "click('16')"  # filled: Submit
    buttons = "Goal: Click on the \"no\" button.\n\nPage structure:\n\t[17] button 'yes'\n\t[19] button 'No'"
    assert ScriptedAgent()(Page(buttons, None, 0, False)) == "click('19')"
    assert ScriptedAgent()(Page(buttons, None, 1, True)) is None  # the page is done
    rng = random.Random(0)
    assert {random_action(Page(buttons, None, 0, False), rng) for _ in range(20)} == {
        "click('17')",
        "click('19')",
    }
    assert random_action(Page("Goal: x\n\nPage structure:\n", None, 0, False), rng) == "noop()"


def test_the_replay_is_a_browser_that_closes():
    replay = ReplayBrowser(
        sorted((REPO / "tests" / "fixtures" / "trajectories" / "online_mind2web_v1").iterdir())[0]
    )
    assert isinstance(replay, Browser) and isinstance(replay.reset(), Page)
    replay.close()
    replay.close()  # idempotent, as every Browser's


def test_the_budget_is_half_the_memory_over_a_browsers_and_refuses_in_one_line():
    budget = BrowserBudget.for_machine(memory_mib=20 * 1024)
    assert budget.max_browsers == 20 * 1024 // 2 // MIB_PER_BROWSER == 20
    budget.require(20, "a batch", "need fewer")  # within the budget: nothing said
    with pytest.raises(BrowserBudgetError) as caught:
        budget.require(128, "a batch of 128", "lower X")
    message = str(caught.value)
    assert "\n" not in message
    assert "a batch of 128 needs 128 live MiniWoB pages at once" in message
    assert "holds 20 live pages (half of the 20,480 MiB available, at 512 MiB per browser)" in message
    assert message.endswith(": lower X")
    given = BrowserBudget.for_machine(6)
    assert given.max_browsers == 6 and "--max-browsers allows 6" in given.describe()
    with pytest.raises(BrowserBudgetError, match="--max-browsers must be at least 1"):
        BrowserBudget.for_machine(0)
    assert BrowserBudget.for_machine().available_mib > 0  # this machine's memory is read


def test_the_trl_example_refuses_a_generation_batch_beyond_the_budget_before_opening_anything(tmp_path):
    """The example's defaults (4 generations, 32 accumulation steps: TRL's pool holds 128 environments, all
    reset before the first generation) against a budget of 8 browsers: one line, exit 2, no browser."""
    pytest.importorskip("miniwob", reason="the browser extra: make setup-browser")
    pytest.importorskip("playwright", reason="the browser extra: make setup-browser")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    argv = [sys.executable, str(TRL_EXAMPLE), "--keyshot-config", str(tmp_path / "unused.yaml")]
    argv += ["--miniwob", "click-button", "--tiny-model", "--train-steps", "1", "--max-browsers", "8"]
    argv += ["--output-dir", str(tmp_path / "out")]
    # any executable, linked in a home of its own: the set-up is checked, nothing is launched
    env = {**os.environ, CHROMIUM_ENV: sys.executable, HOME_ENV: str(tmp_path / "browser-home")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = [
        line for line in done.stderr.splitlines() if "error" in line.lower()
    ]  # beside a library warning
    assert line.startswith("error: a generation batch of 128 rollouts (--num-generations 4 × ")
    assert "--gradient-accumulation-steps 32) needs 128 live MiniWoB pages at once" in line
    assert "--max-browsers allows 8 live pages" in line and "their product is at most 8" in line
    assert "keyshot reward env --miniwob click-button there) and pass its URL as --space-url" in line
    assert not (tmp_path / "out").exists()  # nothing was built: the policy neither
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


@pytest.fixture(scope="session")
def live():
    """The browser set-up, prepared once for every live test, or a skip naming what is missing."""
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    try:
        return browser_setup()
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


def chromium_under(pid: int) -> list[int]:
    return [p.pid for p in psutil.Process(pid).children(recursive=True) if "chrom" in p.name()]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["click-button", "enter-text"])
def test_live_pages_reset_act_and_are_recorded(tmp_path, config, live, task):
    kept = tmp_path / "kept"
    with MiniWoBBrowser(task, seed=1, setup=live) as browser:
        first = browser.reset()
        assert isinstance(browser, Browser)  # (its task is known once reset)
        assert first.screenshot.startswith(PNG) and first.image().size[0] > 300
        assert first.text.startswith(f"Goal: {browser.task}") and "Page structure:" in first.text
        assert (first.step, first.done, first.reward, browser.task_id) == (0, False, 0.0, f"miniwob.{task}.1")
        episode = run_episode(browser, ScriptedAgent(), keep_dir=kept)
        assert browser.done and browser.reward == 1.0  # MiniWoB's own reward: the scripted agent did it right
        assert len(episode.screenshots) == browser.step + 1 and len(episode.actions) == browser.step
        assert episode.actions[-1].startswith("click(") and episode.problem() is None
        with pytest.raises(MiniWoBError, match="the episode is over"):
            browser.act("noop()")
        processes = browser.processes
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
def test_a_browser_serves_episode_after_episode_in_the_same_page_without_touching_this_environment(live):
    environ = dict(os.environ)
    with MiniWoBBrowser("click-button", setup=live) as browser:
        started = time.perf_counter()
        browser.reset(seed=1)
        launch_s = time.perf_counter() - started
        chromium = list(browser.pids)
        rewards, resets_s = [], []
        for seed, task in [(2, "click-button"), (3, "enter-text"), (4, "click-button")]:
            started = time.perf_counter()
            page = browser.reset(seed=seed, task=task)
            resets_s.append(time.perf_counter() - started)
            assert browser.task_id == f"miniwob.{task}.{seed}" and page.text.startswith(
                f"Goal: {browser.task}"
            )
            agent = ScriptedAgent()
            while not page.done and (action := agent(page)) is not None:
                page = browser.act(action)
            rewards.append(browser.reward)
        assert rewards == [1.0, 1.0, 1.0]  # each a whole MiniWoB episode, enter-text's in click-button's page
        assert browser.pids == chromium and (browser.episodes, browser.launches) == (4, 1)
        assert max(resets_s) < launch_s  # no launch: the page is loaded again
        os.kill(browser.pids[0], signal.SIGKILL)  # the page's Chromium dies between episodes
        assert gone(chromium[:1]) == []
        browser.reset(seed=5)  # found dead and launched again: no episode lost
        assert browser.launches == 2 and browser.pids[0] != chromium[0]
        processes = browser.processes + chromium
    assert gone(processes) == []
    assert dict(os.environ) == environ  # the set-up reached the worker through its own environment


@pytest.mark.slow
def test_a_browser_killed_mid_episode_is_not_rewarded_and_the_rest_are(config, live):
    with ThreadPoolExecutor(3) as pool:  # browsers side by side, one per thread
        browsers = list(
            pool.map(lambda seed: MiniWoBBrowser("click-button", seed=seed, setup=live), (3, 4, 5))
        )
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
        assert browsers[1].error.startswith("the browser failed at step 1:") and not browsers[1].alive
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
        processes = [p for b in browsers for p in b.processes]
        for b in browsers:
            b.close()
    assert gone(processes) == []


def trl_reward(example, config):
    """The example's reward over environments, as GRPOTrainer calls it; (rewards, metrics, extras), each
    metric the mean of the values logged under its name, as TRL logs it."""
    reward = example.with_miniwob_reward(environment_reward(config))

    def call(envs):
        logged, extras = {}, {}
        rewards = asyncio.run(
            reward(
                environments=envs,
                completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
                log_metric=lambda name, value: logged.setdefault(name, []).append(value),
                log_extra=extras.__setitem__,
            )
        )
        return rewards, {name: sum(v) / len(v) for name, v in logged.items()}, extras

    return call


@pytest.mark.slow
def test_trl_environments_share_a_bounded_pool_and_a_dead_page_fails_one_episode_not_the_run(config, live):
    """TRL's way: a pool of environments, reset one after another, acted in, rewarded together, reset
    again for the next batch. Browsers are opened ahead, reused across batches and given back at each
    episode's end; a browser that dies and a page that does not open each fail their episode (reward None
    with the reason, counted in keyshot/failed) and are replaced; the next batch is whole again."""
    example = load_example()
    pool = example.MiniWoBEnv.pool = BrowserPool(BrowserBudget.for_machine(3), "click-button", setup=live)
    envs = [example.MiniWoBEnv() for _ in range(3)]
    score = trl_reward(example, config)
    try:
        assert pool.alive == 0  # an environment's construction opens nothing (TRL builds one to probe)
        pool.warm(3)
        assert pool.wait_open(3, timeout_s=120)

        def batch(first_seed: int, sabotage=None) -> tuple[list, dict, dict]:
            texts = []
            for i, env in enumerate(envs):  # TRL resets its environments one after another
                if sabotage is not None:
                    sabotage(i, env)
                texts.append(env.reset(miniwob_task="click-button", seed=first_seed + i, prompt=[]))
            for env, text in zip(envs, texts, strict=True):
                action = None if env.done else ScriptedAgent()(Page(text, None, 0, False))
                if action is not None:
                    env.click(action.split("'")[1])
            return score(envs)

        rewards, metrics, extras = batch(0)
        assert None not in rewards and metrics["keyshot/failed"] == 0.0
        assert extras["miniwob_reward"] == [1.0, 1.0, 1.0] and metrics["miniwob/compared"] == 3.0
        assert all(env.browser is None for env in envs) and pool.alive == 3  # given back, kept open
        browsers = pool.browsers()
        assert [(b.episodes, b.launches) for b in browsers] == [
            (2, 1)
        ] * 3  # the warm page served the episode

        # a browser dies mid-episode: that episode fails, the others are rewarded
        for i, env in enumerate(envs):
            env.reset(miniwob_task="click-button", seed=10 + i, prompt=[])
        dead = envs[1].browser
        os.kill(dead.pids[0], signal.SIGKILL)
        for env in envs:
            env.noop()
        rewards, metrics, extras = score(envs)
        assert [r is None for r in rewards] == [False, True, False] and metrics[
            "keyshot/failed"
        ] == pytest.approx(1 / 3)
        assert "the browser failed at step 1" in extras["keyshot_error"][1]
        assert extras["miniwob_reward"] == [0.0, None, 0.0]  # a noop does not do the task
        assert pool.replaced == 1 and dead not in pool.browsers() and dead.process is None

        # a page that does not open (its worker stops answering): that episode fails, the run goes on
        def stall_the_second(i, env):
            if i == 1:
                env.browser = pool.acquire()
                env.browser.timeout_s = 2
                os.kill(env.browser.process.pid, signal.SIGSTOP)

        rewards, metrics, extras = batch(20, sabotage=stall_the_second)
        assert [r is None for r in rewards] == [False, True, False] and metrics[
            "keyshot/failed"
        ] == pytest.approx(1 / 3)
        assert "the page did not open" in extras["keyshot_error"][1]
        assert "no answer in 2 s" in extras["keyshot_error"][1]

        rewards, metrics, _ = batch(30)  # the next batch is whole again
        assert None not in rewards and metrics["keyshot/failed"] == 0.0
        assert pool.replaced == 2 and pool.max_alive <= 3
        processes = [p for b in pool.browsers() for p in b.processes]
    finally:
        pool.close()
    assert pool.alive == 0 and gone(processes) == []


HOLDER = """
import json, sys, time
from keyshot.env.miniwob.client import MiniWoBBrowser
browser = MiniWoBBrowser("click-test", seed=0)
browser.reset()
print(json.dumps(browser.processes), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_no_chromium_is_left_after_sigterm(live):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(holder.stdout.readline())
        every = pids + chromium_under(pids[0])
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
