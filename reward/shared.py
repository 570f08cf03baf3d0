"""The process-wide reward model of the framework adapters, and the batcher that lets rollouts finishing
at about the same time share one round of calls.

Frameworks load an adapter file with no arguments, so the adapters find their ``keyshot judge`` config
through the environment variable ``KEYSHOT_REWARD_CONFIG`` (or a picklable reward names its config path).
Each config gets one :class:`RewardModel` per process; its batcher runs on the model's own event loop, so
rollouts submitted from any thread or loop (OpenRLHF's per-sample threads, verl's reward loop, TRL's
trainer) meet in one batch, ask key points once per task and never pay a call twice.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.reward.model import RewardModel, RewardResult

CONFIG_ENV = "KEYSHOT_REWARD_CONFIG"
WINDOW_ENV = "KEYSHOT_REWARD_WINDOW_S"
DEFAULT_WINDOW_S = 0.05

_lock = threading.Lock()
_models: dict[tuple[int, str], RewardModel] = {}
_batchers: dict[tuple[int, str], RewardBatcher] = {}


class RewardConfigError(KeyshotError):
    """The adapters' config cannot be found."""


def config_path(config: str | os.PathLike | None = None) -> str:
    """``config``, else ``$KEYSHOT_REWARD_CONFIG`` (an error naming it when unset), as an absolute path."""
    path = config or os.environ.get(CONFIG_ENV)
    if not path:
        raise RewardConfigError(
            f"{CONFIG_ENV} is not set: export {CONFIG_ENV}=PATH/TO/CONFIG.yaml (a keyshot judge config, "
            "e.g. configs/reward/openrlhf.yaml) before the trainer starts"
        )
    return str(Path(path).resolve())


def require_number_on_failure(
    model: RewardModel, framework: str, config: str | os.PathLike | None = None
) -> None:
    """Refuse a config whose failed rollouts would have no number, for a framework that builds tensors from
    every reward (OpenRLHF, verl): ``reward.on_failure: zero`` makes such a rollout a counted 0.0."""
    if model.settings.on_failure != "zero":
        raise RewardConfigError(
            f"{config_path(config)}: {framework} needs a number for every sample and has no 'no reward' value; "
            "set reward.on_failure: zero in the keyshot config (a sample without a verdict then scores 0.0 "
            "and is counted in keyshot_failed)"
        )


def shared_model(config: str | os.PathLike | None = None) -> RewardModel:
    """The RewardModel of ``config`` (default ``$KEYSHOT_REWARD_CONFIG``), built once per process."""
    key = (os.getpid(), config_path(config))
    with _lock:
        if key not in _models:
            _models[key] = RewardModel.from_config(key[1])
        return _models[key]


def shared_batcher(config: str | os.PathLike | None = None) -> RewardBatcher:
    """The process-wide batcher over :func:`shared_model`."""
    model = shared_model(config)
    key = (os.getpid(), config_path(config))
    with _lock:
        if key not in _batchers or _batchers[key].model is not model:
            _batchers[key] = RewardBatcher(model, float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW_S)))
        return _batchers[key]


async def score_shared(
    rollout: Any,
    *,
    config: str | os.PathLike | None = None,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
) -> RewardResult:
    """Score one rollout with the shared model, batched with the rollouts that arrive with it; awaitable
    from any event loop in any thread."""
    batcher = shared_batcher(config)
    return await batcher.model._loop.run(batcher.score(rollout, scorer_url, scorer_model))


def score_shared_sync(
    rollouts: Sequence[Any],
    *,
    config: str | os.PathLike | None = None,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
) -> list[RewardResult]:
    """:func:`score_shared` for a list, from synchronous code in any thread (OpenRLHF's per-sample calls)."""
    batcher = shared_batcher(config)

    async def each() -> list[RewardResult]:
        return list(await asyncio.gather(*(batcher.score(r, scorer_url, scorer_model) for r in rollouts)))

    return batcher.model._loop.run_sync(each())


def reset_shared() -> None:
    """Forget the process-wide models (tests; a changed ``$KEYSHOT_REWARD_CONFIG``)."""
    with _lock:
        models = [m for (pid, _), m in _models.items() if pid == os.getpid()]
        _models.clear()
        _batchers.clear()
    for model in models:
        model.close()


class RewardBatcher:
    """Rollouts submitted within ``window_s`` of the first are scored in one :meth:`RewardModel.score`
    round (per scorer URL and model): their key points and scorer calls go out together. Runs on the
    model's loop (:func:`score_shared` takes callers there)."""

    def __init__(self, model: RewardModel, window_s: float = DEFAULT_WINDOW_S):
        self.model = model
        self.window_s = window_s
        self._pending: dict[tuple[str | None, str | None], list[tuple[Any, asyncio.Future]]] = {}
        self.batches = 0
        self._tasks: set[asyncio.Task] = set()

    async def score(
        self, rollout: Any, scorer_url: str | None = None, scorer_model: str | None = None
    ) -> RewardResult:
        loop = asyncio.get_running_loop()
        key = (scorer_url, scorer_model)
        future: asyncio.Future = loop.create_future()
        batch = self._pending.setdefault(key, [])
        batch.append((rollout, future))
        if len(batch) == 1:
            loop.call_later(self.window_s, self._start_flush, loop, key)
        return await future

    def _start_flush(self, loop: asyncio.AbstractEventLoop, key: tuple[str | None, str | None]) -> None:
        task = loop.create_task(self._flush(key))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, key: tuple[str | None, str | None]) -> None:
        batch = self._pending.pop(key, [])
        if not batch:
            return
        self.batches += 1
        try:
            results = await self.model.score([r for r, _ in batch], scorer_url=key[0], scorer_model=key[1])
        except BaseException as exc:  # score() does not raise for a rollout; this is a bug or a cancel
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
