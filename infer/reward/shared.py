"""The process-wide reward model of the framework adapters, and the batcher that lets rollouts finishing
at about the same time share one round of calls.

Frameworks load an adapter file with no arguments, so the adapters find their ``keyshot judge`` config
through the environment variable ``KEYSHOT_REWARD_CONFIG``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.reward.model import RewardModel, RewardResult

CONFIG_ENV = "KEYSHOT_REWARD_CONFIG"
WINDOW_ENV = "KEYSHOT_REWARD_WINDOW_S"
DEFAULT_WINDOW_S = 0.05

_lock = threading.Lock()
_model: RewardModel | None = None
_batcher: RewardBatcher | None = None


class RewardConfigError(KeyshotError):
    """The adapters' config cannot be found."""


def shared_model() -> RewardModel:
    """The RewardModel of ``$KEYSHOT_REWARD_CONFIG`` (built once per process)."""
    global _model
    with _lock:
        if _model is None:
            path = os.environ.get(CONFIG_ENV)
            if not path:
                raise RewardConfigError(
                    f"{CONFIG_ENV} is not set: export {CONFIG_ENV}=PATH/TO/CONFIG.yaml (a keyshot judge config, "
                    "e.g. configs/reward/openrlhf.yaml) before the trainer starts"
                )
            _model = RewardModel.from_config(path)
        return _model


def shared_batcher() -> RewardBatcher:
    """The process-wide batcher over :func:`shared_model`."""
    global _batcher
    model = shared_model()
    with _lock:
        if _batcher is None or _batcher.model is not model:
            _batcher = RewardBatcher(model, float(os.environ.get(WINDOW_ENV, DEFAULT_WINDOW_S)))
        return _batcher


def reset_shared() -> None:
    """Forget the process-wide model (tests; a changed ``$KEYSHOT_REWARD_CONFIG``)."""
    global _model, _batcher
    with _lock:
        if _model is not None:
            _model.close()
        _model = _batcher = None


class RewardBatcher:
    """Rollouts submitted within ``window_s`` of the first are scored in one :meth:`RewardModel.score`
    call (per scorer URL): their key points and scorer calls go out together."""

    def __init__(self, model: RewardModel, window_s: float = DEFAULT_WINDOW_S):
        self.model = model
        self.window_s = window_s
        self._pending: dict[tuple[int, str | None], list[tuple[Any, asyncio.Future]]] = {}
        self.batches = 0
        self._tasks: set[asyncio.Task] = set()

    async def score(self, rollout: Any, scorer_url: str | None = None) -> RewardResult:
        loop = asyncio.get_running_loop()
        key = (id(loop), scorer_url)
        future: asyncio.Future = loop.create_future()
        batch = self._pending.setdefault(key, [])
        batch.append((rollout, future))
        if len(batch) == 1:
            loop.call_later(self.window_s, self._start_flush, loop, key, scorer_url)
        return await future

    def _start_flush(
        self, loop: asyncio.AbstractEventLoop, key: tuple[int, str | None], url: str | None
    ) -> None:
        task = loop.create_task(self._flush(key, url))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _flush(self, key: tuple[int, str | None], scorer_url: str | None) -> None:
        batch = self._pending.pop(key, [])
        if not batch:
            return
        self.batches += 1
        try:
            results = await self.model.score([r for r, _ in batch], scorer_url=scorer_url)
        except BaseException as exc:  # score() does not raise for a rollout; this is a bug or a cancel
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            raise
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)
