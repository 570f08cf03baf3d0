"""keyshot's reward inside TRL's GRPOTrainer and AsyncGRPOTrainer (``reward_funcs=[...]``).

One public factory per reward, each taking a keyshot config path (default ``$KEYSHOT_REWARD_CONFIG``) or a
:class:`RewardModel` you built, and returning a private picklable callable (TRL's own pattern):

- :func:`completion_reward`: GRPOTrainer with any ``environment_factory`` whose tools return the page's
  screenshot as an image content block (TRL's BrowserGym environment as it is): the episode is read from
  the completion's messages (the task from the prompt, one screenshot per tool response holding an image,
  the tool calls as actions).
- :func:`environment_reward`: GRPOTrainer with environments that record their own :class:`Episode`
  (:class:`EpisodeRecorder`): scores every environment of the call at once.
- :func:`reward_function`: a dataset whose columns hold the rollout (``trajectory``: a folder; ``episode``;
  or ``task`` + ``screenshots``); the completion is only the final answer, which the judge does not read,
  so every sample of a prompt scores the same rollout: it says so at the first call.

:class:`KeyshotEnvironment` is an :class:`EpisodeRecorder` whose ``get_reward`` is keyshot's, for
AsyncGRPOTrainer, which passes no environments to reward functions and turns tool results into text.
Settings are constructor arguments (``functools.partial(MyEnv, config=..., keep_dir=...)`` is an
``environment_factory`` that pickles into AsyncGRPOTrainer's spawned rollout worker).

A reward built from a config path holds the absolute path and its options only, and builds the
process-wide RewardModel of that config (:func:`keyshot.reward.shared.shared_model`) in the process that
calls it. TRL names a reward's log keys after its ``__name__`` (``rewards/keyshot_completion_reward/mean``).
Rewards are ``float | None``: TRL takes None as "no reward for this sample" (left out of the group's
baseline, advantage 0); ``keyshot/failed`` counts the samples keyshot could not judge, and a sample that
is not a browser episode (another environment of a dict ``environment_factory``) is None and not counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.reward import logs, shared
from keyshot.reward.episode import Episode, EpisodeRecorder
from keyshot.reward.model import RewardModel, RewardResult, reward_config

__all__ = [
    "EpisodeRecorder",
    "KeyshotEnvironment",
    "TrlRewardError",
    "completion_episode",
    "completion_reward",
    "completion_text",
    "environment_reward",
    "reward_function",
    "rollout_from_columns",
    "task_from_prompt",
]

#: The columns :func:`rollout_from_columns` reads a rollout from.
ROLLOUT_COLUMNS = ("episode", "trajectory", "task")
#: The completions-table column naming each sample's kept episode (its folder and JSONL file name).
EPISODE_COLUMN = "keyshot_episode"
#: The completions-table column of each sample's rewards per step (``pipeline.step_rewards``; None without).
STEP_REWARDS_COLUMN = "keyshot_step_rewards"
CONSTANT_GROUPS_FIX = (
    "Score each sample's own rollout instead: completion_reward(config) with an environment_factory whose "
    "tools return the page's screenshot, or record an Episode per rollout (EpisodeRecorder) and pass "
    "environment_reward(config); docs/reward.md, TRL."
)
NO_IMAGE = (
    "no tool response of the completion holds an image: a tool returns the page as "
    "[{'type': 'image', 'image': screenshot}, {'type': 'text', 'text': ...}] (AsyncGRPOTrainer turns tool "
    "results into text: there, record the episode with KeyshotEnvironment)"
)
GOAL = re.compile(r"Goal:[ \t]*(\S.*)")

RewardSource = str | os.PathLike | RewardModel | None


class TrlRewardError(KeyshotError):
    """A keyshot reward function was set up or called in a way TRL cannot score."""


# --------------------------------------------------------------------------- messages


def _text(content: Any) -> str:
    """The text of a message's content: a string, or its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return "" if content is None else str(content)


def _images(content: Any) -> list[Any]:
    """The images of a message's content blocks (``{"type": "image", "image": ...}``), in order."""
    if not isinstance(content, list):
        return []
    return [p["image"] for p in content if isinstance(p, dict) and p.get("type") == "image" and "image" in p]


def completion_text(completion: Any) -> str:
    """A completion's text: a string, or the last message's content of a conversational completion."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion:
        last = completion[-1]
        return _text(last.get("content", "") if isinstance(last, dict) else last)
    return ""


def _last_user_message(prompt: Any) -> dict | None:
    if isinstance(prompt, list):
        return next((m for m in reversed(prompt) if isinstance(m, dict) and m.get("role") == "user"), None)
    return None


def task_from_prompt(prompt: Any) -> str:
    """The task of a prompt: the rest of the line after ``Goal:`` in its last user message (what TRL's
    BrowserGym environment's ``reset`` appends there), else that message's whole text; a plain-text prompt
    is the task."""
    message = _last_user_message(prompt)
    text = _text(message.get("content")) if message is not None else _text(prompt)
    goal = GOAL.search(text)
    return goal.group(1).strip() if goal else text.strip()


def _call(tool_call: dict) -> tuple[str, str]:
    """A tool call's name and its action text ``name(arg='value', ...)``."""
    function = tool_call.get("function", tool_call)
    name = str(function.get("name", "unknown"))
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return name, f"{name}({arguments})"
    if not isinstance(arguments, dict):
        return name, f"{name}({arguments!r})"
    return name, f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def completion_episode(
    prompt: Any,
    completion: list[dict],
    *,
    keep_dir: str | os.PathLike | None = None,
    task: Callable[[Any], str] = task_from_prompt,
) -> Episode:
    """The finished :class:`Episode` a conversational completion shows (GRPOTrainer's tool loop).

    Its task is ``task(prompt)``; the images of the prompt's last user message (a ``reset`` that returns
    the first page) are its first screenshots; each tool call answered by a tool response is an action
    (the assistant message's text its thought), with that response's last image as the page it led to (a
    response without an image, an error or a text result, is an action without a screenshot); the last
    assistant message without tool calls is the final answer. A completion showing no image fails the
    episode, naming why."""
    episode = Episode(task(prompt), keep_dir=keep_dir)
    first = _last_user_message(prompt)
    for image in _images(first.get("content")) if first is not None else []:
        episode.add_step(image)
    pending: list[tuple[str, str, str]] = []  # (name, action, thought) of calls not answered yet
    answer = None
    for message in completion:
        role = message.get("role")
        if role == "assistant":
            calls = message.get("tool_calls") or []
            thought = _text(message.get("content")).strip()
            pending = [(*_call(c), thought) for c in calls]
            answer = None if calls else thought
        elif role == "tool":
            named = [i for i, (name, _, _) in enumerate(pending) if name == message.get("name")]
            _, action, thought = pending.pop(named[0] if named else 0) if pending else (None, None, None)
            images = _images(message.get("content"))
            episode.add_step(images[-1] if images else None, action=action, thought=thought)
    if not episode.screenshots:
        episode.fail(NO_IMAGE)
    episode.finish(answer)
    return episode


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


# --------------------------------------------------------------------------- logs


def _report(
    rollouts: Sequence[Any],
    results: Sequence[RewardResult | None],
    log_metric: Callable | None,
    log_extra: Callable | None,
) -> None:
    """Log a call's results through TRL's ``log_metric`` and ``log_extra``; a None result is a sample this
    reward does not score.

    TRL averages ``log_metric`` values as the sum over their count, across the calls of a batch and every
    rank, so each metric is logged once per scored sample (``keyshot/failed``, ``keyshot/success``,
    ``keyshot/judge_calls``, ``keyshot/scorer_calls``) and ``keyshot/progress`` and ``keyshot/p_success``
    once per sample that has one: the logged mean is the mean over the samples, however many each rank or
    call had (a mean per call would weigh a call of one sample like one of a hundred). ``keyshot/progress_n``
    and ``keyshot/p_success_n`` are logged once per call: how many samples of the call had one.
    ``log_extra`` gets the per-sample fields of :func:`logs.sample_logs`, each sample's error, its rewards
    per step (:data:`STEP_REWARDS_COLUMN`: with ``pipeline.step_rewards``, one per screenshot, else None; TRL
    itself takes the sample's one number, their sum) and its kept episode (:data:`EPISODE_COLUMN`), None
    where the sample is not scored."""
    scored = [r for r in results if r is not None]
    fields = logs.sample_logs(scored)
    if log_metric is not None and scored:
        for metric, value in logs.trainer_metrics(scored):
            log_metric(metric, value)
    if log_extra is not None:
        columns = {
            **fields,
            "keyshot_error": [r.error for r in scored],
            STEP_REWARDS_COLUMN: [r.step_rewards for r in scored],
            EPISODE_COLUMN: [_kept_as(o, r) for o, r in zip(rollouts, results, strict=True) if r is not None],
        }
        for column, values in columns.items():
            each = iter(values)
            log_extra(column, [None if r is None else next(each) for r in results])


def _kept_as(rollout: Any, result: RewardResult) -> str | None:
    """Where a scored rollout lies on disk: a kept episode's id (``KEEP_DIR/<id>.jsonl``), None for an
    episode not kept, else the result's id (a folder's path, a dict's ``id``)."""
    if isinstance(rollout, Episode):
        return rollout.id if rollout.keep_dir is not None else None
    return result.id


# --------------------------------------------------------------------------- the rewards


def _config_file(path: str | os.PathLike | None, where: str) -> str:
    """The absolute path of a readable keyshot reward config (default ``$KEYSHOT_REWARD_CONFIG``)."""
    resolved = shared.config_path(path)
    if not os.path.exists(resolved):
        raise TrlRewardError(f"{where}: the reward config {resolved} does not exist")
    if not os.path.isfile(resolved):
        raise TrlRewardError(f"{where}: {resolved} is a folder, not a keyshot reward config file")
    try:
        reward_config(resolved)
    except (KeyshotError, ValueError) as exc:
        raise TrlRewardError(f"{where}: {resolved} is not a keyshot reward config: {exc}") from None
    return resolved


class _Reward:
    """What keyshot's TRL rewards share: where their RewardModel comes from (a config path, resolved to an
    absolute path here so a spawned process finds it; or a model built by the caller, which cannot be
    pickled), the scorer endpoint override, the name TRL logs it under, and the report of each call."""

    def __init__(self, source: RewardSource, *, scorer_url: str | None, scorer_model: str | None, name: str):
        self.__name__ = name
        if isinstance(source, RewardModel):
            self.model, self.config = source, None
        elif source is None or isinstance(source, (str, os.PathLike)):
            self.model, self.config = None, _config_file(source, name)
        else:
            raise TrlRewardError(
                f"{name}: the first argument is a keyshot reward config path (or a RewardModel), "
                f"not a {type(source).__name__}"
            )
        self.scorer_url = scorer_url
        self.scorer_model = scorer_model

    def __repr__(self) -> str:
        where = repr(self.config) if self.config else "<RewardModel>"
        return f"{self.__name__}({where})"

    def __getstate__(self) -> dict[str, Any]:
        if self.model is not None:
            raise TypeError(
                f"{self.__name__} holds a RewardModel built in this process, which cannot be pickled "
                f"(AsyncGRPOTrainer spawns its rollout worker): build it from the config path, e.g. "
                f"{self._factory}('configs/reward/trl.yaml'), and the worker builds its own"
            )
        return self.__dict__

    _factory = "reward_function"

    async def score(self, rollouts: Sequence[Any]) -> list[RewardResult]:
        """The rollouts' results, in order, from this reward's model (one round for the whole batch)."""
        kw = {"scorer_url": self.scorer_url, "scorer_model": self.scorer_model}
        if self.model is not None:
            return await self.model.score(rollouts, **kw)
        return list(
            await asyncio.gather(*(shared.score_shared(r, config=self.config, **kw) for r in rollouts))
        )

    async def score_and_report(
        self, rollouts: Sequence[Any | None], log_metric: Callable | None, log_extra: Callable | None
    ) -> list[float | None]:
        """Score the rollouts that are not None (a None rollout is a sample this reward does not score),
        report them, and return TRL's rewards (None where there is no verdict or nothing to score)."""
        picked = [r for r in rollouts if r is not None]
        scored = iter(await self.score(picked) if picked else [])
        results = [None if r is None else next(scored) for r in rollouts]
        _report(rollouts, results, log_metric, log_extra)
        return [None if r is None else r.reward for r in results]


class _ColumnReward(_Reward):
    _factory = "reward_function"

    def __init__(self, source: RewardSource, rollout: Callable[[int, Any, dict], Any], **common: Any):
        super().__init__(source, **common)
        name = self.__name__
        if not callable(rollout):
            raise TrlRewardError(f"{name}: rollout= is a function (index, completion, columns) -> rollout")
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
                "completion_reward or environment_reward"
            )
        rollouts = [self.rollout(i, c, columns) for i, c in enumerate(completions)]
        logs.warn_constant_groups(
            [rollout_key(r) for r in rollouts],
            [_digest(p) for p in (prompts or range(len(rollouts)))],
            f"TRL reward function {self.__name__}",
            CONSTANT_GROUPS_FIX,
        )
        return await self.score_and_report(rollouts, log_metric, log_extra)


class _EnvironmentReward(_Reward):
    _factory = "environment_reward"

    def __init__(self, source: RewardSource, episode: str | Callable[[Any], Episode | None], **common: Any):
        super().__init__(source, **common)
        name = self.__name__
        if not (isinstance(episode, str) or callable(episode)):
            raise TrlRewardError(
                f"{name}: episode= is an attribute name or a function (environment) -> Episode"
            )
        self.episode = episode

    def episode_of(self, env: Any) -> Any:
        """The environment's episode; None for an environment that records none (another environment of a
        dict ``environment_factory``)."""
        if isinstance(self.episode, str):
            return getattr(env, self.episode) if hasattr(env, self.episode) else None
        return self.episode(env)

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
        return await self.score_and_report(episodes, log_metric, log_extra)


class _CompletionReward(_Reward):
    _factory = "completion_reward"

    def __init__(
        self,
        source: RewardSource,
        keep_dir: str | os.PathLike | None,
        environment: str | Sequence[str] | None,
        task: Callable[[Any], str],
        **common: Any,
    ):
        super().__init__(source, **common)
        name = self.__name__
        if isinstance(environment, str):
            environment = (environment,)
        if environment is not None and (not environment or not all(isinstance(e, str) for e in environment)):
            raise TrlRewardError(
                f"{name}: environment= names the browser environments of a dict environment_factory"
            )
        if not callable(task):
            raise TrlRewardError(f"{name}: task= is a function (prompt) -> the task text")
        self.keep_dir = None if keep_dir is None else str(keep_dir)
        self.environment = None if environment is None else tuple(environment)
        self.task = task

    def browser_samples(self, prompts: list, completions: list, names: list | None) -> list[bool]:
        """Which samples are browser episodes: those of the named environments; without names, every
        sample of a single environment, and in a dict ``environment_factory`` (TRL passes the dataset's
        ``environment`` column) the samples whose prompt or tool responses show an image."""
        if self.environment is not None:
            if names is None:
                raise TrlRewardError(
                    f"{self.__name__}: environment={list(self.environment)} names environments of a dict "
                    "environment_factory, but the batch has no environment column"
                )
            return [n in self.environment for n in names]
        if names is None:
            return [True] * len(completions)
        return [
            any(_images(m.get("content")) for m in [_last_user_message(p) or {}, *c] if isinstance(m, dict))
            for p, c in zip(prompts, completions, strict=True)
        ]

    async def __call__(
        self, prompts=None, completions=None, log_metric=None, log_extra=None, **kwargs
    ) -> list[float | None]:
        completions = list(completions or [])
        prompts = list(prompts or [None] * len(completions))
        if completions and not all(isinstance(c, list) for c in completions):
            raise TrlRewardError(
                f"{self.__name__}: the completions are text, not messages: the episode is read from a "
                "conversational completion's tool calls and tool responses (a conversational prompt column "
                "and an environment_factory or tools)"
            )
        browser = self.browser_samples(prompts, completions, kwargs.get("environment"))

        def read() -> list[Episode | None]:
            return [
                completion_episode(p, c, keep_dir=self.keep_dir, task=self.task) if b else None
                for p, c, b in zip(prompts, completions, browser, strict=True)
            ]

        episodes = await asyncio.to_thread(read)  # the screenshots are written off TRL's reward loop
        return await self.score_and_report(episodes, log_metric, log_extra)


def reward_function(
    source: RewardSource = None,
    *,
    rollout: Callable[[int, Any, dict], Any] = rollout_from_columns,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
    name: str = "keyshot_reward",
) -> _ColumnReward:
    """A GRPOTrainer / AsyncGRPOTrainer reward reading each sample's rollout from the dataset columns
    (``rollout(index, completion, columns)``, default :func:`rollout_from_columns`; a function of your own
    must be module-level to pickle)::

        GRPOTrainer(..., reward_funcs=[reward_function("configs/reward/trl.yaml")])

    ``source``: a keyshot config path (default ``$KEYSHOT_REWARD_CONFIG``) or a RewardModel you built
    (GRPOTrainer only: a built model cannot be pickled)."""
    return _ColumnReward(source, rollout, scorer_url=scorer_url, scorer_model=scorer_model, name=name)


def environment_reward(
    source: RewardSource = None,
    *,
    episode: str | Callable[[Any], Episode | None] = "episode",
    scorer_url: str | None = None,
    scorer_model: str | None = None,
    name: str = "keyshot_environment_reward",
) -> _EnvironmentReward:
    """A GRPOTrainer reward over ``environments=[...]`` (``environment_factory``): each environment's
    episode (its attribute ``episode``, or ``episode(env)`` for a module-level function), finished with the
    completion's text when the environment has not finished it, all scored at once; an environment without
    one (another environment of a dict ``environment_factory``) gets None, not counted::

        GRPOTrainer(..., environment_factory=BrowserEnv,
                    reward_funcs=[environment_reward("configs/reward/trl.yaml")])
    """
    return _EnvironmentReward(source, episode, scorer_url=scorer_url, scorer_model=scorer_model, name=name)


def completion_reward(
    source: RewardSource = None,
    *,
    keep_dir: str | os.PathLike | None = None,
    environment: str | Sequence[str] | None = None,
    task: Callable[[Any], str] = task_from_prompt,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
    name: str = "keyshot_completion_reward",
) -> _CompletionReward:
    """A GRPOTrainer reward that reads each sample's episode from its completion (:func:`completion_episode`):
    the environment needs no keyshot code, only tools that return the page's screenshot as an image content
    block, as TRL's BrowserGym environment does::

        GRPOTrainer(..., environment_factory=BrowserGymVLMEnv,
                    reward_funcs=[completion_reward("configs/reward/trl.yaml")])

    ``keep_dir``: keep every episode there (``keyshot judge`` reads it; the completions table's
    ``keyshot_episode`` column names each sample's). ``environment``: with a dict ``environment_factory``,
    the names of its browser environments (the other samples get None, not counted); without it, a sample
    whose prompt and tool responses show no image is taken for another environment's. ``task(prompt)``: the
    task text (default :func:`task_from_prompt`; a function of your own must be module-level to pickle)."""
    return _CompletionReward(
        source, keep_dir, environment, task, scorer_url=scorer_url, scorer_model=scorer_model, name=name
    )


# --------------------------------------------------------------------------- environments


class KeyshotEnvironment(EpisodeRecorder):
    """An :class:`EpisodeRecorder` that owns its reward: TRL calls ``get_reward`` once the rollout ends
    (AsyncGRPOTrainer as each rollout finishes; TRL logs it under the class's name). Its settings are
    constructor arguments: ``config`` (default ``$KEYSHOT_REWARD_CONFIG``), ``keep_dir`` and the scorer
    endpoint override; ``functools.partial(MyEnv, config="configs/reward/trl.yaml")`` is the
    ``environment_factory``, which pickles into AsyncGRPOTrainer's spawned worker. GRPOTrainer awaits
    ``get_reward`` one environment after another, so there prefer :func:`completion_reward` or an
    :class:`EpisodeRecorder` with :func:`environment_reward`, which score the batch at once.
    """

    def __init__(
        self,
        config: str | os.PathLike | None = None,
        *,
        keep_dir: str | os.PathLike | None = None,
        scorer_url: str | None = None,
        scorer_model: str | None = None,
    ):
        super().__init__(keep_dir=keep_dir)
        self.keyshot_config = _config_file(config, type(self).__name__)
        self.keyshot_scorer_url = scorer_url
        self.keyshot_scorer_model = scorer_model

    async def get_reward(self) -> float | None:
        """This rollout's reward (None: no verdict; the reward log names why)."""
        if self.episode is None:
            raise RuntimeError("get_reward() before _start_episode(task): start the episode in reset()")
        if "keyshot_config" not in self.__dict__:
            raise TrlRewardError(
                f"{type(self).__name__}.__init__ did not call KeyshotEnvironment.__init__: pass the settings on "
                "with super().__init__(config=..., keep_dir=...)"
            )
        if not self.episode.finished:
            self.episode.finish(None)
        result = await shared.score_shared(
            self.episode,
            config=self.keyshot_config,
            scorer_url=self.keyshot_scorer_url,
            scorer_model=self.keyshot_scorer_model,
        )
        return result.reward
