"""keyshot's reward through TRL's own released code (trl, the dev extra).

Fast: the reward callables as GRPOTrainer calls them (its keyword arguments, its ``log_metric`` and
``log_extra``), the factories and the environments' constructor settings. Slow: GRPOTrainer steps on the
tiny random Qwen2.5-VL with ``environment_factory`` (an environment recording its episode; TRL's
BrowserGym-style environment, whose tools return screenshots, mixed with a text environment), and
AsyncGRPOTrainer's rollout worker against a vLLM server, which pickles ``reward_funcs`` and
``environment_factory`` into its spawned process and turns None into NaN with a zero advantage. With a
healthy fake judge and a dead one (every call answered 500)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
import os
import pickle
import queue
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import yaml
from PIL import Image

import keyshot.frameworks.trl.reward as reward_trl
from keyshot.env.replay import ReplayBrowser
from keyshot.frameworks.trl.reward import (
    EPISODE_COLUMN,
    NO_IMAGE,
    STEP_REWARDS_COLUMN,
    EpisodeRecorder,
    KeyshotEnvironment,
    TrlRewardError,
    completion_episode,
    completion_reward,
    environment_reward,
    reward_function,
)
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories
from keyshot.reward import RewardModel, logs
from keyshot.reward import shared as reward_shared
from tests.support import paths
from tests.support.reward import OM2W_V1 as FOLDERS
from tests.support.reward import write_config

pytest.importorskip("trl", reason="trl is in the dev extra: pip install -e '.[dev]'")
pytestmark = pytest.mark.usefixtures("no_shared_model")

REPO = paths.REPO
#: the columns every keyshot reward logs per sample through ``log_extra``
EXTRA_COLUMNS = {*logs.SAMPLE_KEYS, "keyshot_error", STEP_REWARDS_COLUMN, EPISODE_COLUMN}


@pytest.fixture
def dead_config(tmp_path):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as server:
        yield write_config(tmp_path / "dead.yaml", server)


@pytest.fixture
def progress_config(tmp_path):
    """The outcome judged key point by key point (each rollout's progress: the fraction met), by a judge
    that needs 1-3 key screenshots per key point, so a rollout can meet some of its key points."""
    with FakeOpenAI(make_judge("evidence")) as server:
        path = write_config(tmp_path / "progress.yaml", server, allow_root=str(tmp_path))
        cfg = yaml.safe_load(path.read_text())
        cfg["pipeline"]["outcome_mode"] = "key_point"
        path.write_text(yaml.safe_dump(cfg))
        yield path


def scored(config: Path, rollouts: list) -> list:
    """RewardModel's results on the rollouts (folders, kept episode files or dicts)."""
    rm = RewardModel.from_config(config)
    try:
        return rm.score_sync([r if isinstance(r, dict) else str(r) for r in rollouts])
    finally:
        rm.close()


def prompt(task: str) -> list[dict]:
    return [{"role": "user", "content": task}]


def column_batch(folders: list[Path], generations: int = 2) -> dict:
    """The keyword arguments GRPOTrainer._calculate_rewards passes: each dataset row repeated per generation."""
    rows = [f for f in folders for _ in range(generations)]
    return {
        "prompts": [prompt(f"task of {f.name}") for f in rows],
        "completions": [[{"role": "assistant", "content": f"answer {i}"}] for i in range(len(rows))],
        "completion_ids": [[1, 2] for _ in rows],
        "trajectory": [str(f) for f in rows],
        "trainer_state": None,
    }


def recorded(log: dict[str, list]):
    """A ``log_metric`` / ``log_extra`` that keeps every value, as TRL's trainer does (a list per key)."""

    def record(key, value):
        log[key].extend(value) if isinstance(value, list) else log[key].append(value)

    return record


# --------------------------------------------------------------------------- environments


class ReplayRecorder(EpisodeRecorder):
    """A recorded trajectory replayed (the dataset's ``trajectory``), one screenshot per click; its settings
    (``keep_dir``) are constructor arguments."""

    def reset(self, **row) -> str:
        self.browser = ReplayBrowser(row["trajectory"])
        page = self.browser.reset()
        self._start_episode(self.browser.task, task_id=self.browser.task_id)
        self._record(page.screenshot)
        return f"Goal: {self.browser.task}"

    def click(self, bid: str) -> str:
        """Click an element on the page.

        Args:
            bid: The id of the element to click.

        Returns:
            The page's text after the click.
        """
        page = self.browser.act(f"click('{bid}')")
        return self._record(page.screenshot, action=f"click('{bid}')", text=page.text)


class ReplayKeyshotEnv(KeyshotEnvironment, ReplayRecorder):
    """The same, owning keyshot's reward (``get_reward``; its config a constructor argument)."""


class BrowserGymStyleEnv:
    """An environment as TRL's BrowserGym example writes it, with no keyshot code: ``reset`` returns the goal
    and the page's text, each tool the page after the action as an image and its text (a recorded trajectory
    replayed stands in for BrowserGym; past its last page a click raises, which TRL answers as an error)."""

    def reset(self, **row) -> str:
        self.browser = ReplayBrowser(row["trajectory"])
        page = self.browser.reset()
        return f"Goal: {self.browser.task}\n\nPage structure:\n{page.text[:200]}"

    def click(self, bid: str) -> list:
        """Click one element of the page.

        Args:
            bid: the element's id in the page's text.

        Returns:
            The page after the click, as an image and its text.
        """
        page = self.browser.act(f"click('{bid}')")
        return [{"type": "image", "image": page.image(56)}, {"type": "text", "text": page.text[:200]}]


class CounterEnv:
    """A text environment beside the browser in a dict ``environment_factory``."""

    def reset(self, **row) -> str:
        self.count = 0
        return "Count to three."

    def add(self, n: int) -> str:
        """Add to the counter.

        Args:
            n: How much to add.

        Returns:
            The count.
        """
        self.count += n
        return str(self.count)


# --------------------------------------------------------------------------- fast: episodes from completions


def shot(color: str) -> Image.Image:
    return Image.new("RGB", (32, 24), color)


def test_completion_episode_holds_the_prompts_task_one_screenshot_per_image_response_and_the_tool_calls():
    goal = "Open the help page of Discogs"
    task_prompt = [  # TRL appends reset()'s text to the last user message (a VLM's content blocks)
        {"role": "system", "content": "You control a browser."},
        {
            "role": "user",
            "content": [{"type": "text", "text": f"Complete the web task.Goal: {goal}\n\nPage: x"}],
        },
    ]
    call = lambda name, **arguments: {"type": "function", "function": {"name": name, "arguments": arguments}}  # noqa: E731
    completion = [
        {"role": "assistant", "content": "The help link.", "tool_calls": [call("click", bid="12")]},
        {
            "role": "tool",
            "name": "click",
            "content": [{"type": "image", "image": shot("red")}, {"type": "text", "text": "p1"}],
        },
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [call("fill", bid="3", text="x"), call("scroll", direction="down")],
        },
        {
            "role": "tool",
            "name": "scroll",
            "content": [{"type": "image", "image": shot("blue")}],
        },  # answered first
        {"role": "tool", "name": "fill", "content": "{'error': 'no element 3'}"},  # an error: no page
        {"role": "assistant", "content": "It is open."},
    ]
    episode = completion_episode(task_prompt, completion)
    assert episode.task == goal and episode.finished and episode.final_answer == "It is open."
    assert [Image.open(p).getpixel((0, 0)) for p in episode.screenshots] == [(255, 0, 0), (0, 0, 255)]
    assert list(episode.actions) == ["click(bid='12')", "scroll(direction='down')", "fill(bid='3', text='x')"]
    assert list(episode.thoughts) == ["The help link.", "", ""] and episode.problem() is None

    # the first page shown by reset() (an image in the prompt) is the first screenshot; the rollout ended on
    # a call that was cut (TRL's max_tool_calling_iterations): no final answer, no action
    first_page = [
        {
            "role": "user",
            "content": [{"type": "image", "image": shot("green")}, {"type": "text", "text": goal}],
        }
    ]
    episode = completion_episode(first_page, completion[:2] + [completion[2]])
    assert len(episode.screenshots) == 2 and list(episode.actions) == ["click(bid='12')"]
    assert episode.final_answer is None and episode.task == goal

    # a completion that shows no page fails the episode, saying what a tool must return
    episode = completion_episode(prompt(goal), [{"role": "assistant", "content": "done"}])
    assert NO_IMAGE in episode.problem()


def test_completion_reward_scores_the_named_browser_environments_and_none_for_the_others(config, judge):
    images = lambda page: [{"type": "image", "image": page}, {"type": "text", "text": "next page"}]  # noqa: E731
    click = {"type": "function", "function": {"name": "click", "arguments": {"bid": "12"}}}
    add = {"type": "function", "function": {"name": "add", "arguments": {"n": 1}}}
    browser = [  # both recorded pages of the first fixture, shown by a click each
        [
            {"role": "assistant", "content": "", "tool_calls": [click]},
            {"role": "tool", "name": "click", "content": images(Image.open(s.path))},
        ]
        for s in ReplayBrowser(FOLDERS[0]).trajectory.screenshots
    ]
    counter = [
        {"role": "assistant", "content": "", "tool_calls": [add]},
        {"role": "tool", "name": "add", "content": "1"},
    ]
    task = ReplayBrowser(FOLDERS[0]).task
    batch = {
        "prompts": [prompt(f"Goal: {task}"), prompt(f"Goal: {task}"), prompt("Count to three.")],
        "completions": [browser[0] + browser[1], browser[0] + browser[1], counter],
        "environment": ["browser", "browser", "counter"],  # TRL passes a dict environment_factory's column
        "trainer_state": None,
    }
    for reward in (completion_reward(config, environment="browser"), completion_reward(config)):
        metrics, extras = defaultdict(list), defaultdict(list)
        rewards = asyncio.run(reward(**batch, log_metric=recorded(metrics), log_extra=recorded(extras)))
        assert rewards[2] is None and rewards[0] == rewards[1] is not None
        assert metrics["keyshot/failed"] == [0.0, 0.0]  # the counter's sample is not a failure: not counted
        assert set(extras) == EXTRA_COLUMNS and all(len(v) == 3 and v[2] is None for v in extras.values())
        assert extras[EPISODE_COLUMN] == [None, None, None]  # not kept
    # the folder's own reward: the episode is the recorded trajectory again
    assert rewards[0] == scored(config, [FOLDERS[0]])[0].reward

    # a browser sample that shows no page is a failure (counted) when its environment is named
    batch["completions"][1] = counter
    metrics = defaultdict(list)
    rewards = asyncio.run(
        completion_reward(config, environment=["browser"])(**batch, log_metric=recorded(metrics))
    )
    assert rewards[1] is None and metrics["keyshot/failed"] == [0.0, 1.0]
    with pytest.raises(TrlRewardError, match="no environment column"):
        asyncio.run(
            completion_reward(config, environment="browser")(
                prompts=batch["prompts"][:1], completions=[counter]
            )
        )
    with pytest.raises(TrlRewardError, match="completions are text, not messages"):
        asyncio.run(completion_reward(config)(prompts=["p"], completions=["c"]))


# --------------------------------------------------------------------------- fast: logs


def test_progress_is_logged_per_sample_so_trls_sum_over_count_is_the_mean_over_samples(
    progress_config, tmp_path
):
    """TRL (GRPOTrainer._generate_and_score_completions) sums every value logged under a key during a batch,
    on every rank, and divides by their count. Two calls of different sizes (two ranks, or two reward
    functions): the logged progress is the mean over the samples that have one, not a mean of two means."""
    trajectories = load_trajectories(synthetic_trajectories(tmp_path / "synthetic", 3, 4))
    rows = [
        {
            "task": f"Open page {i}, find its settings and save the form",
            "screenshots": [str(s.path) for s in t.screenshots],
        }
        for i, t in enumerate(trajectories)
    ]
    rows.append({"task": "Open the page", "screenshots": [str(tmp_path / "missing.png")]})  # no verdict
    calls = [rows[:1], rows[1:]]
    pending: dict[str, list[float]] = defaultdict(list)  # TRL's _pending_metrics of one batch
    reward = reward_function(progress_config, name="keyshot_progress")
    for call in calls:
        columns = {k: [row[k] for row in call] for k in ("task", "screenshots")}
        asyncio.run(
            reward(
                prompts=[prompt(row["task"]) for row in call],
                completions=["done"] * len(call),
                **columns,
                log_metric=recorded(pending),
            )
        )
    per_call = [
        [r.progress for r in scored(progress_config, call) if r.progress is not None] for call in calls
    ]
    samples = [p for call in per_call for p in call]
    assert len(samples) == 3 and len(set(samples)) > 1
    trl_mean = sum(pending["keyshot/progress"]) / len(pending["keyshot/progress"])
    assert trl_mean == pytest.approx(statistics.fmean(samples))
    # a mean per call would be biased here: the call of one sample would weigh as much as the other two
    assert statistics.fmean(statistics.fmean(c) for c in per_call) != pytest.approx(trl_mean)
    assert pending["keyshot/failed"] == [0.0, 0.0, 0.0, 1.0] and pending["keyshot/progress_n"] == [1.0, 2.0]


def test_trl_takes_the_sum_of_the_steps_and_logs_each_steps_reward(config):
    """reward.value step_progress with pipeline.step_rewards: TRL gets each sample's one number, the sum of its
    steps' rewards; the completions table gets the steps' rewards themselves (a list per sample)."""
    import yaml

    cfg = yaml.safe_load(config.read_text())
    cfg["pipeline"]["step_rewards"] = True
    cfg["reward"] = {"value": "step_progress"}
    config.write_text(yaml.safe_dump(cfg))
    metrics: dict[str, list] = defaultdict(list)
    extras: dict[str, list] = defaultdict(list)
    rewards = asyncio.run(
        reward_function(config)(
            **column_batch(FOLDERS, generations=1), log_metric=recorded(metrics), log_extra=recorded(extras)
        )
    )
    steps = extras[STEP_REWARDS_COLUMN]
    assert set(extras) == EXTRA_COLUMNS and len(steps) == len(rewards) == len(FOLDERS)
    for reward, per_step, progress in zip(rewards, steps, extras["keyshot_progress"], strict=True):
        assert reward == pytest.approx(sum(per_step)) == pytest.approx(progress)
    shots = [len(next(load_trajectories(f)).screenshots) for f in FOLDERS]
    assert [len(s) for s in steps] == shots
    assert extras["keyshot_credited_steps"] == [float(sum(x > 0 for x in s)) for s in steps]
    assert len(metrics["keyshot/credited_steps"]) == len(FOLDERS)


def test_extras_have_the_same_columns_every_call_healthy_or_dead(config, dead_config):
    metrics: dict[str, list] = defaultdict(list)
    extras: dict[str, list] = defaultdict(list)
    rewards = {}
    for name, cfg in (("healthy", config), ("dead", dead_config)):
        rewards[name] = asyncio.run(
            reward_function(cfg)(
                **column_batch(FOLDERS, generations=1),
                log_metric=recorded(metrics),
                log_extra=recorded(extras),
            )
        )
        assert set(extras) == EXTRA_COLUMNS and all(
            len(v) == len(extras["keyshot_error"]) for v in extras.values()
        )
    assert all(isinstance(x, float) and not math.isnan(x) for k in logs.SAMPLE_KEYS for x in extras[k])
    # the healthy call is RewardModel's; the dead one is None per sample (TRL: no reward), counted as failed
    assert rewards == {"healthy": [r.reward for r in scored(config, FOLDERS)], "dead": [None, None]}
    assert metrics["keyshot/failed"] == [0.0, 0.0, 1.0, 1.0] and extras["keyshot_failed"] == [
        0.0,
        0.0,
        1.0,
        1.0,
    ]
    assert extras["keyshot_error"][:2] == [None, None] and all(
        "key points" in e for e in extras["keyshot_error"][2:]
    )
    assert extras[EPISODE_COLUMN] == [str(f) for f in FOLDERS] * 2  # a dataset rollout: its folder


def test_dataset_column_rewards_say_once_that_every_group_scores_one_rollout(config, caplog):
    reward = reward_function(config, name="keyshot_reward_constant_groups")
    batch = column_batch(FOLDERS, generations=2)
    with caplog.at_level(logging.WARNING, logger=logs.__name__):
        first = asyncio.run(reward(**batch))
        asyncio.run(reward(**batch))
    warnings = [r.getMessage() for r in caplog.records if r.name == logs.__name__]
    assert len(warnings) == 1, warnings
    assert "keyshot_reward_constant_groups" in warnings[0] and "advantage is zero" in warnings[0]
    assert "completion_reward(config)" in warnings[0] and "Episode per rollout" in warnings[0]
    assert first[0] == first[1] and first[2] == first[3]

    # a rollout per sample (here: the two folders within one prompt's group) says nothing
    mixed = reward_function(config, name="keyshot_reward_mixed_groups")
    batch["trajectory"] = [str(FOLDERS[i % 2]) for i in range(4)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logs.__name__):
        asyncio.run(mixed(**batch))
    assert not [r for r in caplog.records if r.name == logs.__name__]


# --------------------------------------------------------------------------- fast: environments


def test_environment_reward_scores_the_batch_at_once_and_none_for_an_environment_without_episode(
    config, judge
):
    envs = [ReplayRecorder() for _ in range(4)] + [CounterEnv()]
    for i, env in enumerate(envs):
        env.reset(trajectory=str(FOLDERS[i % 2]))
        env.click("12") if isinstance(env, ReplayRecorder) else env.add(1)
    metrics, extras = defaultdict(list), defaultdict(list)
    rewards = asyncio.run(
        environment_reward(config)(
            environments=envs,
            completions=["done"] * 5,
            log_metric=recorded(metrics),
            log_extra=recorded(extras),
        )
    )
    assert [identify_step(r) for r in judge.requests].count("key_points") == 2  # once per task
    assert rewards[0] == rewards[2] and rewards[1] == rewards[3] and None not in rewards[:4]
    assert rewards[4] is None and metrics["keyshot/failed"] == [0.0] * 4  # the counter is not counted
    assert all(len(v) == 5 and v[4] is None for v in extras.values())
    assert all(not env.episode.root.exists() for env in envs[:4])
    assert all(env.episode.final_answer == "done" for env in envs[:4])


def test_environment_settings_are_constructor_arguments_and_pickle_as_a_partial(config, tmp_path):
    kept = tmp_path / "kept"
    factory = functools.partial(ReplayKeyshotEnv, config=config, keep_dir=kept)
    env = pickle.loads(pickle.dumps(factory))()  # AsyncGRPOTrainer's worker gets the factory pickled
    env.reset(trajectory=str(FOLDERS[1]))
    env.click("12")
    reward = asyncio.run(env.get_reward())
    [episode] = sorted(kept.glob("*.jsonl"))
    assert episode.stem == env.episode.id and reward == scored(config, [episode])[0].reward
    assert env.keyshot_config == str(config.resolve())
    # nothing is a class attribute set at run time: the settings live on the instance
    assert not any(hasattr(cls, "keyshot_config") for cls in (KeyshotEnvironment, ReplayKeyshotEnv))
    assert EpisodeRecorder.episode_keep_dir is None and ReplayRecorder().episode_keep_dir is None

    with pytest.raises(TrlRewardError, match="ReplayKeyshotEnv: the reward config .* does not exist"):
        ReplayKeyshotEnv(config=tmp_path / "missing.yaml")


FACTORIES = (reward_function, environment_reward, completion_reward)


def test_one_factory_per_reward_fails_at_construction_with_one_line(config, tmp_path, monkeypatch):
    trl_config = REPO / "configs" / "reward" / "trl.yaml"
    monkeypatch.chdir(REPO)
    reward = environment_reward("configs/reward/trl.yaml")  # as a user writes it: a path, relative
    assert reward.config == str(trl_config) and reward.model is None
    assert pickle.loads(pickle.dumps(reward)).config == str(trl_config) and len(pickle.dumps(reward)) < 1000
    # the rewards are reached through their factories only
    assert {n for n in reward_trl.__all__ if n[0].isupper()} == {
        "EpisodeRecorder",
        "KeyshotEnvironment",
        "TrlRewardError",
    }

    not_config = tmp_path / "other.yaml"
    not_config.write_text("judge: [1, 2]\n")
    wrong = [
        ({"judge": {}}, "is a keyshot reward config path .* not a dict"),
        (tmp_path / "missing.yaml", "does not exist"),
        (tmp_path, "is a folder, not a keyshot reward config file"),
        (not_config, "is not a keyshot reward config"),
    ]
    for factory in FACTORIES:
        for argument, message in wrong:
            with pytest.raises(TrlRewardError, match=message) as raised:
                factory(argument)
            assert "\n" not in str(raised.value)
    with pytest.raises(TrlRewardError, match="environment= names the browser environments"):
        completion_reward(config, environment=[])
    with pytest.raises(reward_shared.RewardConfigError, match=reward_shared.CONFIG_ENV):
        completion_reward()


def test_rewards_refuse_what_trl_would_score_wrongly(config):
    reward = environment_reward(config)
    with pytest.raises(TrlRewardError, match=r"AsyncGRPOTrainer passes none .*subclass KeyshotEnvironment"):
        asyncio.run(reward(prompts=[prompt("t")], completions=["done"]))  # AsyncGRPOTrainer's call
    env = ReplayKeyshotEnv(config=config)
    env.reset(trajectory=str(FOLDERS[0]))
    with pytest.raises(TrlRewardError, match="already scores through their get_reward"):
        asyncio.run(reward(environments=[env], completions=["done"]))
    with pytest.raises(TrlRewardError, match="no rollout column .* prompt_id"):
        asyncio.run(reward_function(config)(prompts=["p"], completions=["c"], prompt_id=["1"]))


# --------------------------------------------------------------------------- slow: TRL's names and pickling check


@pytest.mark.slow  # importing trl's trainers (torch, transformers) takes seconds
def test_trl_names_the_rewards_and_refuses_a_built_model_at_async_grpos_pickling_check(config, monkeypatch):
    pytest.importorskip("aiohttp", reason="TRL's async rollout worker needs aiohttp (the dev extra)")
    import trl.experimental.async_grpo.async_rollout_worker as worker_module
    from trl.trainer.utils import get_callable_name, is_async_callable

    # TRL's own naming (its log keys) and async detection of the callables
    made = [factory(config) for factory in FACTORIES]
    assert [get_callable_name(r) for r in made] == [
        "keyshot_reward",
        "keyshot_environment_reward",
        "keyshot_completion_reward",
    ]
    assert all(is_async_callable(r) for r in made)

    monkeypatch.setattr(worker_module, "is_vllm_available", lambda: True)  # vLLM runs from its own venv
    rm = RewardModel.from_config(config)
    try:
        worker = worker_module.AsyncRolloutWorker(reward_funcs=[environment_reward(rm)], model_name="policy")
        with pytest.raises(TypeError, match="must be picklable") as raised:
            worker.start()  # TRL pickles the loop's kwargs before it spawns anything
        assert "holds a RewardModel" in str(raised.value.__cause__)
        assert "environment_reward('configs/reward/trl.yaml')" in str(raised.value.__cause__)
        assert worker._process is None
    finally:
        rm.close()


# --------------------------------------------------------------------------- slow: GRPOTrainer


def kept_by_task(config: Path, folder: Path) -> dict[str, list]:
    """Every kept episode with RewardModel's result on it, by task."""
    episodes = sorted(folder.glob("*.jsonl"))
    by_task = defaultdict(list)
    for path, result in zip(episodes, scored(config, episodes), strict=True):
        row = json.loads(path.read_text().splitlines()[0])
        by_task[row["task"]].append((path, row, result))
    return dict(by_task)


@pytest.fixture(scope="module")
def tiny_policy(tmp_path_factory):
    """The tiny random Qwen2.5-VL with TRL's Qwen3-VL chat template (the same special tokens; Qwen2.5-VL's
    own template renders no tool calls, which environment_factory needs)."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import qwen3_vl_chat_template

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    folder = build_tiny_qwen25vl(tmp_path_factory.mktemp("tiny") / "policy")
    processor = AutoProcessor.from_pretrained(folder)
    processor.chat_template = qwen3_vl_chat_template
    return str(folder), processor


def always_calls(processor, call: dict) -> list:
    """``sequence_bias`` (transformers' generation option, through GRPOConfig.generation_kwargs) that makes
    the random policy answer every turn with ``call`` as its tool call: each token of the call is favoured
    after the assistant header and the call's tokens before it."""
    tokenizer = processor.tokenizer
    header = tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    text = f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
    ids = tokenizer.encode(text, add_special_tokens=False)
    return [[header + ids[: i + 1], 100.0] for i in range(len(ids))]


def grpo_step(tmp_path: Path, policy, reward_funcs: list, dataset, environment_factory, **config) -> dict:
    """One GRPOTrainer step (4 samples, 2 per prompt unless ``config`` says otherwise): its log entry."""
    from trl import GRPOConfig, GRPOTrainer

    settings = {
        "per_device_train_batch_size": 4,
        "num_generations": 2,
        "max_completion_length": 16,
        **config,
    }
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        gradient_accumulation_steps=1,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        chat_template_kwargs={"enable_thinking": False},
        **settings,
    )
    model, processor = policy
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        reward_funcs=reward_funcs,
        train_dataset=dataset,
        args=args,
        environment_factory=environment_factory,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer.state.log_history[0]


def replay_dataset():
    from datasets import Dataset

    return Dataset.from_list(
        [{"trajectory": str(f), "prompt": prompt("Complete the web task.")} for f in FOLDERS]
    )


@pytest.mark.slow
def test_grpo_trainer_step_with_a_recording_environment_healthy_and_dead_judge(
    tmp_path, tiny_policy, config, dead_config
):
    import yaml

    kept = tmp_path / "episodes"
    cfg = yaml.safe_load(config.read_text())  # with the rewards per step: TRL's table gets them
    cfg["pipeline"]["step_rewards"] = True
    config.write_text(yaml.safe_dump(cfg))
    healthy = grpo_step(
        tmp_path / "healthy",
        tiny_policy,
        [environment_reward(config)],
        replay_dataset(),
        functools.partial(ReplayRecorder, keep_dir=kept),
        log_completions=True,
    )
    # the trainer logged what RewardModel gives the episodes the environments recorded, and every metric key
    by_task = kept_by_task(config, kept)
    assert sum(len(v) for v in by_task.values()) == 4
    rewards = [result.reward for rows in by_task.values() for _, _, result in rows]
    assert healthy["rewards/keyshot_environment_reward/mean"] == pytest.approx(statistics.fmean(rewards))
    assert {m.metric for m in logs.MEASURES} - {"keyshot/progress", "keyshot/p_success"} <= set(healthy)
    assert healthy["keyshot/failed"] == 0.0
    # TRL's completions table names each row's kept episode
    import pandas as pd

    [table] = (tmp_path / "healthy" / "out" / "completions").glob("*.parquet")
    rows = pd.read_parquet(table)
    assert sorted(rows[EPISODE_COLUMN]) == sorted(p.stem for p in kept.glob("*.jsonl"))
    for _, row in rows.iterrows():
        [result] = scored(config, [kept / f"{row[EPISODE_COLUMN]}.jsonl"])
        assert row["keyshot_environment_reward"] == result.reward
        assert list(row[STEP_REWARDS_COLUMN]) == pytest.approx(result.step_rewards)  # one per screenshot
        assert sum(row[STEP_REWARDS_COLUMN]) == pytest.approx(result.progress)

    dead = grpo_step(
        tmp_path / "dead", tiny_policy, [environment_reward(dead_config)], replay_dataset(), ReplayRecorder
    )
    # no verdict: None per sample, which TRL leaves out (a NaN mean, logged as None; advantage 0), counted by
    # keyshot/failed
    assert dead["keyshot/failed"] == 1.0 and dead["keyshot/judge_calls"] == 0.0
    assert dead["rewards/keyshot_environment_reward/mean"] is None and dead["reward"] is None
    assert (
        "keyshot/progress" not in dead and dead["keyshot/progress_n"] == 0.0 and not math.isnan(dead["loss"])
    )


seen_completions: list[tuple[str, list]] = []


def keep_completions(prompts, completions, environment, **kwargs) -> list[None]:
    """A reward function that gives no reward and keeps what TRL passed it (each sample's environment name
    and completion), to compare with the episodes keyshot judged."""
    seen_completions.extend(zip(environment, completions, strict=True))
    return [None] * len(completions)


@pytest.mark.slow
def test_grpo_trainer_scores_trls_browsergym_style_environment_from_its_completions(
    tmp_path, tiny_policy, progress_config
):
    """A dict environment_factory mixes TRL's BrowserGym-style environment (no keyshot code) with a text
    environment; one line in reward_funcs scores the browser rollouts from their completions, which TRL's
    tool loop filled with the screenshots the tools returned. The random policy is made to call
    click('12') each turn, twice (max_tool_calling_iterations): the first fixture's replay has one page to
    show after its first, so its second click is an error and shows no page."""
    from datasets import Dataset

    kept = tmp_path / "episodes"
    rows = [
        {"trajectory": str(f), "prompt": prompt("Complete the web task."), "environment": "browser"}
        for f in FOLDERS
    ]
    rows.append({"trajectory": "", "prompt": prompt("Count."), "environment": "counter"})
    seen_completions.clear()
    step = grpo_step(
        tmp_path,
        tiny_policy,
        [completion_reward(progress_config, keep_dir=kept), keep_completions],
        Dataset.from_list(rows),
        {"browser": BrowserGymStyleEnv, "counter": CounterEnv},
        per_device_train_batch_size=6,
        max_completion_length=1024,
        max_tool_calling_iterations=2,
        generation_kwargs={
            "sequence_bias": always_calls(tiny_policy[1], {"name": "click", "arguments": {"bid": "12"}})
        },
    )
    browser = [c for env, c in seen_completions if env == "browser"]
    assert len(browser) == 4 and len(seen_completions) == 6

    # each kept episode is a browser completion: the prompt's task, one screenshot per tool response holding
    # an image, the tool calls as actions
    def shown(completion: list) -> tuple[int, tuple]:
        images = sum(m["role"] == "tool" and isinstance(m["content"], list) for m in completion)
        answered = [m for m in completion if m["role"] == "tool"]
        calls = [c for m in completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        return images, tuple(
            f"click(bid={c['function']['arguments']['bid']!r})" for c in calls[: len(answered)]
        )

    by_task = kept_by_task(progress_config, kept)
    assert set(by_task) == {ReplayBrowser(f).task for f in FOLDERS}
    episodes = [(len(r["screenshots"]), tuple(r["actions"])) for rows in by_task.values() for _, r, _ in rows]
    assert (
        Counter(episodes)
        == Counter(shown(c) for c in browser)
        == Counter({(1, ("click(bid='12')",) * 2): 2, (2, ("click(bid='12')",) * 2): 2})
    )

    # the counter's samples are None and not counted; the logged means are over the browser samples
    results = [result for rows in by_task.values() for _, _, result in rows]
    assert step["keyshot/failed"] == 0.0 and step["keyshot/progress_n"] == 4.0
    assert step["rewards/keyshot_completion_reward/mean"] == pytest.approx(
        statistics.fmean(r.reward for r in results)
    )
    assert step["keyshot/progress"] == pytest.approx(statistics.fmean(r.progress for r in results))


# --------------------------------------------------------------------------- slow: AsyncGRPOTrainer's worker


@pytest.mark.slow
def test_async_grpo_rollout_worker_pickles_the_rewards_and_scores_in_its_spawned_child(
    tmp_path, scorer_checkpoint, vllm_server, config, dead_config, monkeypatch
):
    """AsyncGRPOTrainer's rollout worker (the one it builds unless given another), pointed at a vLLM server
    serving the tiny model as the policy: it pickles reward_funcs and environment_factory into its spawned
    child, which generates there, runs the environments, awaits their get_reward and calls the rewards."""
    pytest.importorskip("aiohttp", reason="TRL's async rollout worker needs aiohttp (the dev extra)")
    pytest.importorskip("trl.experimental.async_grpo", reason="this trl has no AsyncGRPOTrainer")
    import trl.experimental.async_grpo.async_rollout_worker as worker_module
    from accelerate.state import PartialState
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    from tests.support.vllm import SERVED_NAME

    monkeypatch.setattr(worker_module, "is_vllm_available", lambda: True)  # vLLM serves from its own venv
    PartialState()  # the trainer's process has its accelerate state before it starts the worker (TRL logs with it)
    tokenizer = AutoTokenizer.from_pretrained(scorer_checkpoint)
    tokenizer.chat_template = qwen3_chat_template
    kept = tmp_path / "episodes"
    worker = worker_module.AsyncRolloutWorker(
        model_name=SERVED_NAME,
        vllm_server_url=vllm_server.root_url,
        dataset=Dataset.from_list(
            [{"trajectory": str(f), "prompt": prompt("Complete the web task.")} for f in FOLDERS]
        ),
        reward_funcs=[reward_function(config), reward_function(dead_config, name="keyshot_dead")],
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        environment_factory=functools.partial(ReplayKeyshotEnv, config=config, keep_dir=kept),
        num_generations=2,
        max_inflight_tasks=4,
        max_tokens=16,
        max_tool_calling_iterations=1,
        child_ready_timeout=300,  # the child imports torch, transformers and trl: slow on a busy machine
    )
    samples = []
    worker.start()
    try:
        while (
            sum(s.group_id < 2 for s in samples) < 4
        ):  # groups finish in any order; later ones may come first
            samples.append(worker.rollout_buffer.get(timeout=180))
    except queue.Empty:
        pytest.fail(f"the rollout worker produced {len(samples)} samples, then none in 180 s")
    finally:
        worker.stop()
    samples = [s for s in samples if s.group_id < 2]
    by_task = {task: {r.reward for _, _, r in rows} for task, rows in kept_by_task(config, kept).items()}
    folder_reward = {
        ReplayBrowser(f).task: r.reward for f, r in zip(FOLDERS, scored(config, FOLDERS), strict=True)
    }
    for sample in samples:
        task = next(t for t in by_task if t in str(sample.prompt))
        # the environment's get_reward scored its own episode in the child, as RewardModel scores it here
        assert {sample.metrics["rewards/ReplayKeyshotEnv"]} == by_task[task]
        # the pickled dataset-column reward scored the row's folder there; the dead one gave None: NaN
        assert sample.metrics["rewards/keyshot_reward"] == folder_reward[task]
        assert math.isnan(sample.metrics["rewards/keyshot_dead"])
        assert sample.advantage == 0.0  # both samples of a group replay one folder: equal rewards
    assert os.listdir(kept)
