"""Live episodes (keyshot.env.miniwob): BrowserGym's MiniWoB tasks in Debian's Chromium, judged by keyshot
against the fake judge and compared with MiniWoB's own reward; the browser pool and budget that keep a
trainer's live pages within the machine, through the TRL example's environment class. The live tests are
in the slow tier, share one prepared set-up, and skip where the browser set-up (make setup-browser) is
missing; the set-up's errors, the budget's arithmetic and refusal, and the scripted agent's reading of a
page are checked without a browser."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from keyshot.env.miniwob.agents import LoopingAgent, ScriptedAgent, StoppingAgent, random_action
from keyshot.env.miniwob.budget import (
    MIB_PER_BROWSER,
    MIB_PER_PAGE,
    MIB_PER_PAGE_1280X720,
    MIB_PER_SESSION_1280X720,
    PAGES_PER_BROWSER,
    BrowserBudget,
    BrowserBudgetError,
    observation_mib,
    page_mib,
)
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.miniwob.setup import CHROMIUM_ENV, MiniWoBError, browser_setup
from keyshot.env.page import Browser, Page
from keyshot.env.play import record_failure, run_episode
from keyshot.env.replay import ReplayBrowser
from keyshot.frameworks.trl.env import MiniWoBEnv, with_miniwob_reward
from keyshot.frameworks.trl.reward import environment_reward
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.reward import Episode, RewardModel
from tests.support import paths
from tests.support.processes import gone
from tests.support.reward import write_config

REPO = paths.REPO
TRL_EXAMPLE = REPO / "examples" / "reward" / "trl_browsergym_grpo.py"
OM2W_V1 = sorted((paths.FIXTURES / "trajectories" / "online_mind2web_v1").iterdir())
PNG = b"\x89PNG\r\n\x1a\n"
ENTER_TEXT = """Goal: Enter "Kasie" into the text field and press Submit.

Page structure:
RootWebArea 'Enter Text Task', focused
\t[14] textbox ''
\t[16] button 'Submit'"""


def test_a_missing_chromium_is_named_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-chromium"))
    with pytest.raises(MiniWoBError) as caught:
        browser_setup()
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "no-chromium") in message
    assert f"from {CHROMIUM_ENV}" in message and "apt-get install chromium" in message


def test_the_set_up_check_ends_through_the_command_layer(tmp_path):
    """``python -m keyshot.env.miniwob``: a set-up that cannot run is one line naming what to do, exit 2."""
    env = {**os.environ, CHROMIUM_ENV: str(tmp_path / "no-chromium")}
    done = subprocess.run(
        [sys.executable, "-m", "keyshot.env.miniwob", "click-button"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("keyshot miniwob: error: ") and "apt-get install chromium" in line


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
    # the step-reward proof's players: one stops before it submits, one repeats its first action
    stopping, looping = StoppingAgent(), LoopingAgent()
    assert [stopping(page) for _ in range(3)] == ["fill('14', 'Kasie')", None, None]
    assert [looping(page) for _ in range(3)] == ["fill('14', 'Kasie')"] * 3


def test_the_replay_is_a_browser_that_closes():
    replay = ReplayBrowser(OM2W_V1[0])
    assert isinstance(replay, Browser) and isinstance(replay.reset(), Page)
    replay.close()
    replay.close()  # idempotent, as every Browser's


def test_the_budget_counts_measured_pages_and_refuses_in_one_line():
    budget = BrowserBudget.for_machine(memory_mib=23_000, reserve_mib=3_000)
    # 20,000 MiB at the measured figures: the most pages that fit, with the Chromium processes holding them
    assert budget.mib_for(budget.max_pages) <= 20_000 < budget.mib_for(budget.max_pages + 1)
    assert budget.max_pages >= 256  # a 24 GB machine holds TRL's BrowserGym example's 256 sessions
    assert budget.max_browsers == -(-budget.max_pages // PAGES_PER_BROWSER)
    budget.require(256, "a batch", "need fewer")  # within the budget: nothing said
    with pytest.raises(BrowserBudgetError) as caught:
        budget.require(1000, "a batch of 1000", "lower X")
    message = str(caught.value)
    assert "\n" not in message and message.endswith(": lower X")
    assert f"a batch of 1000 needs 1000 live MiniWoB pages at once ({budget.mib_for(1000):,} MiB)" in message
    assert (
        f"this machine holds {budget.max_pages} live pages (23,000 MiB available less a 3,000 MiB reserve"
        in message
    )
    assert (
        f"at {MIB_PER_PAGE} MiB a page and {MIB_PER_BROWSER} MiB a Chromium of {PAGES_PER_BROWSER} pages"
        in message
    )
    given = BrowserBudget.for_machine(6)
    assert given.max_pages == 6 and "--max-pages allows 6 live pages" in given.describe()
    with pytest.raises(BrowserBudgetError, match="--max-pages must be at least 1"):
        BrowserBudget.for_machine(0)
    assert BrowserBudget.for_machine(memory_mib=500, reserve_mib=1024).max_pages == 0
    # OpenEnv's 1280x720 pages weigh what was measured at that size: fewer of them fit, still 256+
    openenv = BrowserBudget.for_machine(memory_mib=23_000, reserve_mib=3_000, viewport=(1280, 720))
    assert openenv.mib_per_page == MIB_PER_PAGE_1280X720 > MIB_PER_PAGE
    assert 256 <= openenv.max_pages < budget.max_pages
    assert page_mib((2560, 1440)) > MIB_PER_PAGE_1280X720 == page_mib((800, 600))
    assert BrowserBudget.for_machine().available_mib > 0  # this machine's memory is read


def test_the_openenv_servers_budget_counts_its_own_memory_per_session():
    """keyshot reward env holds each session's last answer beside Chromium's page (its screenshot's array:
    bench/sessions.py). Counted with the page, TRL's 256 sessions at 1280x720 fit a 24 GB machine
    (23,000 MiB available), and are refused at start, with the numbers, where less is free."""
    per_session = observation_mib((1280, 720))
    assert per_session == MIB_PER_SESSION_1280X720 and observation_mib(None) <= 2  # MiniWoB's own small page
    server = BrowserBudget.for_machine(
        memory_mib=23_000, reserve_mib=3_000, viewport=(1280, 720), session_mib=per_session
    )
    assert server.mib_per_page == MIB_PER_PAGE_1280X720 + per_session
    assert server.max_pages >= 256  # the TRL example's defaults
    server.require(256, "keyshot reward env --max-sessions 256", "lower --max-sessions")
    busy = BrowserBudget.for_machine(
        memory_mib=14_000, reserve_mib=3_000, viewport=(1280, 720), session_mib=per_session
    )
    with pytest.raises(BrowserBudgetError, match=r"needs 256 live MiniWoB pages at once \((\d|,)+ MiB\)"):
        busy.require(256, "keyshot reward env --max-sessions 256", "lower --max-sessions")


def test_the_trl_example_refuses_a_generation_batch_beyond_the_budget_before_opening_anything(tmp_path):
    """The example's defaults (4 generations, 32 accumulation steps: TRL's pool holds 128 environments, all
    reset before the first generation) against a budget of 8 pages: one line, exit 2, no browser."""
    pytest.importorskip("miniwob", reason="the browser extra: make setup-browser")
    pytest.importorskip("playwright", reason="the browser extra: make setup-browser")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    argv = [sys.executable, str(TRL_EXAMPLE), "--keyshot-config", str(tmp_path / "unused.yaml")]
    argv += ["--miniwob", "click-button", "--tiny-model", "--train-steps", "1", "--max-pages", "8"]
    argv += ["--output-dir", str(tmp_path / "out")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = [
        line for line in done.stderr.splitlines() if "error" in line.lower()
    ]  # beside a library warning
    assert line.startswith("error: a generation batch of 128 rollouts (per-device batch 4 × ")
    assert "--gradient-accumulation-steps 32) needs 128 live MiniWoB pages at once" in line
    assert "--max-pages allows 8 live pages" in line and "their product is at most 8" in line
    assert "keyshot reward env --miniwob click-button there) and pass its URL as --space-url" in line
    assert not (tmp_path / "out").exists()  # nothing was built: the policy neither
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before


def test_an_episode_records_the_first_page_then_each_action_with_the_page_it_led_to():
    replay = ReplayBrowser(OM2W_V1[1])
    episode = run_episode(replay, lambda page: f"click('{page.step}')")
    shots = [s.path for s in replay.trajectory.screenshots]
    assert [Path(p).stat().st_size for p in episode.screenshots] == [Path(p).stat().st_size for p in shots]
    assert episode.actions == ("click('0')", "click('1')")  # each taken on the page before its screenshot
    episode.discard()


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
        yield write_config(tmp_path_factory.mktemp("live") / "reward.yaml", judge)


def chromium_under(pid: int) -> list[int]:
    """Chromium's processes under ``pid`` (a child that exits while they are listed is not one of them)."""
    found = []
    for p in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            if "chrom" in p.name():
                found.append(p.pid)
    return found


def renderers(process) -> set[int]:
    """The renderer processes of a pool's Chromium (one per browser context's page)."""
    found = set()
    for child in psutil.Process(process.chromium_pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile (a zombie) is no page
            if "--type=renderer" in " ".join(child.cmdline()):
                found.add(child.pid)
    return found


def play(browser, seed: int, task: str = "click-button") -> float | None:
    """A whole scripted episode in ``browser``: MiniWoB's reward (None: the browser failed)."""
    page, agent = browser.reset(seed=seed, task=task), ScriptedAgent()
    while not page.done and (action := agent(page)) is not None:
        page = browser.act(action)
    return browser.reward


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
        processes = browser.processes + chromium_under(browser.processes[0])
    assert gone(processes) == []  # closed: its worker, playwright's driver and Chromium
    [trajectory] = load_trajectories(kept)  # keyshot judge reads the kept episode as it is
    assert trajectory.task == browser.task and len(trajectory.screenshots) == browser.step + 1
    rm = RewardModel.from_config(config)
    try:
        [result] = rm.score_sync([str(episode.jsonl_path)])
    finally:
        rm.close()
    assert result.error is None and result.reward in (0.0, 1.0)


@pytest.mark.slow
def test_many_sessions_share_a_chromium_each_in_a_context_of_its_own_within_the_budget(live):
    """Six sessions on Chromium processes of four pages: two Chromium, every page in a renderer of its own,
    episodes side by side; a seventh lease is refused naming the budget; a session given back is leased
    again; an unknown task is named."""
    environ = dict(os.environ)
    with BrowserPool(BrowserBudget(6, pages_per_browser=4), "click-button", setup=live) as pool:
        sessions = [pool.lease() for _ in range(6)]
        assert pool.processes() == []  # a lease opens nothing
        with pytest.raises(BrowserBudgetError) as caught:
            pool.lease()
        assert "all 6 live pages are leased: --max-pages allows 6 live pages" in str(caught.value)
        with ThreadPoolExecutor(6) as threads:
            rewards = list(threads.map(play, sessions, range(6)))
        assert rewards == [1.0] * 6
        processes = pool.processes()
        assert len(processes) == 2 and pool.launched == 2
        assert sorted(sum(s.process is p for s in sessions) for p in processes) == [2, 4]
        assert all(len(renderers(p)) >= sum(s.process is p for s in sessions) for p in processes)
        # each reset is a new episode in a fresh context of the same Chromium: any task, no launch
        assert [play(sessions[0], seed, task) for seed, task in [(7, "enter-text"), (8, "click-button")]] == [
            1.0,
            1.0,
        ]
        assert sessions[0].episodes == 3 and pool.launched == 2
        sessions[5].close()
        sessions[5].close()  # idempotent
        with pool.lease() as again:
            assert play(again, 9) == 1.0 and again.process in processes
        with pytest.raises(MiniWoBError, match="unknown MiniWoB task 'no-such-task'"):
            sessions[1].reset(task="no-such-task")
        pids = [pid for p in processes for pid in p.pids + chromium_under(p.pids[0])]
    assert gone(pids) == [] and pool.leased == 0
    assert dict(os.environ) == environ  # the set-up reached the workers through their own environment


@pytest.mark.slow
def test_crashed_pages_fail_their_own_episodes_and_a_dead_chromium_only_its_sessions(config, live):
    """Four sessions on two Chromium processes (two pages each). The pages of the first Chromium crash
    mid-episode (their renderers killed): those two episodes fail (reward None with the reason), the two
    others are rewarded, and the next resets open in the same Chromium. The second Chromium killed
    mid-episode: its two sessions' episodes fail, the other two are rewarded; their next resets open in a
    replacement."""
    with BrowserPool(BrowserBudget(4, pages_per_browser=2), "click-button", setup=live) as pool:
        sessions = [pool.lease() for _ in range(4)]
        pages = [s.reset(seed=i) for i, s in enumerate(sessions)]
        first, second = pool.processes()
        on_first = [s.process is first for s in sessions]
        assert sum(on_first) == 2
        for pid in renderers(first):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        episodes = [Episode(s.task, start_url=s.start_url, task_id=s.task_id) for s in sessions]
        for session, episode, page in zip(sessions, episodes, pages, strict=True):
            episode.add_step(page.screenshot)
            action = ScriptedAgent()(page)
            after = session.act(action)
            episode.add_step(after.screenshot, action=action)
            record_failure(episode, after)
            episode.finish(None)
        assert [s.reward is None for s in sessions] == on_first
        # its Chromium lives on, or (its worker wedged by the crashed pages past answer_within_s on a loaded
        # machine) is killed as stuck and replaced: the other Chromium's sessions are untouched either way
        stuck = 0 if first.alive else 1
        assert stuck == 0 or f"no answer in {pool.settings.answer_within_s:g} s" in first.failure
        assert all(s.error.startswith("the browser failed at step 1:") for s in sessions if s.reward is None)
        rm = RewardModel.from_config(config)
        try:
            results = rm.score_sync(episodes)
        finally:
            rm.close()
        assert [r.reward is None for r in results] == on_first
        assert all("the browser failed at step 1" in r.error for r in results if r.reward is None)
        assert [play(s, 10 + i) for i, s in enumerate(sessions)] == [1.0] * 4
        assert pool.replaced == stuck and all(
            s.process is second for s, mine in zip(sessions, on_first, strict=True) if not mine
        )

        pages = [s.reset(seed=20 + i) for i, s in enumerate(sessions)]
        on_first = [s.process is not second for s in sessions]
        os.kill(second.chromium_pid, signal.SIGKILL)
        after = [s.act(ScriptedAgent()(p)) for s, p in zip(sessions, pages, strict=True)]
        assert [a.error is None for a in after] == on_first
        assert [s.reward for s, mine in zip(sessions, on_first, strict=True) if mine] == [1.0, 1.0]
        assert [play(s, 30 + i) for i, s in enumerate(sessions)] == [1.0] * 4  # a replacement serves them
        assert pool.replaced == stuck + 1 and second not in pool.processes() and pool.launched == stuck + 3
        pids = [pid for p in pool.processes() for pid in p.pids] + second.pids
    assert gone(pids) == []


@pytest.mark.slow
def test_a_page_that_crashes_while_its_worker_waits_on_it_fails_at_once_and_alone(live):
    """A renderer that ends while the worker waits on its page (MiniWoB's setup waits in
    ``wait_for_function``; a CDP call has no timeout at all) held the worker, and every page of its Chromium,
    until the wait's timeout or forever: a soak's killed renderer silenced a worker past the client's 60 s
    and failed its other sessions. The worker closes a crashed page at once (tests/framework/worker_crash.py,
    the worker's own classes in its own process): the wait ends in milliseconds, the session's answer says
    its page crashed, and the other page of the same Chromium steps on."""
    driver = paths.FRAMEWORK / "worker_crash.py"
    done = subprocess.run(
        [sys.executable, "-I", str(driver), str(live.chromium)],
        env=live.worker_env(),
        capture_output=True,
        text=True,
        timeout=120,  # the old worker never returns from the CDP call to the crashed page
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["crashed"] and out["waited_s"] < out["timeout_s"] / 4 and "closed" in out["raised"]
    assert out["answer"]["error"].startswith("the page crashed (its renderer ended)")
    assert not out["answer"]["dead"]  # the Chromium lives on
    assert out["other_reward"] == 1.0 and out["other_done"]


@pytest.mark.slow
def test_the_worker_runs_with_the_deadlines_its_settings_give(live):
    """The worker was given half the pool's timeout in milliseconds and waited 3,000 ms for a page's DOM
    whatever the settings: it runs with the session settings' page timeout and DOM wait, and says so."""
    pool = BrowserPool(BrowserBudget(1), "click-test", setup=live, page_timeout_s=7.5, dom_wait_s=1.25)
    with pool, pool.lease() as browser:
        assert browser.reset(seed=1).screenshot.startswith(PNG)
        assert browser.process.worker_deadlines == {"page_timeout_ms": 7500, "dom_wait_ms": 1250}
        expected = SessionSettings(task="click-test", page_timeout_s=7.5, dom_wait_s=1.25)
        assert browser.settings == pool.settings == expected


@pytest.mark.slow
def test_a_chromium_that_stops_answering_fails_its_sessions_and_is_replaced(live):
    with BrowserPool(BrowserBudget(2, pages_per_browser=1), "click-button", setup=live) as pool:
        stuck, fine = pool.lease(), pool.lease()
        pages = [stuck.reset(seed=1), fine.reset(seed=2)]
        # (a launch on a loaded machine takes longer: set once it is up)
        stuck.process.settings = stuck.process.settings.with_changes(answer_within_s=3, page_timeout_s=2)
        os.kill(stuck.process.pids[0], signal.SIGSTOP)  # its worker stops answering
        failed = stuck.act(ScriptedAgent()(pages[0]))
        assert "no answer in 3 s (the browser process was stopped)" in failed.error and stuck.reward is None
        assert fine.act(ScriptedAgent()(pages[1])).error is None and fine.reward == 1.0
        assert play(stuck, 3) == 1.0 and pool.replaced == 1


@pytest.mark.slow
def test_a_chromium_that_dies_under_a_silent_worker_fails_its_sessions_within_seconds(live):
    # a worker stuck in a playwright call that never returns once its Chromium is killed (seen in the
    # soak) cannot say so: the waiting request sees Chromium's end itself, not after the deadline
    with BrowserPool(BrowserBudget(1), "click-button", setup=live) as pool:
        browser = pool.lease()
        page = browser.reset(seed=1)
        process = browser.process
        os.kill(process.pids[0], signal.SIGSTOP)  # the worker says nothing from now on
        os.kill(process.chromium_pid, signal.SIGKILL)
        started = time.monotonic()
        failed = browser.act(ScriptedAgent()(page))
        assert (
            time.monotonic() - started < 15
            and process.settings.answer_within_s == SessionSettings().answer_within_s
        )
        assert "the browser (Chromium) died (its worker did not answer)" in failed.error
        assert not process.alive and play(browser, 1) == 1.0 and pool.replaced == 1


@pytest.mark.slow
def test_a_browser_idle_longer_than_its_timeout_is_not_taken_for_stuck_by_its_next_request(live):
    # the silence that counts is since the request was sent (or the worker's last answer): a worker idle
    # for longer than its timeout (TRL steps 256 sessions one at a time) was killed by a slow next request
    with BrowserPool(BrowserBudget(1), "click-button", setup=live) as pool:
        browser = pool.lease()
        browser.reset(seed=1)
        browser.process.settings = browser.process.settings.with_changes(
            answer_within_s=8.0, page_timeout_s=5.0
        )
        time.sleep(8.5)  # idle past the timeout
        page = browser.act("noop(wait_ms=5500)")  # answered after the first look at the silence (5 s)
        assert page.error is None and browser.process.alive and pool.replaced == 0


@pytest.mark.slow
def test_a_page_given_back_by_many_threads_at_once_frees_its_place_once(live):
    """Four sessions in one Chromium of four pages, each closed by eight threads at the same moment (a
    barrier), two rounds, with a thread spinning beside them at a 0.1 ms switch interval: each session
    is given back once, the Chromium's count of its pages goes back to 0 (not below: a page given back
    twice would free a second place, and that Chromium would then be handed more pages than its budget),
    and the next round's four pages fit in the same Chromium again."""
    stop, interval = threading.Event(), sys.getswitchinterval()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    spinning = threading.Thread(target=spin, daemon=True)
    sys.setswitchinterval(1e-4)
    spinning.start()
    try:
        with BrowserPool(BrowserBudget(4, pages_per_browser=4), "click-button", setup=live) as pool:
            for round_ in range(2):
                sessions = [pool.lease() for _ in range(4)]
                with ThreadPoolExecutor(4) as threads:
                    list(threads.map(MiniWoBBrowser.reset, sessions, [round_] * 4))
                [chromium] = pool.processes()
                assert pool.pages() == {chromium: 4}
                closers = [s for s in sessions for _ in range(8)]
                barrier = threading.Barrier(len(closers))

                def close(session, barrier=barrier):
                    barrier.wait()
                    session.close()

                with ThreadPoolExecutor(len(closers)) as threads:
                    list(threads.map(close, closers))
                assert pool.pages() == {chromium: 0} and pool.leased == 0
                assert pool.given_back == 4 * (round_ + 1)
            assert pool.launched == 1 and pool.max_leased == 4
    finally:
        stop.set()
        spinning.join()
        sys.setswitchinterval(interval)


def trl_reward(config):
    """keyshot's reward over environments with MiniWoB's beside it, as GRPOTrainer calls it; (rewards,
    metrics, extras), each metric the mean of the values logged under its name, as TRL logs it."""
    reward = with_miniwob_reward(environment_reward(config))

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
def test_trl_environments_lease_their_pages_and_a_dead_page_fails_one_episode_not_the_run(config, live):
    """TRL's way: a pool of environments (the factory a partial with the pool), reset one after another,
    acted in, rewarded together, reset again for the next batch. Each environment leases a page at reset
    and gives it back at its reward; a page that dies fails its episode (reward None with the reason,
    counted in keyshot/failed); a batch beyond the budget fails the episodes it cannot hold; the next
    batch is whole again."""
    pool = BrowserPool(BrowserBudget(3, pages_per_browser=1), "click-button", setup=live)
    factory = functools.partial(MiniWoBEnv, pool=pool, max_steps=5)
    envs = [factory() for _ in range(3)]
    score = trl_reward(config)
    try:
        assert pool.processes() == [] and pool.leased == 0  # constructing opens nothing (TRL probes one)

        def batch(first_seed: int, sabotage=None) -> tuple[list, dict, dict]:
            texts = [
                env.reset(miniwob_task="click-button", seed=first_seed + i, prompt=[])
                for i, env in enumerate(envs)
            ]
            if sabotage is not None:
                sabotage()
            for env, text in zip(envs, texts, strict=True):
                action = None if env.done else ScriptedAgent()(Page(text, None, 0, False))
                if action is not None:
                    env.click(action.split("'")[1])
            return score(envs)

        rewards, metrics, extras = batch(0)
        assert None not in rewards and metrics["keyshot/failed"] == 0.0
        assert extras["miniwob_reward"] == [1.0, 1.0, 1.0] and metrics["miniwob/compared"] == 3.0
        assert pool.leased == 0 and len(pool.processes()) == 3  # given back; the Chromium stay for the next

        def kill_the_second_page():
            for pid in renderers(envs[1]._browser.process):  # its Chromium holds its page alone
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        rewards, metrics, extras = batch(10, sabotage=kill_the_second_page)
        assert [r is None for r in rewards] == [False, True, False]
        assert metrics["keyshot/failed"] == pytest.approx(1 / 3)
        assert "the browser failed at step 1" in extras["keyshot_error"][1]
        assert extras["miniwob_reward"] == [1.0, None, 1.0]

        extra = factory()  # a fourth environment beyond the budget of 3: its episode fails, said
        text = [
            env.reset(miniwob_task="click-button", seed=40 + i, prompt=[])
            for i, env in enumerate([*envs, extra])
        ][-1]
        assert extra.done and "all 3 live pages are leased" in text
        rewards, metrics, extras = score([*envs, extra])
        assert rewards[-1] is None and "all 3 live pages are leased" in extras["keyshot_error"][-1]

        rewards, metrics, _ = batch(30)  # the next batch is whole again
        assert None not in rewards and metrics["keyshot/failed"] == 0.0
        assert pool.max_leased == 3 and pool.replaced == 0
        pids = [pid for p in pool.processes() for pid in p.pids]
    finally:
        pool.close()
    assert pool.leased == 0 and gone(pids) == []


HOLDER = """
import json, sys, time
from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool
pool = BrowserPool(BrowserBudget(4, pages_per_browser=2), "click-test")
sessions = [pool.lease() for _ in range(4)]
for i, session in enumerate(sessions):
    session.reset(seed=i)
print(json.dumps([pid for p in pool.processes() for pid in p.pids]), flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_no_chromium_is_left_after_sigterm(live):
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        pids = json.loads(holder.stdout.readline())
        every = pids + [pid for worker in pids[::2] for pid in chromium_under(worker)]
        assert len(pids) == 4 and len(every) >= 10  # 2 workers, their Chromium and its helpers, 4 renderers
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
