"""OpenRLHF: a ``reward_func`` file (``--reward.remote_url FILE.py``), and a multi-turn agent base for
``--train.agent_func_path`` whose final step awaits keyshot's reward.

OpenRLHF loads these files by path with no arguments (``spec_from_file_location``, no ``sys.modules``
entry: this module therefore has no ``from __future__ import annotations``, which a dataclass cannot
resolve there), so the ``keyshot judge`` config comes from ``$KEYSHOT_REWARD_CONFIG``. OpenRLHF turns every
reward into a tensor and has no "no reward": the config must say ``reward: {on_failure: zero}``, and each
sample without a verdict is counted in ``extra_logs`` (``keyshot_failed``) and logged, never a silent 0.

``reward_func`` is called once per sample, each call on a thread of its own (``asyncio.to_thread``); the
calls meet in the process-wide model's batches (:func:`~keyshot.reward.shared.score_shared_sync`),
so key points are asked once per task and no call is paid twice.

A label is a trajectory folder's path, or JSON: ``{"task": ..., "screenshots": [...], ...}`` (a dict
rollout, see :mod:`keyshot.reward.rollouts`) for ``reward_func``; for the agent, whatever its
``start`` opens.
"""

import contextvars
import json
import logging
import os
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from keyshot.reward.episode import Episode
from keyshot.reward.logs import sample_logs
from keyshot.reward.model import RewardResult
from keyshot.reward.shared import (
    require_number_on_failure,
    score_shared,
    score_shared_sync,
    shared_model,
)

__all__ = [
    "KeyshotAgentInstance",
    "Observation",
    "keyshot_agent_executor",
    "label_rollout",
    "openrlhf_logs",
    "policy_image",
    "require_number_on_failure",
    "reward_func",
]

logger = logging.getLogger(__name__)

#: The per-sample field an agent adds to :func:`~keyshot.reward.logs.sample_logs`: 1.0 for an
#: episode OpenRLHF stopped at its token budget (no ``done`` step), judged on what it recorded.
UNFINISHED_KEY = "keyshot_unfinished"


def _tensor(values: list[float]) -> Any:
    """A float tensor (OpenRLHF calls ``.item()`` on step rewards and flattens extra logs)."""
    import torch

    return torch.tensor(values, dtype=torch.float32)


def label_rollout(label: Any) -> Any:
    """A label as a rollout: a JSON dict rollout, else a trajectory folder's path (an unreadable label is
    a failed sample, named in its result's error)."""
    if isinstance(label, dict):
        return label
    text = str(label).strip()
    if text.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def openrlhf_logs(results: list[RewardResult], unfinished: bool | None = None) -> dict[str, Any]:
    """``extra_logs`` as OpenRLHF means them per sample: keyshot's log fields as tensors (and, for an
    agent's episode, whether the token budget stopped it)."""
    fields = {key: _tensor(values) for key, values in sample_logs(results).items()}
    if unfinished is not None:
        fields[UNFINISHED_KEY] = _tensor([float(unfinished)] * len(results))
    return fields


def reward_func(queries: list[str], prompts: list[str], labels: list[Any]) -> dict[str, Any]:
    """OpenRLHF's custom reward function: one reward per (query, prompt, label); the label names the
    rollout (see the module docstring)."""
    require_number_on_failure(shared_model(), "OpenRLHF")
    results = score_shared_sync([label_rollout(label) for label in labels])
    rewards = _tensor([float(r.reward) for r in results])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": openrlhf_logs(results)}


@dataclass
class Observation:
    """What the environment shows the policy after a step: text, a screenshot (PIL image, bytes,
    base64 or path), whether the episode is over, and the agent's final answer when it is."""

    text: str
    screenshot: Any = None
    done: bool = False
    answer: str | None = None


def policy_image(screenshot: Any) -> Any:
    """A screenshot as OpenRLHF's ``load_images`` reads it (PIL image, bytes or str): a path becomes its
    text, bytearray bytes."""
    if isinstance(screenshot, os.PathLike):
        return os.fspath(screenshot)
    if isinstance(screenshot, bytearray):
        return bytes(screenshot)
    return screenshot


_warned_first_page: list[bool] = []  # the reset-only warning, once per process
_PREPARED: contextvars.ContextVar = contextvars.ContextVar("keyshot_openrlhf_agent", default=None)


class KeyshotAgentInstance(ABC):
    """A base for OpenRLHF's AgentInstance: subclass it (and OpenRLHF's ``AgentInstanceBase``) and write
    the environment part only::

        class AgentInstance(KeyshotAgentInstance, AgentInstanceBase):
            async def start(self, label):            # -> (task, first Observation)
                ...
            async def act(self, action_text):        # -> Observation after the action
                ...

        AgentExecutor = keyshot_agent_executor(AgentInstance)   # the class OpenRLHF loads

    Each rollout records an Episode: every page's screenshot is written to disk and shown to the policy
    (``environment_images``, the final page's excepted: the episode is over), and at the final step the
    reward is awaited through the process-wide batcher (episodes finishing together share one round of
    calls). :func:`keyshot_agent_executor` also shows the policy the first page (OpenRLHF takes a
    rollout's first images from the dataset only) and judges an episode that OpenRLHF stopped at its
    token budget.
    """

    keep_dir: str | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        self.episode: Episode | None = None
        self.result: RewardResult | None = None

    @abstractmethod
    async def start(self, label: Any) -> tuple[str | dict, Observation]:
        """Open the environment for ``label``: the task (text, or ``{"task", "start_url", "task_id"}``)
        and the first Observation."""

    @abstractmethod
    async def act(self, action_text: str) -> Observation:
        """Carry out the policy's action; the Observation after it."""

    def first_prompt(self, prompt: str, page: Observation) -> str:
        """The first text the policy reads: the dataset's prompt with the first page joined. Override it
        for your chat template; with :func:`keyshot_agent_executor` the page's screenshot is the last
        image, so the text must hold its image placeholder."""
        return prompt + page.text

    async def open(self, label: Any) -> Observation:
        """Start the environment and the Episode; the first page (its screenshot recorded)."""
        require_number_on_failure(shared_model(), "OpenRLHF")
        task, page = await self.start(label)
        spec = task if isinstance(task, dict) else {"task": task}
        self.episode = Episode(
            spec["task"], start_url=spec.get("start_url"), task_id=spec.get("task_id"), keep_dir=self.keep_dir
        )
        if page.screenshot is not None:
            self.episode.add_step(page.screenshot)
        return page

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        """OpenRLHF reads ``observation`` only. Under :func:`keyshot_agent_executor` the rollout is open
        and the observation is already the first prompt; else it opens here (the first page's text
        reaches the policy, its screenshot cannot: OpenRLHF's first images come from the dataset)."""
        if self.episode is not None:
            return {"observation": states.get("observation")}
        page = await self.open(states.get("label"))
        if page.screenshot is not None and not _warned_first_page:
            _warned_first_page.append(True)
            logger.warning(
                "keyshot agent: the first page's screenshot is recorded but not shown to the policy (OpenRLHF "
                "reads no images from reset); define AgentExecutor = keyshot_agent_executor(AgentInstance)"
            )
        return {"observation": self.first_prompt(states.get("observation") or "", page)}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        if self.episode is None:
            raise RuntimeError("step() before reset(): OpenRLHF calls reset(states) first")
        action = states.get("action_text", "")
        page = await self.act(action)
        self.episode.actions.append(action)
        self.episode.thoughts.append("")
        if page.screenshot is not None:
            self.episode.add_step(page.screenshot)
        out: dict[str, Any] = {
            "environment_feedback": page.text,
            # the final page has no turn of the policy's after it: recorded, not shown
            "environment_images": [policy_image(page.screenshot)]
            if page.screenshot is not None and not page.done
            else [],
            "done": page.done,
            "sampling_params": states.get("sampling_params"),
        }
        if not page.done:
            return {**out, "rewards": _tensor([0.0]), "scores": _tensor([0.0]), "extra_logs": {}}
        result = await self.judge(page.answer)
        reward = _tensor([float(result.reward)])
        return {
            **out,
            "rewards": reward,
            "scores": reward.clone(),
            "extra_logs": openrlhf_logs([result], False),
        }

    async def judge(self, answer: str | None) -> RewardResult:
        """Finish the episode and await its reward (its temporary files are removed once scored)."""
        self.episode.finish(answer)
        self.result = await score_shared(self.episode)
        return self.result

    def abandon(self) -> None:
        """Remove the episode's files when the rollout failed before it was judged."""
        if self.episode is not None and self.result is None:
            self.episode.discard()


def _prepared_agent() -> KeyshotAgentInstance:
    agent = _PREPARED.get()
    if agent is None:
        raise RuntimeError("keyshot's AgentExecutor builds each rollout's AgentInstance in execute()")
    return agent


def keyshot_agent_executor(instance_cls: type) -> type:
    """OpenRLHF's ``AgentExecutor`` class for ``instance_cls`` (a :class:`KeyshotAgentInstance` and an
    OpenRLHF ``AgentInstanceBase``): OpenRLHF's ``MultiTurnAgentExecutor``, with each rollout opened
    first so that the first page reaches the policy (its text through :meth:`~KeyshotAgentInstance.
    first_prompt`, its screenshot after the dataset's images), and an episode that OpenRLHF stops at its
    token budget (no ``done`` step) judged on what it recorded, counted in ``keyshot_unfinished``, its
    files removed."""
    from openrlhf.utils.agent import MultiTurnAgentExecutor

    class KeyshotAgentExecutor(MultiTurnAgentExecutor):
        def __init__(self) -> None:
            super().__init__(instance_cls)  # OpenRLHF checks the class here
            self.agent_instance_cls = _prepared_agent  # and builds each rollout's instance by calling this

        async def execute(
            self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None
        ):
            agent = instance_cls()
            try:
                page = await agent.open(label)
                if page.screenshot is not None:
                    given = images if isinstance(images, list) else [images] if images else []
                    images = [*given, policy_image(page.screenshot)]
                token = _PREPARED.set(agent)
                try:
                    response = await super().execute(
                        agent.first_prompt(prompt, page),
                        label,
                        sampling_params,
                        max_length,
                        hf_tokenizer,
                        llm_engine,
                        images=images,
                    )
                finally:
                    _PREPARED.reset(token)
                if agent.result is None:  # the token budget ran out before a done step
                    result = await agent.judge(None)
                    logger.warning(
                        "keyshot agent: episode %s stopped at the token budget after %d steps; judged as it is",
                        result.id,
                        len(agent.episode.actions),
                    )
                    response.update(
                        reward=float(result.reward),
                        scores=float(result.reward),
                        extra_logs=openrlhf_logs([result], True),
                    )
                return response
            finally:
                agent.abandon()

    KeyshotAgentExecutor.__qualname__ = KeyshotAgentExecutor.__name__ = f"{instance_cls.__name__}Executor"
    return KeyshotAgentExecutor
