"""OpenRLHF: a ``reward_func`` file (``--reward.remote_url FILE.py``), and the multi-turn agent base for
``--train.agent_func_path`` whose final step awaits keyshot's reward (its executor, which needs OpenRLHF
installed, is :mod:`keyshot.frameworks.openrlhf.executor`).

OpenRLHF loads this file by path with no arguments (``spec_from_file_location``, no ``sys.modules``
entry: this module therefore has no ``from __future__ import annotations`` and defines no dataclass,
whose annotations could not be resolved there; the page type is :class:`keyshot.reward.episode.Page`), so the ``keyshot judge`` config comes from ``$KEYSHOT_REWARD_CONFIG``. Loaded that way the
file exists twice in a process (once as ``keyshot.frameworks.openrlhf.reward``, once under OpenRLHF's name), so it
keeps no state of its own: the model, its batcher and its caches live in :mod:`keyshot.reward.shared`.

OpenRLHF turns every reward into a tensor and has no "no reward": the config must say ``reward:
{on_failure: zero}``, and each sample without a verdict is counted in ``extra_logs`` (``keyshot_failed``)
and logged, never a silent 0.

``reward_func`` is called once per sample, each call on a thread of its own (``asyncio.to_thread``); the
calls meet in the process-wide model's batches (:func:`~keyshot.reward.shared.score_shared_sync`),
so key points are asked once per task and no call is paid twice.

A label is a trajectory folder's path, or JSON: ``{"task": ..., "screenshots": [...], ...}`` (a dict
rollout, see :mod:`keyshot.reward.rollouts`) for ``reward_func``; for the agent, whatever its
``start`` opens.
"""

import logging
import os
import warnings
from abc import ABC, abstractmethod
from typing import Any

from keyshot.reward.episode import Episode, Page
from keyshot.reward.logs import sample_logs
from keyshot.reward.model import RewardResult
from keyshot.reward.rollouts import RolloutError, label_rollout
from keyshot.reward.shared import (
    require_number_on_failure,
    score_shared,
    score_shared_sync,
    shared_model,
)

__all__ = [
    "KeyshotAgentInstance",
    "Observation",
    "Page",
    "label_rollout",
    "openrlhf_logs",
    "policy_image",
    "require_number_on_failure",
    "reward_func",
]

# one logger whichever name OpenRLHF loaded the file under
logger = logging.getLogger("keyshot.frameworks.openrlhf.reward")

#: The per-sample field an agent adds to :func:`~keyshot.reward.logs.sample_logs`: 1.0 for an
#: episode OpenRLHF stopped at its token budget (no ``done`` step), judged on what it recorded.
UNFINISHED_KEY = "keyshot_unfinished"


def _tensor(values: list[float]) -> Any:
    """A float tensor (OpenRLHF calls ``.item()`` on step rewards and flattens extra logs)."""
    import torch

    return torch.tensor(values, dtype=torch.float32)


def openrlhf_logs(results: list[RewardResult], unfinished: bool | None = None) -> dict[str, Any]:
    """``extra_logs`` as OpenRLHF means them per sample: keyshot's log fields as tensors (and, for an
    agent's episode, whether the token budget stopped it)."""
    fields = {key: _tensor(values) for key, values in sample_logs(results).items()}
    if unfinished is not None:
        fields[UNFINISHED_KEY] = _tensor([float(unfinished)] * len(results))
    return fields


def reward_func(queries: list[str], prompts: list[str], labels: list[Any]) -> dict[str, Any]:
    """OpenRLHF's custom reward function: one reward per (query, prompt, label); the label names the
    rollout (see the module docstring). A label that is no rollout is a failed sample (counted, logged
    with its reason), its neighbours scored."""
    model = shared_model()
    require_number_on_failure(model, "OpenRLHF")
    rollouts: dict[int, Any] = {}
    unreadable: dict[int, RewardResult] = {}
    for i, label in enumerate(labels):
        try:
            rollouts[i] = label_rollout(label, i)
        except RolloutError as exc:
            unreadable[i] = model.failed(f"label {i}", "input", exc)
    scored = dict(zip(rollouts, score_shared_sync(list(rollouts.values())), strict=True))
    results = [scored[i] if i in scored else unreadable[i] for i in range(len(labels))]
    rewards = _tensor([float(r.reward) for r in results])
    return {"rewards": rewards, "scores": rewards.clone(), "extra_logs": openrlhf_logs(results)}


#: What the environment shows the policy after a step: :class:`~keyshot.reward.episode.Page` (the page
#: every keyshot environment returns), under the name this module gave it before: text, a screenshot (a
#: path, PNG/JPEG bytes, or what OpenRLHF's ``load_images`` reads: a PIL image, base64 text), whether the
#: episode is over and the agent's final answer when it is (``Observation(text, screenshot, done=True,
#: answer=...)``; give ``done`` and ``answer`` by keyword: the third positional field is the page's
#: ``step``).
Observation = Page


def policy_image(screenshot: Any) -> Any:
    """A screenshot as OpenRLHF's ``load_images`` reads it (PIL image, bytes or str): a path becomes its
    text, bytearray bytes."""
    if isinstance(screenshot, os.PathLike):
        return os.fspath(screenshot)
    if isinstance(screenshot, bytearray):
        return bytes(screenshot)
    return screenshot


class KeyshotAgentInstance(ABC):
    """A base for OpenRLHF's AgentInstance: subclass it (and OpenRLHF's ``AgentInstanceBase``) and write
    the environment part only::

        class AgentInstance(KeyshotAgentInstance, AgentInstanceBase):
            async def start(self, label):            # -> (task, first Page)
                ...
            async def act(self, action_text):        # -> the Page after the action
                ...
            async def close(self):                   # release the environment (its browser)
                ...

        class AgentExecutor(KeyshotAgentExecutor):   # the class OpenRLHF loads
            agent_instance_cls = AgentInstance

    (:class:`~keyshot.frameworks.openrlhf.executor.KeyshotAgentExecutor`). Each rollout records an Episode:
    every page's screenshot is written to disk and shown to the policy (``environment_images``, the final
    page's excepted: the episode is over), and at the final step the reward is awaited through the
    process-wide batcher (episodes finishing together share one round of calls).

    Every way an episode ends awaits :meth:`close` (the environment's release) exactly once: a ``done``
    page and the token budget through :meth:`judge` (the environment closed, then what was recorded
    judged); an exception in ``start``, ``act`` or the judging, and the rollout's task cancelled, through
    :meth:`end` (which also removes the files of an episode never judged; the executor calls it after
    every rollout).
    """

    keep_dir: str | None = None

    def __init__(self, *args: Any, **kwargs: Any):
        self.episode: Episode | None = None
        self.result: RewardResult | None = None
        self.closed = False  # close() was called (it is called once)
        self.ended = False  # end() ran

    @abstractmethod
    async def start(self, label: Any) -> tuple[str | dict, Page]:
        """Open the environment for ``label``: the task (text, or ``{"task", "start_url", "task_id"}``)
        and the first Page."""

    @abstractmethod
    async def act(self, action_text: str) -> Page:
        """Carry out the policy's action; the Page after it."""

    async def close(self) -> None:  # noqa: B027  (optional: an environment holding nothing needs none)
        """Release what :meth:`start` opened (close the browser). keyshot calls it exactly once per
        rollout, when the episode ends whichever way (after a failed ``start`` too: release what is
        there). The default holds nothing."""

    def first_prompt(self, prompt: str, page: Page) -> str:
        """The first text the policy reads: the dataset's prompt with the first page joined. Override it
        for your chat template; with keyshot's executor the page's screenshot is the last image, so the
        text must hold its image placeholder."""
        return prompt + page.text

    async def open(self, label: Any) -> Page:
        """Start the environment and the Episode; the first page (its screenshot recorded). A failure
        ends the episode (:meth:`end`) and is raised."""
        try:
            require_number_on_failure(shared_model(), "OpenRLHF")
            task, page = await self.start(label)
            spec = task if isinstance(task, dict) else {"task": task}
            self.episode = Episode(
                spec["task"],
                start_url=spec.get("start_url"),
                task_id=spec.get("task_id"),
                keep_dir=self.keep_dir,
            )
            self.episode.add_step(page.screenshot)  # (None: no page to record)
            return page
        except BaseException:
            await self.end()
            raise

    async def reset(self, states: dict, **kwargs: Any) -> dict:
        """OpenRLHF reads ``observation`` only. Under keyshot's executor the rollout is open and the
        observation is already the first prompt; else it opens here (the first page's text reaches the
        policy, its screenshot cannot: OpenRLHF's first images come from the dataset)."""
        if self.episode is not None:
            return {"observation": states.get("observation")}
        page = await self.open(states.get("label"))
        if page.screenshot is not None:
            warnings.warn(  # shown once per calling line (Python's warning registry, not this file's)
                "keyshot agent: the first page's screenshot is recorded but not shown to the policy (OpenRLHF "
                "reads no images from reset); load keyshot.frameworks.openrlhf.executor.KeyshotAgentExecutor",
                stacklevel=2,
            )
        return {"observation": self.first_prompt(states.get("observation") or "", page)}

    async def step(self, states: dict, **kwargs: Any) -> dict:
        """One action: the page after it, and on the last page (``done``) the environment closed and the
        episode's reward. An exception ends the episode (:meth:`end`) and is raised."""
        if self.episode is None:
            raise RuntimeError("step() before reset(): OpenRLHF calls reset(states) first")
        try:
            action = states.get("action_text", "")
            page = await self.act(action)
            self.episode.add_step(page.screenshot, action=action)  # the action, and the page after it
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
        except BaseException:
            await self.end()
            raise
        reward = _tensor([float(result.reward)])
        return {
            **out,
            "rewards": reward,
            "scores": reward.clone(),
            "extra_logs": openrlhf_logs([result], False),
        }

    async def judge(self, answer: str | None) -> RewardResult:
        """Finish the episode and await its reward: the environment is closed first (the episode is over;
        its browser is free before the judge's calls), the temporary files removed once scored."""
        await self._close_once()
        self.episode.finish(answer)
        self.result = await score_shared(self.episode)
        return self.result

    async def end(self) -> None:
        """The rollout is over, however it ended: :meth:`close` (if not called yet) and, for an episode
        that was never judged, its files removed. Safe to call again."""
        if self.ended:
            return
        self.ended = True
        try:
            await self._close_once()
        finally:
            if self.episode is not None and self.result is None:
                self.episode.discard()

    async def _close_once(self) -> None:
        if not self.closed:
            self.closed = True  # set first: a close that is cancelled or raises is not tried again
            await self.close()
