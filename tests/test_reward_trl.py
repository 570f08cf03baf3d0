"""keyshot's reward through TRL's own released code (trl, the dev extra): GRPOTrainer with
``environment_factory`` on the tiny random Qwen2.5-VL, and AsyncGRPOTrainer's rollout worker, which
pickles ``reward_funcs`` and ``environment_factory`` into a spawned process, scores there with the reward
callables and the environments' ``get_reward``, and turns None into NaN with a zero advantage. Each with
a healthy fake judge and a dead one (every call answered 500)."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing as mp
import os
import pickle
import queue
from collections import defaultdict
from pathlib import Path

import pytest

from keyshot.env.replay import ReplayBrowser
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.reward import RewardModel, logs
from keyshot.reward import shared as reward_shared
from keyshot.reward.trl import (
    EpisodeRecorder,
    KeyshotEnvironment,
    KeyshotEnvironmentReward,
    KeyshotReward,
    TrlRewardError,
    environment_reward,
)

pytest.importorskip("trl", reason="trl is in the dev extra: pip install -e '.[dev]'")

REPO = Path(__file__).resolve().parents[1]
FOLDERS = sorted((REPO / "tests" / "fixtures" / "trajectories" / "online_mind2web_v1").iterdir())
#: where the test environments keep their episodes (read in the process that makes them, spawned or not)
KEEP_ENV = "KEYSHOT_TEST_KEEP_EPISODES"


def write_config(path: Path, server: FakeOpenAI) -> Path:
    """The fake server as judge and scorer; no ``on_failure``, so a failed call is None (TRL's "no reward")."""
    return fake_judge_config(
        path,
        server.base_url,
        {"endpoint": {"base_url": server.base_url, "model": "webjudge-7b", "api_key_env": None}},
        judge={"backoff_base_s": 0.01, "max_retries": 1, "timeout_s": 10},
    )


@pytest.fixture
def judge():
    with FakeOpenAI(make_judge()) as server:
        yield server


@pytest.fixture
def config(tmp_path, judge):
    return write_config(tmp_path / "healthy.yaml", judge)


@pytest.fixture
def dead_config(tmp_path):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as server:
        yield write_config(tmp_path / "dead.yaml", server)


@pytest.fixture(autouse=True)
def no_shared_model(monkeypatch):
    monkeypatch.delenv(reward_shared.CONFIG_ENV, raising=False)
    yield
    reward_shared.reset_shared()


def model_rewards(config: Path, rollouts: list) -> list[float | None]:
    rm = RewardModel.from_config(config)
    try:
        return [r.reward for r in rm.score_sync([str(r) for r in rollouts])]
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


def score_unpickled(blob: bytes, folders: list[str]) -> dict:
    """Run in a spawned process: the reward as TRL's rollout worker receives it (pickled), called there."""
    reward = pickle.loads(blob)
    built_before = dict(reward_shared._models)
    rewards = asyncio.run(reward(**column_batch([Path(f) for f in folders], generations=1)))
    return {"rewards": rewards, "built_before": len(built_before), "built_after": len(reward_shared._models)}


# --------------------------------------------------------------------------- fast: the callables themselves


@pytest.mark.slow
def test_reward_callables_pickle_as_a_config_path_and_score_in_a_spawned_process(config):
    from trl.trainer.utils import get_callable_name, is_async_callable

    reward, env_reward = KeyshotReward(config=config), KeyshotEnvironmentReward(config=config)
    # TRL's own naming (log keys) and async detection for callable instances
    assert [get_callable_name(reward), get_callable_name(env_reward)] == [
        "keyshot_reward",
        "keyshot_environment_reward",
    ]
    assert is_async_callable(reward) and is_async_callable(env_reward)
    blob = pickle.dumps(reward)
    assert len(blob) < 1000 and pickle.loads(pickle.dumps(env_reward)).config == str(config.resolve())
    with mp.get_context("spawn").Pool(1) as pool:
        child = pool.apply(score_unpickled, (blob, [str(f) for f in FOLDERS]))
    # nothing was built before the first call; the child built its own model and scored as RewardModel does
    assert child == {"rewards": model_rewards(config, FOLDERS), "built_before": 0, "built_after": 1}
    assert None not in child["rewards"]


@pytest.mark.slow  # importing trl.experimental (torch) takes seconds
def test_a_reward_holding_a_built_model_is_refused_by_async_grpos_pickling_check(config, monkeypatch):
    import trl.experimental.async_grpo.async_rollout_worker as worker_module

    monkeypatch.setattr(worker_module, "is_vllm_available", lambda: True)  # vLLM is not installed here
    monkeypatch.setattr(worker_module, "is_aiohttp_available", lambda: True)
    rm = RewardModel.from_config(config)
    try:
        worker = worker_module.AsyncRolloutWorker(reward_funcs=[environment_reward(rm)], model_name="policy")
        with pytest.raises(TypeError, match="must be picklable") as raised:
            worker.start()  # TRL pickles the loop's kwargs before it spawns anything
        assert "config='configs/reward/trl.yaml'" in str(raised.value.__cause__)
        assert worker._process is None
    finally:
        rm.close()


def test_dataset_column_rewards_say_once_that_every_group_scores_one_rollout(config, caplog):
    reward = KeyshotReward(config=config, name="keyshot_reward_constant_groups")
    batch = column_batch(FOLDERS, generations=2)
    with caplog.at_level(logging.WARNING, logger=logs.__name__):
        first = asyncio.run(reward(**batch))
        asyncio.run(reward(**batch))
    warnings = [r.getMessage() for r in caplog.records if r.name == logs.__name__]
    assert len(warnings) == 1, warnings
    assert "keyshot_reward_constant_groups" in warnings[0] and "advantage is zero" in warnings[0]
    assert "KeyshotEnvironmentReward" in warnings[0] and "Episode per rollout" in warnings[0]
    assert first[0] == first[1] and first[2] == first[3]

    # a rollout per sample (here: the two folders within one prompt's group) says nothing
    mixed = KeyshotReward(config=config, name="keyshot_reward_mixed_groups")
    batch["trajectory"] = [str(FOLDERS[i % 2]) for i in range(4)]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=logs.__name__):
        asyncio.run(mixed(**batch))
    assert not [r for r in caplog.records if r.name == logs.__name__]


def test_metrics_have_the_same_keys_every_call_healthy_or_dead(config, dead_config):
    metrics: dict[str, list[float]] = defaultdict(list)
    extras: dict[str, list] = defaultdict(list)
    rewards = {}
    for name, cfg in (("healthy", config), ("dead", dead_config)):
        before = set(metrics)
        rewards[name] = asyncio.run(
            KeyshotReward(config=cfg)(
                **column_batch(FOLDERS, generations=1),
                log_metric=lambda k, v: metrics[k].append(v),
                log_extra=lambda k, v: extras[k].extend(v),
            )
        )
        assert not before or set(metrics) == before
    assert set(metrics) == set(logs.batch_metrics([])) and all(len(v) == 2 for v in metrics.values())
    assert set(extras) == {*logs.SAMPLE_KEYS, "keyshot_error"}
    assert all(isinstance(x, float) and not math.isnan(x) for k in logs.SAMPLE_KEYS for x in extras[k])
    # the healthy call is RewardModel's; the dead one is None per sample (TRL: no reward), counted as failed
    assert rewards == {"healthy": model_rewards(config, FOLDERS), "dead": [None, None]}
    assert metrics["keyshot/failed"] == [0.0, 1.0] and extras["keyshot_failed"] == [0.0, 0.0, 1.0, 1.0]
    assert extras["keyshot_error"][:2] == [None, None] and all(
        "key points" in e for e in extras["keyshot_error"][2:]
    )


def test_environment_reward_by_config_scores_the_batch_at_once_key_points_once_per_task(config, judge):
    envs = [ReplayRecorder() for _ in range(4)]
    for i, env in enumerate(envs):
        env.reset(trajectory=str(FOLDERS[i % 2]))
        env.click("12")
    metrics = {}
    rewards = asyncio.run(
        KeyshotEnvironmentReward(config=config)(
            environments=envs, completions=["done"] * 4, log_metric=metrics.__setitem__
        )
    )
    assert [identify_step(r) for r in judge.requests].count("key_points") == 2
    assert rewards[0] == rewards[2] and rewards[1] == rewards[3] and None not in rewards
    assert metrics["keyshot/failed"] == 0.0 and all(not env.episode.root.exists() for env in envs)
    assert all(env.episode.final_answer == "done" for env in envs)


def test_environment_rewards_refuse_what_trl_would_score_wrongly(config, tmp_path):
    reward = KeyshotEnvironmentReward(config=config)
    with pytest.raises(TrlRewardError, match=r"AsyncGRPOTrainer passes none .*subclass KeyshotEnvironment"):
        asyncio.run(reward(prompts=[prompt("t")], completions=["done"]))  # AsyncGRPOTrainer's call
    env = ReplayKeyshotEnv()
    env.reset(trajectory=str(FOLDERS[0]))
    with pytest.raises(TrlRewardError, match="already scores through their get_reward"):
        asyncio.run(reward(environments=[env], completions=["done"]))
    with pytest.raises(TrlRewardError, match="no rollout column .* prompt_id"):
        asyncio.run(KeyshotReward(config=config)(prompts=["p"], completions=["c"], prompt_id=["1"]))
    with pytest.raises(TrlRewardError, match="does not exist"):
        KeyshotReward(config=tmp_path / "missing.yaml")
    with pytest.raises(reward_shared.RewardConfigError, match=reward_shared.CONFIG_ENV):
        KeyshotReward()


# --------------------------------------------------------------------------- environments for the trainers


class ReplayRecorder(EpisodeRecorder):
    """A recorded trajectory replayed (the dataset's ``trajectory``), one screenshot per click."""

    @property
    def episode_keep_dir(self) -> str | None:
        return os.environ.get(KEEP_ENV)

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
    """The same, owning keyshot's reward (``get_reward``; its config: ``$KEYSHOT_REWARD_CONFIG``)."""


def kept_rewards(config: Path, folder: Path) -> dict[str, set]:
    """RewardModel's reward of every kept episode, by task."""
    episodes = sorted(folder.glob("*.jsonl"))
    by_task = defaultdict(set)
    for path, reward in zip(episodes, model_rewards(config, episodes), strict=True):
        by_task[json.loads(path.read_text().splitlines()[0])["task"]].add(reward)
    return dict(by_task)


# --------------------------------------------------------------------------- slow: GRPOTrainer


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


def grpo_step(tmp_path: Path, policy, reward) -> dict:
    """One GRPOTrainer step with environment_factory=ReplayRecorder on both fixture folders (2 samples each)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    dataset = Dataset.from_list(
        [{"trajectory": str(f), "prompt": prompt("Complete the web task.")} for f in FOLDERS]
    )
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=1,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        num_generations=2,
        max_completion_length=16,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        chat_template_kwargs={"enable_thinking": False},
    )
    model, processor = policy
    trainer = GRPOTrainer(
        model=model,
        processing_class=processor,
        reward_funcs=[reward],
        train_dataset=dataset,
        args=args,
        environment_factory=ReplayRecorder,
    )
    trainer.train()
    assert trainer.state.global_step == 1
    return trainer.state.log_history[0]


@pytest.mark.slow
def test_grpo_trainer_step_with_environment_factory_healthy_and_dead_judge(
    tmp_path, tiny_policy, config, dead_config, monkeypatch
):
    kept = tmp_path / "episodes"
    monkeypatch.setenv(KEEP_ENV, str(kept))
    healthy = grpo_step(tmp_path / "healthy", tiny_policy, KeyshotEnvironmentReward(config=config))
    # the trainer logged what RewardModel gives the episodes the environments recorded, and every metric key
    by_task = kept_rewards(config, kept)
    assert len(list(kept.glob("*.jsonl"))) == 4 and all(len(r) == 1 for r in by_task.values())
    expected = [r for rewards in by_task.values() for r in rewards for _ in range(2)]
    assert healthy["rewards/keyshot_environment_reward/mean"] == pytest.approx(sum(expected) / 4)
    assert set(logs.batch_metrics([])) <= set(healthy) and healthy["keyshot/failed"] == 0.0

    monkeypatch.delenv(KEEP_ENV)
    dead = grpo_step(tmp_path / "dead", tiny_policy, KeyshotEnvironmentReward(config=dead_config))
    # no verdict: None per sample, which TRL leaves out (a NaN mean, logged as None; advantage 0), counted by
    # keyshot/failed
    assert set(logs.batch_metrics([])) <= set(dead) and dead["keyshot/failed"] == 1.0
    assert dead["rewards/keyshot_environment_reward/mean"] is None and dead["reward"] is None
    assert dead["keyshot/judge_calls"] == 0.0 and not math.isnan(dead["loss"])


# --------------------------------------------------------------------------- slow: AsyncGRPOTrainer's worker


def scripted_worker_classes() -> tuple[type, type]:
    """TRL's rollout loop with the policy's vLLM server replaced (neither vLLM nor aiohttp runs here): each
    rollout clicks once, then answers. Everything else (environments from the pickled factory, tool calls,
    the environments' ``get_reward``, the pickled reward functions, ``_score_group``) is TRL's own code.
    Built on first use (importing trl.experimental costs seconds), under this module's name so that the
    spawned child unpickles them by reference."""
    import warnings

    if "ScriptedRolloutWorker" in globals():
        return globals()["ScriptedPolicyLoop"], globals()["ScriptedRolloutWorker"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TRLExperimentalWarning
        from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker, _AsyncRolloutLoop

    class ScriptedPolicyLoop(_AsyncRolloutLoop):
        async def _run_loops(self, stop_event: asyncio.Event) -> None:
            await asyncio.gather(
                self._generate_loop(stop_event=stop_event), self._score_loop(stop_event=stop_event)
            )

        async def _generate_one_turn(self, prompt_ids: list[int]) -> tuple[list[int], list[float]]:
            clicked = "<tool_response>" in self.tokenizer.decode(prompt_ids)
            text = (
                "done"
                if clicked
                else '<tool_call>\n{"name": "click", "arguments": {"bid": "12"}}\n</tool_call>'
            )
            ids = self.tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
            return ids, [0.0] * len(ids)

    class ScriptedRolloutWorker(AsyncRolloutWorker):
        _loop_cls = ScriptedPolicyLoop

    for cls in (ScriptedPolicyLoop, ScriptedRolloutWorker):
        cls.__qualname__ = cls.__name__
        globals()[cls.__name__] = cls
    return ScriptedPolicyLoop, ScriptedRolloutWorker


def __getattr__(name: str):  # pickle finds the scripted classes by name in the spawned child
    if name in ("ScriptedPolicyLoop", "ScriptedRolloutWorker"):
        loop_cls, worker_cls = scripted_worker_classes()
        return loop_cls if name == "ScriptedPolicyLoop" else worker_cls
    raise AttributeError(name)


@pytest.mark.slow
def test_async_grpo_rollout_worker_pickles_the_rewards_and_scores_in_its_spawned_child(
    tmp_path, tiny_policy, config, dead_config, monkeypatch
):
    pytest.importorskip("trl.experimental.async_grpo", reason="this trl has no AsyncGRPOTrainer")
    import trl.experimental.async_grpo.async_rollout_worker as worker_module
    from accelerate.state import PartialState
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_chat_template

    monkeypatch.setattr(worker_module, "is_vllm_available", lambda: True)  # the parent's check; no vLLM here
    monkeypatch.setattr(worker_module, "is_aiohttp_available", lambda: True)
    PartialState()  # the trainer's process has its accelerate state before it starts the worker (TRL logs with it)
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(config))  # the environments' reward: a healthy judge
    monkeypatch.setenv(KEEP_ENV, str(tmp_path / "episodes"))
    tokenizer = AutoTokenizer.from_pretrained(tiny_policy[0])
    tokenizer.chat_template = qwen3_chat_template
    dataset = Dataset.from_list(
        [{"trajectory": str(f), "prompt": prompt("Complete the web task.")} for f in FOLDERS]
    )
    _, scripted_worker = scripted_worker_classes()
    worker = scripted_worker(
        model_name="policy",
        dataset=dataset,
        reward_funcs=[KeyshotReward(config=dead_config)],  # the dataset-column reward: a dead judge
        processing_class=tokenizer,
        eos_token_ids=[tokenizer.eos_token_id],
        environment_factory=ReplayKeyshotEnv,
        num_generations=2,
        max_inflight_tasks=4,
        max_tool_calling_iterations=2,
        child_ready_timeout=120,
    )
    samples = []
    worker.start()
    try:
        while (
            sum(s.group_id < 2 for s in samples) < 4
        ):  # groups finish in any order; later ones may come first
            samples.append(worker.rollout_buffer.get(timeout=90))
    except queue.Empty:
        pytest.fail(f"the rollout worker produced {len(samples)} samples in 90 s")
    finally:
        worker.stop()
    samples = [s for s in samples if s.group_id < 2]
    assert len(samples) == 4 and all("click" in str(s.completion) for s in samples)
    by_task = kept_rewards(config, tmp_path / "episodes")
    for sample in samples:
        # the environment's get_reward scored its own episode in the child, as RewardModel scores it here
        task = next(t for t in by_task if t in str(sample.prompt))
        assert {sample.metrics["rewards/ReplayKeyshotEnv"]} == by_task[task]
        # the dead dataset-column reward returned None: NaN in its column, left out of the sum
        assert math.isnan(sample.metrics["rewards/keyshot_reward"])
        assert sample.metrics["reward"] == sample.metrics["rewards/ReplayKeyshotEnv"]
        assert sample.advantage == 0.0  # both samples of a group replay one folder: equal rewards
