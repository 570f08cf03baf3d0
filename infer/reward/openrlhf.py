"""OpenRLHF: a ``reward_func`` file (``--reward.remote_url FILE.py``), and a base multi-turn agent for
``--train.agent_func_path`` whose final step awaits keyshot's reward.

OpenRLHF loads these files with no arguments: the ``keyshot judge`` config comes from
``$KEYSHOT_REWARD_CONFIG``. OpenRLHF needs a number for every sample, so the config must say what a
failed judge call gives (``reward: {on_failure: zero}``); each such sample is counted in ``extra_logs``
(``keyshot_failed``) and logged, never a silent 0.

A label is a trajectory folder's path, or JSON: ``{"task": ..., "screenshots": [...], ...}`` (a dict
rollout, see :mod:`keyshot.infer.reward.rollouts`) for ``reward_func``; for the agent, the task text or
``{"task": ..., "start_url": ..., "task_id": ...}``.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from keyshot.infer.reward.episode import Episode
from keyshot.infer.reward.model import RewardModel, RewardResult
from keyshot.infer.reward.shared import CONFIG_ENV, RewardConfigError, shared_batcher, shared_model

logger = logging.getLogger(__name__)


def _numbers(values: list[float]) -> Any:
    """A float tensor when torch is installed (OpenRLHF's type), else the list."""
    try:
        import torch
    except ImportError:
        return values
    return torch.tensor(values, dtype=torch.float32)


def require_number_on_failure(rm: RewardModel) -> None:
    if rm.settings.on_failure != "zero":
        raise RewardConfigError(
            f"${CONFIG_ENV} ({rm.cfg.out}): OpenRLHF needs a number for every sample; add "
            "'reward: {on_failure: zero}' to the config so a failed judge call is a counted 0, not a crash"
        )


def label_rollout(label: Any) -> Any:
    """A label as a rollout: a JSON dict rollout, else a trajectory folder's path."""
    if isinstance(label, dict):
        return label
    text = str(label).strip()
    if text.startswith("{"):
        return json.loads(text)
    return text


def extra_logs(results: list[RewardResult]) -> dict[str, Any]:
    return {
        "keyshot_failed": _numbers([float(r.on_failure_applied) for r in results]),
        "keyshot_progress": _numbers([r.progress if r.progress is not None else -1.0 for r in results]),
        "keyshot_judge_calls": _numbers(
            [float(r.calls.get("judge", 0) - r.cached_calls.get("judge", 0)) for r in results]
        ),
    }


def reward_func(queries: list[str], prompts: list[str], labels: list[Any]) -> dict[str, Any]:
    """OpenRLHF's custom reward function: one reward per (query, prompt, label); the label names the
    rollout (see the module docstring)."""
    rm = shared_model()
    require_number_on_failure(rm)
    results = rm.score_sync([label_rollout(label) for label in labels])
    for r in results:
        if r.on_failure_applied:
            logger.warning("keyshot reward: sample %s failed (%s); reward %s", r.id, r.error, r.reward)
    rewards = [float(r.reward) for r in results]
    return {"rewards": _numbers(rewards), "scores": _numbers(rewards), "extra_logs": extra_logs(results)}


@dataclass
class Observation:
    """What the environment shows the policy after a step: text, a screenshot (PIL image, bytes,
    base64 or path), whether the episode is over, and the agent's final answer when it is."""

    text: str
    screenshot: Any = None
    done: bool = False
    answer: str | None = None


class KeyshotAgentInstance(ABC):
    """A base for OpenRLHF's AgentInstance: subclass it and write the environment part only::

        class BrowserAgent(KeyshotAgentInstance):
            async def start(self, label):            # -> (task, first Observation)
                ...
            async def act(self, action_text):        # -> Observation after the action
                ...

    ``reset`` starts an Episode from the label, ``step`` records each screenshot (returned to the policy
    in ``environment_images``) and, at the final step, awaits the reward through the process-wide
    batcher (episodes finishing within a short window share one round of calls).
    """

    keep_dir: str | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        self.episode: Episode | None = None

    @abstractmethod
    async def start(self, label: Any) -> tuple[str | dict, Observation]:
        """Open the environment for ``label``: the task (text, or ``{"task", "start_url", "task_id"}``)
        and the first Observation."""

    @abstractmethod
    async def act(self, action_text: str) -> Observation:
        """Carry out the policy's action; the Observation after it."""

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        require_number_on_failure(shared_model())
        task, obs = await self.start(states.get("label"))
        spec = task if isinstance(task, dict) else {"task": task}
        self.episode = Episode(
            spec["task"], start_url=spec.get("start_url"), task_id=spec.get("task_id"), keep_dir=self.keep_dir
        )
        if obs.screenshot is not None:
            self.episode.add_step(obs.screenshot)
        return {
            "observation": states.get("observation") or obs.text,  # OpenRLHF reads reset(...)["observation"]
            **({"environment_images": [obs.screenshot]} if obs.screenshot is not None else {}),
        }

    async def step(self, states: dict, **kwargs: Any) -> dict:
        if self.episode is None:
            raise RuntimeError("step() before reset(): OpenRLHF calls reset(states) first")
        action = states.get("action_text", "")
        obs = await self.act(action)
        self.episode.actions.append(action)
        self.episode.thoughts.append("")
        if obs.screenshot is not None:
            self.episode.add_step(obs.screenshot)
        out: dict[str, Any] = {
            "environment_feedback": obs.text,
            "environment_images": [obs.screenshot] if obs.screenshot is not None else [],
            "done": obs.done,
            "sampling_params": states.get("sampling_params"),
        }
        if not obs.done:
            return {**out, "rewards": _numbers([0.0]), "scores": _numbers([0.0]), "extra_logs": {}}
        self.episode.finish(obs.answer)
        result = await shared_batcher().score(self.episode)
        if result.on_failure_applied:
            logger.warning(
                "keyshot reward: episode %s failed (%s); reward %s", result.id, result.error, result.reward
            )
        reward = float(result.reward)
        return {
            **out,
            "rewards": _numbers([reward]),
            "scores": _numbers([reward]),
            "extra_logs": extra_logs([result]),
        }
