"""verl: a custom reward function for verl's reward loop (``custom_reward_function.path/name``)::

    custom_reward_function:
      path: <site-packages>/keyshot/infer/reward/verl.py
      name: compute_score

The rollout is ``extra_info["episode"]`` (an :class:`Episode` the environment recorded) or
``extra_info["trajectory"]`` (a trajectory folder it wrote); ``solution_str`` is the final answer. With
``reward_router_address`` (``host:port``, given when ``reward_model.model.path`` makes verl serve the
scorer itself) the scorer requests go to ``http://host:port/v1``; key points and the outcome go to the
configured judge. The config comes from ``$KEYSHOT_REWARD_CONFIG``. Concurrent per-sample calls share
one round of calls through the process-wide batcher.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keyshot.infer.loaders import load_trajectory
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.reward.episode import Episode
from keyshot.infer.reward.model import RewardResult
from keyshot.infer.reward.rollouts import RolloutError
from keyshot.infer.reward.shared import shared_batcher


def router_url(address: str) -> str:
    """verl's ``host:port`` (or a URL) as an OpenAI base URL."""
    address = address.rstrip("/")
    if not address.startswith(("http://", "https://")):
        address = f"http://{address}"
    return address if address.endswith("/v1") else f"{address}/v1"


def rollout_of(solution_str: str, extra_info: dict | None) -> Any:
    extra_info = extra_info or {}
    if isinstance(extra_info.get("episode"), Episode):
        episode = extra_info["episode"]
        if not episode.finished:
            episode.finish(solution_str)
        return episode
    if extra_info.get("trajectory"):
        try:
            trajectory = load_trajectory(extra_info["trajectory"])
        except TrajectoryError as exc:
            raise RolloutError(f"extra_info['trajectory']: {exc}") from None
        return dataclasses.replace(trajectory, final_answer=solution_str)
    raise RolloutError("extra_info holds neither 'episode' (an Episode) nor 'trajectory' (a folder)")


async def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    reward_router_address: str | None = None,
    reward_model_tokenizer: Any = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """``{"score": 1.0 | 0.0 | None, "progress": ..., "p_success": ...}`` (score None on failure unless
    the config's ``reward: {on_failure: zero}``; ``error`` then says why)."""
    batcher = shared_batcher()
    try:
        rollout = rollout_of(solution_str, extra_info)
    except RolloutError as exc:
        result = batcher.model.settle(RewardResult(id=str(data_source), error=f"input: {exc}"))
    else:
        url = router_url(reward_router_address) if reward_router_address else None
        result = await batcher.score(rollout, scorer_url=url)
    return {
        "score": result.reward,
        "progress": result.progress,
        "p_success": result.p_success,
        "error": result.error,
    }
