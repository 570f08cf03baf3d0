"""keyshot's reward inside TRL's GRPOTrainer and AsyncGRPOTrainer (``reward_funcs=[...]``).

- :class:`KeyshotEnvironmentReward`: GRPOTrainer with ``environment_factory`` (one environment per
  rollout, each recording its :class:`Episode` with :class:`EpisodeRecorder`): scores every environment
  of the call at once (key points once per task, all scorer calls of the batch in flight together).
- :class:`KeyshotEnvironment`: an :class:`EpisodeRecorder` whose ``get_reward`` is keyshot's, for
  AsyncGRPOTrainer, which passes no environments to reward functions and asks each environment for its
  reward as its rollout ends.
- :class:`KeyshotReward`: a dataset whose columns hold the rollout (``trajectory``: a folder; ``episode``;
  or ``task`` + ``screenshots``); the completion is only the final answer, which the judge does not read,
  so every sample of a prompt scores the same rollout: it says so at the first call.

The reward callables hold a config path and options only, and build the process-wide RewardModel of that
config (:func:`keyshot.reward.shared.shared_model`) in the process that calls them: they pickle into
AsyncGRPOTrainer's spawned rollout worker. TRL names a reward's log keys after its ``__name__``
(``rewards/keyshot_environment_reward/mean``). Rewards are ``float | None``: TRL takes None as "no reward
for this sample" (left out of the group's baseline, advantage 0), and ``keyshot/failed`` counts them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.reward import logs, shared
from keyshot.reward.episode import Episode
from keyshot.reward.model import RewardModel, RewardResult

__all__ = [
    "EpisodeRecorder",
    "KeyshotEnvironment",
    "KeyshotEnvironmentReward",
    "KeyshotReward",
    "TrlRewardError",
    "completion_text",
    "environment_reward",
    "reward_function",
    "rollout_from_columns",
]

#: The columns :func:`rollout_from_columns` reads a rollout from.
ROLLOUT_COLUMNS = ("episode", "trajectory", "task")
CONSTANT_GROUPS_FIX = (
    "Score each sample's own rollout instead: record an Episode per rollout in an environment_factory "
    "environment (EpisodeRecorder) and pass KeyshotEnvironmentReward (GRPOTrainer), or subclass "
    "KeyshotEnvironment (AsyncGRPOTrainer); docs/reward.md, TRL."
)


class TrlRewardError(KeyshotError):
    """A keyshot reward function was set up or called in a way TRL cannot score."""


def completion_text(completion: Any) -> str:
    """A completion's text: a string, or the last message's content of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        content = completion[-1].get("content", "") if isinstance(completion[-1], dict) else completion[-1]
        if isinstance(content, list):
            return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return str(content)
    return ""


def rollout_from_columns(index: int, completion: Any, columns: dict[str, list]) -> Any:
    """Row ``index`` of the dataset columns as a rollout: ``episode``, ``trajectory`` (a folder), or
    ``task`` with ``screenshots`` (and ``actions``); the completion is the final answer."""
    if "episode" in columns:
        return columns["episode"][index]
    if "trajectory" in columns:
        return columns["trajectory"][index]
    row = {k: columns[k][index] for k in ("task", "screenshots", "actions", "task_id") if k in columns}
    return {**row, "final_answer": completion_text(completion)}


def _digest(value: Any) -> str:
    return hashlib.sha1(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()


def rollout_key(rollout: Any) -> str:
    """What the judge sees of a rollout (everything but the final answer), as a short key."""
    if isinstance(rollout, dict):
        rollout = {k: v for k, v in rollout.items() if k != "final_answer"}
    return _digest(rollout)


class _RewardSource:
    """What keyshot's TRL rewards share: where their RewardModel comes from (a config path, resolved to an
    absolute path here so a spawned process finds it; or a model built by the caller, which cannot be
    pickled) and the scorer endpoint override."""

    def __init__(
        self,
        config: str | os.PathLike | None,
        model: RewardModel | None,
        scorer_url: str | None,
        scorer_model: str | None,
        name: str,
    ):
        if model is not None and config is not None:
            raise TrlRewardError(f"{name}: pass config= or model=, not both")
        self.__name__ = name
        self.config = None if model is not None else shared.config_path(config)
        if self.config is not None and not os.path.isfile(self.config):
            raise TrlRewardError(f"{name}: the reward config {self.config} does not exist (config=...)")
        self.model = model
        self.scorer_url = scorer_url
        self.scorer_model = scorer_model

    def __repr__(self) -> str:
        where = f"config={self.config!r}" if self.config else "model=<RewardModel>"
        return f"{type(self).__name__}({where}, name={self.__name__!r})"

    def __getstate__(self) -> dict[str, Any]:
        if self.model is not None:
            raise TypeError(
                f"{self.__name__} holds a RewardModel built in this process, which cannot be pickled "
                f"(AsyncGRPOTrainer spawns its rollout worker): build it as {type(self).__name__}"
                "(config='configs/reward/trl.yaml') and the worker builds its own"
            )
        return self.__dict__

    async def score(self, rollouts: Sequence[Any]) -> list[RewardResult]:
        """The rollouts' results, in order, from this reward's model (one round for the whole batch)."""
        kw = {"scorer_url": self.scorer_url, "scorer_model": self.scorer_model}
        if self.model is not None:
            return await self.model.score(rollouts, **kw)
        return list(
            await asyncio.gather(*(shared.score_shared(r, config=self.config, **kw) for r in rollouts))
        )

    @staticmethod
    def report(results: list[RewardResult], log_metric: Callable | None, log_extra: Callable | None) -> None:
        """TRL's ``log_metric`` gets :func:`logs.batch_metrics` (the same keys every call, on every rank),
        ``log_extra`` the per-sample fields and each sample's error (None for none: a text column)."""
        if log_metric is not None:
            for name, value in logs.batch_metrics(results).items():
                log_metric(name, value)
        if log_extra is not None:
            for column, values in logs.sample_logs(results).items():
                log_extra(column, values)
            log_extra("keyshot_error", [r.error for r in results])


class KeyshotReward(_RewardSource):
    """A GRPOTrainer / AsyncGRPOTrainer reward function reading each sample's rollout from the dataset
    columns (``rollout(index, completion, columns)``, default :func:`rollout_from_columns`; a function of
    your own must be module-level to pickle)::

        GRPOTrainer(..., reward_funcs=[KeyshotReward(config="configs/reward/trl.yaml")])
    """

    def __init__(
        self,
        config: str | os.PathLike | None = None,
        *,
        model: RewardModel | None = None,
        rollout: Callable[[int, Any, dict], Any] = rollout_from_columns,
        scorer_url: str | None = None,
        scorer_model: str | None = None,
        name: str = "keyshot_reward",
    ):
        super().__init__(config, model, scorer_url, scorer_model, name)
        self.rollout = rollout

    async def __call__(
        self, prompts=None, completions=None, log_metric=None, log_extra=None, **kwargs
    ) -> list[float | None]:
        completions = list(completions or [])
        columns = {k: v for k, v in kwargs.items() if isinstance(v, list) and len(v) == len(completions)}
        if self.rollout is rollout_from_columns and not any(c in columns for c in ROLLOUT_COLUMNS):
            raise TrlRewardError(
                f"{self.__name__}: the dataset has no rollout column ({', '.join(ROLLOUT_COLUMNS)}; it has "
                f"{', '.join(sorted(columns)) or 'none'}): add one, or with environment_factory use "
                "KeyshotEnvironmentReward"
            )
        rollouts = [self.rollout(i, c, columns) for i, c in enumerate(completions)]
        logs.warn_constant_groups(
            [rollout_key(r) for r in rollouts],
            [_digest(p) for p in (prompts or range(len(rollouts)))],
            f"TRL reward function {self.__name__}",
            CONSTANT_GROUPS_FIX,
        )
        results = await self.score(rollouts)
        self.report(results, log_metric, log_extra)
        return [r.reward for r in results]


class KeyshotEnvironmentReward(_RewardSource):
    """A GRPOTrainer reward function over ``environments=[...]`` (``environment_factory``): each
    environment's episode (its attribute ``episode``, or ``episode(env)`` for a module-level function),
    finished with the completion's text when the environment has not finished it, all scored at once::

        GRPOTrainer(..., environment_factory=BrowserEnv,
                    reward_funcs=[KeyshotEnvironmentReward(config="configs/reward/trl.yaml")])
    """

    def __init__(
        self,
        config: str | os.PathLike | None = None,
        *,
        model: RewardModel | None = None,
        episode: str | Callable[[Any], Episode] = "episode",
        scorer_url: str | None = None,
        scorer_model: str | None = None,
        name: str = "keyshot_environment_reward",
    ):
        super().__init__(config, model, scorer_url, scorer_model, name)
        self.episode = episode

    def episode_of(self, env: Any) -> Episode:
        return getattr(env, self.episode) if isinstance(self.episode, str) else self.episode(env)

    async def __call__(
        self, environments=None, completions=None, log_metric=None, log_extra=None, **kwargs
    ) -> list[float | None]:
        if environments is None:
            raise TrlRewardError(
                f"{self.__name__}: called without environments: GRPOTrainer passes them with environment_factory; "
                "AsyncGRPOTrainer passes none to reward functions, so there give the environment keyshot's "
                "get_reward (subclass KeyshotEnvironment) instead of this reward function"
            )
        if any(isinstance(env, KeyshotEnvironment) for env in environments):
            raise TrlRewardError(
                f"{self.__name__}: the environments are KeyshotEnvironments, which TRL already scores through "
                "their get_reward: drop this reward function, or record with EpisodeRecorder instead"
            )
        episodes = [self.episode_of(env) for env in environments]
        for i, ep in enumerate(episodes):
            if isinstance(ep, Episode) and not ep.finished:
                ep.finish(completion_text(completions[i]) if completions else None)
        results = await self.score(episodes)
        self.report(results, log_metric, log_extra)
        return [r.reward for r in results]


def reward_function(
    rm: RewardModel | None = None,
    *,
    config: str | os.PathLike | None = None,
    rollout: Callable[[int, Any, dict], Any] = rollout_from_columns,
) -> KeyshotReward:
    """:class:`KeyshotReward` over a built model ``rm`` (GRPOTrainer; not picklable) or a ``config``."""
    return KeyshotReward(config, model=rm, rollout=rollout)


def environment_reward(
    rm: RewardModel | None = None,
    episode: str | Callable[[Any], Episode] = "episode",
    *,
    config: str | os.PathLike | None = None,
) -> KeyshotEnvironmentReward:
    """:class:`KeyshotEnvironmentReward` over a built model ``rm`` (not picklable) or a ``config``."""
    return KeyshotEnvironmentReward(config, model=rm, episode=episode)


class EpisodeRecorder:
    """Mixin for a TRL environment: ``_start_episode`` in ``reset``, ``_record`` in each tool method::

    def click(self, bid: str) -> str:
        obs = self.browser.click(bid)
        return self._record(obs.screenshot, action=f"click({bid!r})", text=obs.text)

    The names start with ``_`` because TRL exposes every other public method of the environment to the
    policy as a tool.
    """

    episode: Episode | None = None
    episode_keep_dir: str | os.PathLike | None = None

    def _start_episode(self, task: str, start_url: str | None = None, task_id: str | None = None) -> Episode:
        self.episode = Episode(task, start_url=start_url, task_id=task_id, keep_dir=self.episode_keep_dir)
        return self.episode

    def _record(
        self, screenshot: Any, action: str | None = None, thought: str | None = None, text: Any = None
    ):
        """Record the step and return ``text`` (the tool's answer to the policy), else the screenshot."""
        if self.episode is None:
            raise RuntimeError("_record() before _start_episode(task): start the episode in reset()")
        self.episode.add_step(screenshot, action=action, thought=thought)
        return screenshot if text is None else text


class KeyshotEnvironment(EpisodeRecorder):
    """An :class:`EpisodeRecorder` that owns its reward: TRL calls ``get_reward`` once the rollout ends
    (AsyncGRPOTrainer as each rollout finishes; TRL logs it under the class's name). The config is the class
    attribute ``keyshot_config``, else ``$KEYSHOT_REWARD_CONFIG``: set it in the class body or the
    environment, since a spawned rollout worker imports the class afresh (a value assigned at run time
    stays behind). GRPOTrainer awaits ``get_reward`` one environment after another, so there prefer an
    :class:`EpisodeRecorder` with :class:`KeyshotEnvironmentReward`, which scores the batch at once.
    """

    keyshot_config: str | None = None
    keyshot_scorer_url: str | None = None
    keyshot_scorer_model: str | None = None

    async def get_reward(self) -> float | None:
        """This rollout's reward (None: no verdict; the reward log names why)."""
        if self.episode is None:
            raise RuntimeError("get_reward() before _start_episode(task): start the episode in reset()")
        if not self.episode.finished:
            self.episode.finish(None)
        result = await shared.score_shared(
            self.episode,
            config=self.keyshot_config,
            scorer_url=self.keyshot_scorer_url,
            scorer_model=self.keyshot_scorer_model,
        )
        return result.reward
