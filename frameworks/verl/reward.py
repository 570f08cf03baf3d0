"""verl: ``compute_score`` (and ``compute_score_sync``), a custom reward function for verl's reward loop, and
``KeyshotRewardManager``, the reward manager that finds an agent loop's rollout after the batch (verl >= 0.9;
configs/reward/verl_trainer.yaml, docs/reward.md)::

    reward:
      custom_reward_function:
        path: pkg://keyshot.frameworks.verl.reward     # or this file's path
        name: compute_score                 # compute_score_sync for verl's ``remote`` reward manager
        reward_kwargs: {keyshot_config: configs/reward/verl.yaml}   # else $KEYSHOT_REWARD_CONFIG
      reward_manager: {source: importlib, name: KeyshotRewardManager, module: {path: pkg://keyshot.frameworks.verl.reward}}

verl calls ``compute_score`` once per sample, concurrently, on its reward-loop workers' event loops (8 Ray
actors by default); within a process the calls meet in the shared model's batches, and across processes
the call cache (``cache:``, one file every worker reads) lets one of them pay for a task's key points while
the others wait for its answer. The rollout is ``extra_info["episode"]`` (an :class:`Episode` the
environment recorded) or ``extra_info["trajectory"]`` (a trajectory folder or JSONL file it wrote);
``solution_str`` is the final answer. An agent loop puts either in its output's ``extra_fields``: verl hands
those to the reward inside ``extra_info`` when it scores as the rollouts finish (``tool_extra_fields``), and
as the batch's own columns when it scores after the batch (``reward.reward_model.enable`` without
``enable_resource_pool``), where ``KeyshotRewardManager`` moves them into ``extra_info``.

``KeyshotStepRewardManager`` (``pipeline.step_rewards``, docs/reward.md "Rewards per step") puts each step's
reward r_t at the last token of the agent turn whose action earned it, where verl scores after the batch
(``assemble_rm_scores`` over the batch's ``response_mask``): what ``adv_estimator: gae`` reads token by
token; under GRPO the sequence's sum is the episode's progress.

verl builds its reward tensor with ``new_tensor(scores)`` and has no "no reward" value, so the config must
say ``reward: {on_failure: zero}`` (the first call refuses any other): a sample without a verdict scores
0.0, is counted in ``keyshot_failed`` and logged with its reason. Every returned dict has the same keys, all
numbers (:func:`keyshot.reward.logs.sample_logs`), as verl's ``np.array`` of each extra key and its
validation metrics need.

With ``reward_router_address`` (``host:port``: verl serves ``reward.reward_model.model_path`` itself) the
scorer requests go to ``http://host:port/v1`` under the one model name the router lists at ``/v1/models``
(vLLM serves the model under its path unless told otherwise); key points and the outcome go to the judge
of the keyshot config.

This file holds no state (verl loads it by path, so it may exist more than once in a process): what the
adapter remembers lives with the shared model (:mod:`keyshot.frameworks.verl.state`), and every sample is
scored and settled on that model's own loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import os
import socket
from typing import Any

from keyshot.frameworks.verl.state import RouterModelError, listed_model, router_url, state_of
from keyshot.reward.episode import Episode
from keyshot.reward.logs import sample_logs
from keyshot.reward.model import RewardModel, RewardResult, per_action_rewards
from keyshot.reward.rollouts import RolloutError, read_rollout
from keyshot.reward.shared import config_path, require_number_on_failure, score_shared, shared_model

__all__ = [
    "MANAGERS",
    "ROLLOUT_KEYS",
    "RouterModelError",
    "compute_score",
    "compute_score_sync",
    "listed_model",
    "router_url",
    "with_agent_rollout",
]

#: Where a sample's rollout is: ``extra_info`` keys, or an agent loop's ``extra_fields``.
ROLLOUT_KEYS = ("episode", "trajectory")
#: The reward managers this file gives verl (``reward.reward_manager: {source: importlib, name: ...}``): the
#: name, and the registered verl manager it extends.
MANAGERS = {
    "KeyshotRewardManager": "naive",
    "KeyshotRemoteRewardManager": "remote",
    "KeyshotStepRewardManager": "naive",
}
SHARED_FOLDER_FIX = (
    "an Episode's files stay on the machine that recorded it (a temporary folder there unless keep_dir "
    "is set), and verl's reward workers run on any node: record episodes with Episode(keep_dir=DIR) on a "
    "file system every reward worker reads (docs/reward.md, verl)"
)


def _unreadable(path: str | os.PathLike, what: str) -> RolloutError:
    return RolloutError(
        f"{what}: {os.fspath(path)} is not readable on this reward worker ({socket.gethostname()}); "
        + SHARED_FOLDER_FIX
    )


def _local_episode(episode: Episode) -> Episode:
    """The episode, once its folder and screenshots are readable here (a RolloutError naming the first that
    is not: recorded on another node, or removed)."""
    for path in (episode.folder, *episode.screenshots):
        if not os.access(path, os.R_OK):
            raise _unreadable(path, f"episode {episode.id}")
    return episode


def _rollout(solution_str: str, extra_info: dict) -> Any:
    """The sample's rollout with ``solution_str`` as its final answer (blocking: files are read)."""
    episode = extra_info.get("episode")
    if isinstance(episode, Episode):
        _local_episode(episode)
        if not episode.finished:
            try:
                episode.finish(solution_str)
            except OSError as exc:
                if episode.keep_dir is None:  # its temporary files go; a kept episode stays as it is
                    episode.discard()
                raise RolloutError(
                    f"episode {episode.id}: its trajectory file cannot be written: {exc}"
                ) from None
        return episode
    path = extra_info.get("trajectory")
    if path:
        if not os.path.exists(path):
            raise _unreadable(path, "extra_info['trajectory']")
        return dataclasses.replace(read_rollout(os.fspath(path), 0), final_answer=solution_str)
    raise RolloutError(
        "extra_info holds neither 'episode' (an Episode) nor 'trajectory' (a trajectory folder); "
        f"it has {sorted(extra_info)}"
    )


async def _scored(
    model: RewardModel,
    config: str | None,
    data_source: str,
    solution_str: str,
    extra_info: dict,
    router: str | None,
) -> dict[str, float]:
    """One sample's reported reward; runs on the model's own loop (its state and settle live there)."""
    state = state_of(model, f"verl compute_score ({config_path(config)})")
    try:
        rollout = await asyncio.to_thread(_rollout, solution_str, extra_info)
    except RolloutError as exc:
        return _reported(model.failed(str(data_source), "input", exc))
    if not isinstance(rollout, Episode):
        state.note_rollout(str(extra_info["trajectory"]), extra_info.get("index", extra_info["trajectory"]))
    scorer_url = scorer_model = None
    if router:
        scorer_url = router_url(router)
        try:
            scorer_model = await state.served_model(router)
        except (OSError, RouterModelError) as exc:
            if isinstance(rollout, Episode):
                rollout.discard()
            if isinstance(exc, RouterModelError):  # a set-up error: the run stops, naming it
                raise
            # the router did not answer: this sample has no verdict, the next one asks again
            problem = f"the reward router at {router} did not list its model: {exc}"
            return _reported(model.failed(str(data_source), "scorer", problem))
    result = await score_shared(rollout, config=config, scorer_url=scorer_url, scorer_model=scorer_model)
    return _reported(result)


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    keyshot_config: str | None = None,
    **kwargs: Any,
) -> dict[str, float]:
    """``{"score": reward, "keyshot_failed": 0.0 | 1.0, ...}``: the reward (``reward.value`` of the config;
    0.0 for a sample given no verdict, flagged by ``keyshot_failed``) and the fields of
    :func:`~keyshot.reward.logs.sample_logs`, every one a float. ``keyshot_config`` (verl's
    ``custom_reward_function.reward_kwargs``) names the keyshot config, else ``$KEYSHOT_REWARD_CONFIG``."""
    model = shared_model(keyshot_config)
    require_number_on_failure(model, "verl", keyshot_config)
    sample = _scored(
        model, keyshot_config, data_source, solution_str, dict(extra_info or {}), reward_router_address
    )
    return await model.loop.run(sample)


def compute_score_sync(*args: Any, **kwargs: Any) -> dict[str, float]:
    """:func:`compute_score` (the same arguments) for a caller that waits: verl's ``remote`` reward manager,
    which runs the function in Ray actors of its own and refuses a coroutine function. The sample is scored
    on the shared model's loop, as :func:`compute_score`'s are."""
    return asyncio.run(compute_score(*args, **kwargs))


class Reported(dict):
    """What :func:`compute_score` returns: the numbers verl keeps (a dict), and the sample's per-step rewards
    (``step_rewards``, None without ``pipeline.step_rewards``), which ``KeyshotStepRewardManager`` places on
    the sample's turns (a list cannot be one of verl's extra keys: it stacks them with ``np.array``)."""

    step_rewards: list[float] | None = None


def _reported(result: RewardResult) -> Reported:
    """What verl keeps of a result: the score and the shared log fields, all floats."""
    reported = Reported(
        score=float(result.reward), **{key: values[0] for key, values in sample_logs([result]).items()}
    )
    reported.step_rewards = result.step_rewards
    return reported


def with_agent_rollout(data: Any) -> Any:
    """verl's one-sample ``DataProto`` with the rollout its agent loop left among the batch's columns
    (``extra_fields`` become columns when verl scores after the batch) moved into ``extra_info``, where
    :func:`compute_score` reads it; the agent loop's rollout wins over a dataset's."""
    import numpy as np

    data = data[-1:]  # verl scores the last sequence of a sample
    columns = data.non_tensor_batch
    found = {key: columns[key][0] for key in ROLLOUT_KEYS if key in columns and columns[key][0] is not None}
    if found:
        extra_info = columns["extra_info"][0] if "extra_info" in columns else None
        merged = np.empty(1, dtype=object)
        merged[0] = {**(extra_info or {}), **found}
        columns["extra_info"] = merged
    return data


def reward_manager(name: str) -> type:
    """The verl reward manager ``name`` of :data:`MANAGERS`: verl's own (naive or remote), reading an agent
    loop's rollout after the batch too (:func:`with_agent_rollout`)."""
    from verl.experimental.reward_loop.reward_manager import get_reward_manager_cls

    class KeyshotManager(get_reward_manager_cls(MANAGERS[name])):
        async def run_single(self, data: Any) -> dict:
            return await super().run_single(with_agent_rollout(data))

    KeyshotManager.__name__ = KeyshotManager.__qualname__ = name
    return KeyshotManager


#: the sample a step manager's ``run_single`` scores: where its ``compute_score`` leaves the step rewards
_STEPS: contextvars.ContextVar[dict | None] = contextvars.ContextVar("keyshot_verl_steps", default=None)


def turn_ends(mask: Any) -> list[int]:
    """The last token of each of a response's agent turns: each run of 1s in its response mask (1: a token
    the policy generated, 0: an environment's or tool's); the last token when there is none."""
    values = [int(v) for v in mask]
    ends = [p for p, v in enumerate(values) if v == 1 and (p + 1 == len(values) or values[p + 1] == 0)]
    return ends or [len(values) - 1]


def step_manager() -> type:
    """``KeyshotStepRewardManager``: verl's naive reward manager (with :func:`with_agent_rollout`) that, where
    verl scores after the batch, puts r_t at the last token of each agent turn (the reward of the action that
    led to screenshot t; the first page's with the first turn: :func:`~keyshot.reward.model.per_action_rewards`)
    instead of the episode's sum at the last token. What ``adv_estimator: gae`` reads per token; a
    trajectory-level estimator (GRPO) sums them: the episode's progress. Scored as each rollout ends (verl's
    agent loop, which takes one number), the sample keeps its sum at its last token."""
    base = reward_manager("KeyshotRewardManager")

    class KeyshotStepRewardManager(base):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            score = self.compute_score

            async def keeping_steps(**sample: Any) -> Any:
                out = await score(**sample)
                holder = _STEPS.get()
                if holder is not None:
                    holder["steps"] = getattr(out, "step_rewards", None)
                return out

            self.compute_score = keeping_steps

        async def run_single(self, data: Any) -> dict:
            holder: dict = {}
            _STEPS.set(holder)  # this sample's task: verl scores each sample in a task of its own
            out = await super().run_single(data)
            steps = holder.get("steps")
            if steps is not None and "response_mask" in data.batch.keys():  # noqa: SIM118 (a TensorDict)
                out["reward_score"] = [float(x) for x in steps]
            return out

        @classmethod
        def assemble_rm_scores(cls, data: Any, scores: list) -> Any:
            """The ``rm_scores`` tensor: a sample's per-step rewards at its turns' last tokens, a number at
            its last token (as verl's own)."""
            import torch

            prompt_length = data.batch["prompts"].size(1)
            valid = data.batch["attention_mask"][:, prompt_length:].sum(dim=1).tolist()
            masks = data.batch["response_mask"] if "response_mask" in data.batch.keys() else None  # noqa: SIM118
            rm_scores = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
            for row, (length, score) in enumerate(zip(valid, scores, strict=True)):
                if not isinstance(score, (list, tuple)):
                    rm_scores[row, length - 1] = float(score)
                    continue
                ends = turn_ends(masks[row][:length] if masks is not None else [1] * length)
                for end, reward in zip(ends, per_action_rewards(score, len(ends)), strict=True):
                    rm_scores[row, end] += reward
            return rm_scores

    return KeyshotStepRewardManager


def __getattr__(name: str) -> Any:
    """verl loads a reward manager with ``getattr(module, name)``; its classes exist only where verl is
    installed, so the managers are built when asked for."""
    if name == "KeyshotStepRewardManager":
        return step_manager()
    if name in MANAGERS:
        return reward_manager(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
