"""The runnable RL examples (examples/reward/) and the replay stand-in environment they share, against
the fake judge: each run as a user runs it, its rewards equal to RewardModel's on the same folders."""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keyshot.env.replay import ReplayBrowser, ReplayError
from keyshot.frameworks.trl.reward import environment_reward
from keyshot.infer.testing.fake_openai import identify_step
from keyshot.reward import RewardModel
from keyshot.reward import shared as reward_shared
from tests.support import paths

pytestmark = pytest.mark.usefixtures("no_shared_model")

REPO = paths.REPO
EXAMPLES = REPO / "examples" / "reward"
OM2W_V1 = sorted((paths.FIXTURES / "trajectories" / "online_mind2web_v1").iterdir())


def load_by_path(path: Path, name: str):
    """As OpenRLHF loads ``--train.agent_func_path`` (and verl ``custom_reward_function.path``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def on_failure() -> str:
    """A failed call is a counted 0 in this module's configs (OpenRLHF needs a number)."""
    return "zero"


def folder_rewards(config: Path, folders: list[Path]) -> list[float | None]:
    rm = RewardModel.from_config(config)
    try:
        return [r.reward for r in rm.score_sync([str(f) for f in folders])]
    finally:
        rm.close()


def test_replay_shows_one_screenshot_per_step_until_the_last():
    browser = ReplayBrowser(OM2W_V1[1])
    shots = [s.path for s in browser.trajectory.screenshots]
    pages = [browser.reset()]
    while not pages[-1].done:
        pages.append(browser.act("click('12')"))
    assert [p.screenshot for p in pages] == shots and [p.step for p in pages] == [0, 1, 2]
    assert pages[-1].answer == browser.trajectory.final_answer and pages[0].answer is None
    assert pages[0].image(64).size[0] == 64 and browser.task in pages[0].text
    with pytest.raises(ReplayError, match="the replay is over"):
        browser.act("click('12')")
    assert browser.reset().step == 0


def test_trl_example_environment_records_what_the_folder_holds(config):
    example = load_by_path(EXAMPLES / "trl_browsergym_grpo.py", "trl_browsergym_grpo")
    env_cls = example.ReplayEnv
    # TRL offers every public function of the environment class to the policy as a tool
    tools = {name for name, _ in inspect.getmembers(env_cls, inspect.isfunction) if not name.startswith("_")}
    assert tools == {"reset", "click", "fill", "send_keys", "scroll", "noop"}
    envs = [env_cls() for _ in range(4)]
    for i, env in enumerate(envs):
        env.reset(trajectory=str(OM2W_V1[i % 2]), prompt=example.prompt("task"))
        while not env.done:
            content = env.click("12")
        assert [c["type"] for c in content] == ["image", "text"]
    rm = RewardModel.from_config(config)
    metrics, extras = {}, {}
    rewards = asyncio.run(
        environment_reward(rm)(  # as GRPOTrainer._calculate_rewards calls an async reward function
            prompts=[example.prompt("task") for _ in envs],
            completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
            completion_ids=[[1, 2] for _ in envs],
            trajectory=[str(OM2W_V1[i % 2]) for i in range(4)],
            trainer_state=None,
            log_extra=extras.__setitem__,
            log_metric=metrics.__setitem__,
            environments=envs,
        )
    )
    rm.close()
    assert rewards == folder_rewards(config, [OM2W_V1[i % 2] for i in range(4)])
    assert metrics["keyshot/failed"] == 0.0 and extras["keyshot_error"] == [None] * 4


def test_openrlhf_agent_file_loaded_by_path_and_driven_until_done(config, judge, monkeypatch):
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(config))
    agent_file = load_by_path(EXAMPLES / "openrlhf_agent.py", "agent_func")
    labels = [str(OM2W_V1[0]), str(OM2W_V1[1]), str(OM2W_V1[1])]

    async def rollout(label: str) -> tuple[dict, list[dict]]:
        agent = agent_file.AgentInstance()
        reset = await agent.reset({"observation": "<|im_start|>user\nGo<|im_end|>\n", "label": label})
        steps = []
        while not steps or not steps[-1]["done"]:
            states = {"observation_text": "", "action_text": "click('12')", "label": label}
            steps.append(await agent.step(states, sampling_params=None))
        return reset, steps

    async def batch():
        return await asyncio.gather(*(rollout(label) for label in labels))

    runs = asyncio.run(batch())
    for label, (reset, steps) in zip(labels, runs, strict=True):
        assert reset["observation"].startswith("<|im_start|>user") and "Page 1 of" in reset["observation"]
        assert len(steps) == len(ReplayBrowser(label).trajectory.screenshots) - 1
        assert all(s["rewards"].item() == 0.0 and len(s["environment_images"]) == 1 for s in steps[:-1])
        assert steps[-1]["extra_logs"]["keyshot_failed"].tolist() == [0.0]
    assert [identify_step(r) for r in judge.requests].count("key_points") == 2  # once per task
    finals = [steps[-1]["rewards"].item() for _, steps in runs]
    assert finals == folder_rewards(config, [Path(label) for label in labels])


def test_openrlhf_agent_file_runs_as_a_script(config):
    env = {**os.environ, reward_shared.CONFIG_ENV: str(config)}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "openrlhf_agent.py"), *map(str, OM2W_V1)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert [r["reward"] for r in out] == folder_rewards(config, OM2W_V1)
    assert [r["failed"] for r in out] == [0.0, 0.0]
    env.pop(reward_shared.CONFIG_ENV)
    unset = subprocess.run(
        [sys.executable, str(EXAMPLES / "openrlhf_agent.py"), str(OM2W_V1[0])],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert unset.returncode == 1 and "Traceback" not in unset.stderr
    assert unset.stderr.strip().splitlines()[-1].startswith("error: KEYSHOT_REWARD_CONFIG is not set")


def test_verl_example_config_names_verls_keys_and_keyshots_compute_score():
    trainer = yaml.safe_load((REPO / "configs" / "reward" / "verl_trainer.yaml").read_text())
    assert trainer["defaults"] == ["ppo_trainer", "_self_"]
    # verl 0.9's keys (tests/reward/test_verl.py composes the file with verl's own config)
    reward = trainer["reward"]
    assert reward["reward_model"]["enable"] is True and reward["reward_model"]["model_path"]
    function = reward["custom_reward_function"]
    assert function["path"] == "pkg://keyshot.frameworks.verl.reward"  # verl imports the installed module
    module = load_by_path(
        REPO / "frameworks" / "verl" / "reward.py", "custom_module"
    )  # or loads the file by path
    assert inspect.iscoroutinefunction(getattr(module, function["name"]))
    assert not inspect.iscoroutinefunction(module.compute_score_sync)  # for verl's remote manager
    manager = reward["reward_manager"]  # verl's naive one, reading an agent loop's episode after the batch
    assert manager["source"] == "importlib" and manager["module"]["path"] == function["path"]
    assert module.MANAGERS[manager["name"]] == "naive"
    assert list(inspect.signature(getattr(module, function["name"])).parameters)[:6] == [
        "data_source",
        "solution_str",
        "ground_truth",
        "extra_info",
        "reward_router_address",
        "reward_model_tokenizer",
    ]
    keyshot = yaml.safe_load((REPO / "configs" / "reward" / "verl.yaml").read_text())
    assert keyshot["reward"]["on_failure"] == "zero" and keyshot["scorer"]["endpoint"]["base_url"]
    assert (REPO / function["reward_kwargs"]["keyshot_config"]).is_file()


def run_trl_example(
    tmp_path: Path, config: Path, *source: str, summary_out: dict | None = None
) -> tuple[dict, list[Path]]:
    """One GRPO step of the TRL example on the tiny model (as docs/reward.md runs it): the last log entry
    and the kept episodes (``summary_out`` gets the run's whole printed summary)."""
    pytest.importorskip("trl", reason="trl is in the dev extra: pip install -e '.[dev]'")
    kept = tmp_path / "episodes"
    argv = [
        sys.executable,
        str(EXAMPLES / "trl_browsergym_grpo.py"),
        "--keyshot-config",
        str(config),
        *source,
    ]
    argv += [
        "--tiny-model",
        "--train-steps",
        "1",
        "--num-generations",
        "2",
        "--gradient-accumulation-steps",
        "1",
    ]
    argv += [
        "--max-completion-length",
        "32",
        "--output-dir",
        str(tmp_path / "out"),
        "--keep-episodes",
        str(kept),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 1
    if summary_out is not None:
        summary_out.update(summary)
    return summary["log"][0], sorted(kept.glob("*.jsonl"))


@pytest.mark.slow
def test_trl_example_trains_one_grpo_step_on_the_tiny_model(tmp_path, config):
    step, episodes = run_trl_example(tmp_path, config, "--replay", str(OM2W_V1[0].parent))
    assert step["keyshot/failed"] == 0.0
    # the kept episodes are what the reward function scored: RewardModel on them gives the logged mean
    assert len(episodes) == 2
    rewards = folder_rewards(config, episodes)
    assert step["rewards/keyshot_environment_reward/mean"] == pytest.approx(sum(rewards) / len(rewards))


@pytest.mark.slow
def test_trl_example_trains_one_grpo_step_on_live_miniwob_pages(tmp_path, config):
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    import psutil

    from keyshot.env.miniwob.setup import MiniWoBError, browser_setup

    try:
        browser_setup()
    except MiniWoBError as exc:
        pytest.skip(str(exc))
    summary: dict = {}
    step, episodes = run_trl_example(tmp_path, config, "--miniwob", "click-button", summary_out=summary)
    assert step["keyshot/failed"] == 0.0 and step["miniwob/compared"] == 2.0
    assert len(episodes) == 2 and all(e.stem.startswith("miniwob.click-button.") for e in episodes)
    # a generation batch of 2 rollouts: 2 pages leased at once in one Chromium launched ahead (TRL's probe
    # environment leases none), none failed; all closed with the run
    assert summary["pages"]["budget"] >= 2 and summary["pages"]["most_leased"] == 2
    assert summary["browsers"] == {"launched": 1, "most_open": 1, "replaced": 0}
    assert not [p for p in psutil.Process().children(recursive=True) if "chrom" in p.name()]
    rm = RewardModel.from_config(config)
    try:
        results = rm.score_sync([str(e) for e in episodes])
    finally:
        rm.close()
    assert step["rewards/keyshot_environment_reward/mean"] == pytest.approx(
        sum(r.reward for r in results) / len(results)
    )
    # MiniWoB's own reward beside keyshot's: where every episode has the same MiniWoB outcome, the
    # agreement is the fraction of keyshot verdicts saying that outcome
    if step["miniwob/reward"] in (0.0, 1.0):
        said = [bool(r.success) == (step["miniwob/reward"] == 1.0) for r in results]
        assert step["miniwob/agreement"] == pytest.approx(sum(said) / len(said))


@pytest.mark.slow
def test_openrlhf_agent_file_plays_a_live_miniwob_label(tmp_path, config, monkeypatch):
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    from keyshot.env.miniwob.agents import ScriptedAgent
    from keyshot.env.miniwob.setup import MiniWoBError, prepare_browser

    try:
        prepare_browser()
    except MiniWoBError as exc:
        pytest.skip(str(exc))
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(config))
    agent_file = load_by_path(EXAMPLES / "openrlhf_agent.py", "agent_func")
    monkeypatch.setattr(agent_file.AgentInstance, "keep_dir", str(tmp_path / "kept"))
    label = "miniwob:click-button:1"

    async def rollout():
        agent = agent_file.AgentInstance()
        reset = await agent.reset({"observation": "<|im_start|>user\nGo<|im_end|>\n", "label": label})
        script, steps = ScriptedAgent(), []
        while not steps or not steps[-1]["done"]:
            states = {"observation_text": "", "action_text": script(agent.page), "label": label}
            steps.append(await agent.step(states, sampling_params=None))
        return agent, reset, steps

    agent, reset, steps = asyncio.run(rollout())
    assert "Goal: " in reset["observation"] and agent.browser.reward == 1.0  # MiniWoB: done right
    assert agent.browser.process is None  # the browser closed with the episode
    [kept] = sorted((tmp_path / "kept").glob("*.jsonl"))
    assert len(agent.episode.screenshots) == 2 and kept.stem.startswith("miniwob.click-button.1")
    assert steps[-1]["extra_logs"]["keyshot_failed"].tolist() == [0.0]
    assert steps[-1]["rewards"].item() == folder_rewards(config, [kept])[0]
