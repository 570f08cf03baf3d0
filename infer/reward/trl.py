"""TRL GRPOTrainer reward functions (``reward_funcs=[...]``).

- :func:`reward_function`: for a dataset whose columns hold the rollout (``trajectory``: a folder, or
  ``task`` + ``screenshots``); the completion's text is the final answer.
- :func:`environment_reward`: for ``environment_factory`` training (one environment per rollout):
  scores every environment of the call concurrently (key points once per task across the group, all
  scorer calls of the batch in flight together). Use it rather than the environment's ``get_reward``:
  TRL awaits ``get_reward`` one environment after another, so a judge there runs serially.
- :class:`EpisodeRecorder`: a mixin giving an environment its :class:`Episode` in one line per tool call.

Both functions are async and return ``list[float | None]`` (None: no verdict, see ``on_failure``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from keyshot.infer.reward.episode import Episode
from keyshot.infer.reward.model import RewardModel, RewardResult


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


def _log(results: list[RewardResult], log_metric: Callable | None, log_extra: Callable | None) -> None:
    if log_metric is not None:
        progress = [r.progress for r in results if r.progress is not None]
        log_metric("keyshot/failed", float(sum(r.error is not None for r in results)))
        log_metric(
            "keyshot/judge_calls",
            float(sum(r.calls.get("judge", 0) - r.cached_calls.get("judge", 0) for r in results)),
        )
        if progress:
            log_metric("keyshot/progress", statistics.fmean(progress))
    if log_extra is not None:
        log_extra("keyshot_progress", [r.progress for r in results])
        log_extra("keyshot_p_success", [r.p_success for r in results])
        log_extra("keyshot_error", [r.error for r in results])


def reward_function(rm: RewardModel, *, rollout: Callable[[int, Any, dict], Any] = rollout_from_columns):
    """An async GRPOTrainer reward function reading each rollout from the dataset columns."""

    async def keyshot_reward(
        prompts, completions, log_metric=None, log_extra=None, **kwargs
    ) -> list[float | None]:
        columns = {k: v for k, v in kwargs.items() if isinstance(v, list) and len(v) == len(completions)}
        results = await rm.score([rollout(i, c, columns) for i, c in enumerate(completions)])
        _log(results, log_metric, log_extra)
        return [r.reward for r in results]

    return keyshot_reward


def environment_reward(rm: RewardModel, episode: Callable[[Any], Episode] = lambda env: env.episode):
    """An async GRPOTrainer reward function over ``environments=[...]`` (``environment_factory``)."""

    async def keyshot_environment_reward(
        environments, log_metric=None, log_extra=None, completions=None, **kwargs
    ) -> list[float | None]:
        episodes = [episode(env) for env in environments]
        for i, ep in enumerate(episodes):
            if not ep.finished:
                ep.finish(completion_text(completions[i]) if completions else None)
        results = await rm.score(episodes)
        _log(results, log_metric, log_extra)
        return [r.reward for r in results]

    return keyshot_environment_reward


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
