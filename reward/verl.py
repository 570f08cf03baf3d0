"""verl: ``compute_score``, a custom reward function for verl's reward loop (verl >= 0.9: the
``reward.custom_reward_function`` keys; configs/reward/verl_trainer.yaml, docs/reward.md)::

    reward:
      custom_reward_function:
        path: <this file, or reward/verl.py>
        name: compute_score
        reward_kwargs: {keyshot_config: configs/reward/verl.yaml}   # else $KEYSHOT_REWARD_CONFIG

verl loads the file by path and calls ``compute_score`` once per sample, concurrently, on its reward-loop
worker's event loop; the calls meet in the process-wide model's batches (key points once per task). The
rollout is ``extra_info["episode"]`` (an :class:`Episode` the environment recorded) or
``extra_info["trajectory"]`` (a trajectory folder it wrote); ``solution_str`` is the final answer.

verl builds its reward tensor with ``new_tensor(scores)`` and has no "no reward" value, so the config must
say ``reward: {on_failure: zero}`` (the first call refuses any other): a sample without a verdict scores
0.0, is counted in ``keyshot_failed`` and logged. Every returned dict has the same keys, all numbers
(:func:`keyshot.reward.logs.sample_logs`), as verl's ``np.array`` of each extra key and its
validation metrics need.

With ``reward_router_address`` (``host:port``: verl serves ``reward.reward_model.model_path`` itself) the
scorer requests go to ``http://host:port/v1`` under the one model name the router lists at ``/v1/models``
(vLLM serves the model under its path unless told otherwise); key points and the outcome go to the judge
of the keyshot config.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
import urllib.request
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.reward.episode import Episode
from keyshot.reward.logs import sample_logs, warn_constant_groups
from keyshot.reward.model import RewardResult
from keyshot.reward.rollouts import RolloutError, read_rollout
from keyshot.reward.shared import require_number_on_failure, score_shared, shared_model

__all__ = ["RouterModelError", "compute_score", "router_url", "served_model"]

#: How long the reward router may take to list its model.
ROUTER_TIMEOUT_S = 30.0
CONSTANT_FIX = (
    "Give each sample its own rollout: record an Episode per rollout (extra_info['episode']) or write "
    "each sample's trajectory folder into extra_info['trajectory'] from the agent loop, not a dataset column."
)


class RouterModelError(KeyshotError):
    """verl's reward router does not say which one model it serves."""


def router_url(address: str) -> str:
    """verl's ``host:port`` (or a URL) as an OpenAI base URL."""
    address = address.rstrip("/")
    if not address.startswith(("http://", "https://")):
        address = f"http://{address}"
    return address if address.endswith("/v1") else f"{address}/v1"


_served: dict[str, str] = {}
_served_lock = threading.Lock()


def served_model(address: str) -> str:
    """The one model id the router at ``address`` lists at ``/v1/models`` (asked once per address).

    Raises :class:`RouterModelError` when it lists none or several (the scorer requests could not name
    the model), and ``OSError`` when the router does not answer (not remembered: asked again next time).
    """
    url = router_url(address)
    with _served_lock:
        if url not in _served:
            with urllib.request.urlopen(f"{url}/models", timeout=ROUTER_TIMEOUT_S) as response:
                try:
                    listed = json.load(response)
                except ValueError:
                    raise RouterModelError(
                        f"reward_router_address {address}: {url}/models is not JSON"
                    ) from None
            ids = [
                m.get("id")
                for m in (listed.get("data") if isinstance(listed, dict) else None) or []
                if isinstance(m, dict) and m.get("id")
            ]
            if len(ids) != 1:
                raise RouterModelError(
                    f"reward_router_address {address}: {url}/models lists {len(ids)} models {ids}; keyshot "
                    "sends the scorer requests under the one model verl's reward model serves "
                    "(reward.reward_model.model_path): serve exactly the keyshot scorer checkpoint there"
                )
            _served[url] = ids[0]
        return _served[url]


_where = "verl compute_score"
_constant_seen: list[tuple[str, Any]] = []
_constant_done = False
_constant_lock = threading.Lock()


def _note_rollout(path: str, extra_info: dict) -> None:
    """Record which recorded rollout a sample scores, and warn once when every prompt's samples score the
    same one (a dataset column: GRPO's groups then have equal rewards)."""
    global _constant_done
    with _constant_lock:  # verl's samples are read in threads
        if _constant_done:
            return
        _constant_seen.append((path, extra_info.get("index", path)))
        del _constant_seen[:-4096]
        paths, groups = zip(*_constant_seen, strict=True)
        _constant_done = warn_constant_groups(list(paths), list(groups), _where, CONSTANT_FIX)


def _rollout(solution_str: str, extra_info: dict) -> Any:
    """The sample's rollout with ``solution_str`` as its final answer."""
    episode = extra_info.get("episode")
    if isinstance(episode, Episode):
        if not episode.finished:
            episode.finish(solution_str)
        return episode
    path = extra_info.get("trajectory")
    if path:
        _note_rollout(str(path), extra_info)
        return dataclasses.replace(read_rollout(os.fspath(path), 0), final_answer=solution_str)
    raise RolloutError(
        "extra_info holds neither 'episode' (an Episode) nor 'trajectory' (a trajectory folder); "
        f"it has {sorted(extra_info)}"
    )


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
    try:
        rollout = await asyncio.to_thread(_rollout, solution_str, dict(extra_info or {}))
    except RolloutError as exc:
        return _reported(model.settle(RewardResult(id=str(data_source), error=f"input: {exc}")))
    scorer_url = scorer_model = None
    if reward_router_address:
        scorer_url = router_url(reward_router_address)
        try:
            scorer_model = await asyncio.to_thread(served_model, reward_router_address)
        except (OSError, RouterModelError) as exc:
            if isinstance(rollout, Episode):
                rollout.discard()
            if isinstance(exc, RouterModelError):  # a set-up error: the run stops, naming it
                raise
            # the router did not answer: this sample has no verdict, the next one asks again
            error = f"scorer: the reward router at {reward_router_address} did not list its model: {exc}"
            return _reported(model.settle(RewardResult(id=str(data_source), error=error)))
    result = await score_shared(
        rollout, config=keyshot_config, scorer_url=scorer_url, scorer_model=scorer_model
    )
    return _reported(result)


def _reported(result: RewardResult) -> dict[str, float]:
    """What verl keeps of a result: the score and the shared log fields, all floats."""
    return {
        "score": float(result.reward),
        **{key: values[0] for key, values in sample_logs([result]).items()},
    }
