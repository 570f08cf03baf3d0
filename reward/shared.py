"""The process-wide reward model of the framework adapters, and the batcher that lets rollouts finishing
at about the same time share one round of calls.

Frameworks load an adapter file with no arguments, so the adapters find their ``keyshot judge`` config
through the environment variable ``KEYSHOT_REWARD_CONFIG`` (or a picklable reward names its config path).
Each config gets one :class:`RewardModel` and one :class:`RewardBatcher` per process; the batcher runs on
the model's own event loop, so rollouts submitted from any thread or loop (OpenRLHF's per-sample threads,
verl's reward loop, TRL's trainer) meet in one batch, ask key points once per task and never pay a call
twice. The batch window is the config's ``reward.batch_window_s``.

A forked child does not inherit the parent's models (their loop threads stay behind): it builds its own on
its first call; the registry and its lock are new there
(:class:`keyshot.infer.common.processes.PerProcess`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import PerProcess
from keyshot.reward.model import RewardModel, RewardResult, RewardSettings, batch_window_s

CONFIG_ENV = "KEYSHOT_REWARD_CONFIG"

#: config path -> its batcher (and, through it, its model) in this process; new in a forked child
_batchers: PerProcess[dict[str, RewardBatcher]] = PerProcess(dict)


class RewardConfigError(KeyshotError):
    """The adapters' config cannot be found, or cannot give a framework the number it needs."""


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
    model: RewardModel | RewardSettings, framework: str, config: str | os.PathLike | None = None
) -> None:
    """Refuse a config whose failed rollouts would have no number, for a framework that builds tensors from
    every reward (OpenRLHF, verl, the service's ``/get_reward``): ``reward.on_failure: zero`` makes such a
    rollout a counted 0.0. ``model``: the model, or the settings it is built from."""
    settings = model if isinstance(model, RewardSettings) else model.settings
    if settings.on_failure != "zero":
        raise RewardConfigError(
            f"{config_path(config)}: {framework} needs a number for every sample and has no 'no reward' value; "
            "set reward.on_failure: zero in the keyshot config (a sample without a verdict then scores 0.0 "
            "and is counted in keyshot_failed)"
        )


def shared_batcher(config: str | os.PathLike | None = None) -> RewardBatcher:
    """The batcher of ``config`` (default ``$KEYSHOT_REWARD_CONFIG``) in this process, over its model; both
    built on the first call."""
    path = config_path(config)
    with _batchers.lock:
        if path not in _batchers.items:
            _batchers.items[path] = RewardBatcher(RewardModel.from_config(path))
        return _batchers.items[path]


def shared_model(config: str | os.PathLike | None = None) -> RewardModel:
    """The RewardModel of ``config`` (default ``$KEYSHOT_REWARD_CONFIG``), built once per process."""
    return shared_batcher(config).model


async def score_shared(
    rollout: Any,
    *,
    config: str | os.PathLike | None = None,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
) -> RewardResult:
    """Score one rollout with the shared model, batched with the rollouts that arrive with it; awaitable
    from any event loop in any thread."""
    return await shared_batcher(config).score(rollout, scorer_url, scorer_model)


def score_shared_sync(
    rollouts: Sequence[Any],
    *,
    config: str | os.PathLike | None = None,
    scorer_url: str | None = None,
    scorer_model: str | None = None,
) -> list[RewardResult]:
    """:func:`score_shared` for a list, from synchronous code in any thread (OpenRLHF's per-sample calls)."""
    return shared_batcher(config).score_sync(rollouts, scorer_url, scorer_model)


def reset_shared() -> None:
    """Close and forget this process's shared models (tests; a changed ``$KEYSHOT_REWARD_CONFIG``)."""
    with _batchers.lock:
        models = [batcher.model for batcher in _batchers.items.values()]
        _batchers.items.clear()
    for model in models:
        model.close()


class RewardBatcher:
    """Rollouts submitted within ``window_s`` of the first (default: the model's ``reward.batch_window_s``)
    are scored in one :meth:`RewardModel.score` round (per scorer URL and model): their key points and
    scorer calls go out together. :meth:`score` and :meth:`score_sync` take callers from any thread or loop
    to the model's loop, where the batches are kept."""

    def __init__(self, model: RewardModel, window_s: float | None = None):
        self.model = model
        # the model's settings hold None where they were built without a config
        self.window_s = window_s if window_s is not None else batch_window_s(model.settings.batch_window_s)
        self._pending: dict[tuple[str | None, str | None], list[tuple[Any, asyncio.Future]]] = {}
        self.batches = 0
        self._tasks: set[asyncio.Task] = set()

    async def score(
        self, rollout: Any, scorer_url: str | None = None, scorer_model: str | None = None
    ) -> RewardResult:
        """One rollout's result, scored in the batch it arrives with; awaitable from any loop."""
        return await self.model.loop.run(self._join(rollout, (scorer_url, scorer_model)))

    def score_sync(
        self, rollouts: Sequence[Any], scorer_url: str | None = None, scorer_model: str | None = None
    ) -> list[RewardResult]:
        """The rollouts' results, in order, each joining the batch it arrives with; from any thread but the
        model's loop."""

        async def each() -> list[RewardResult]:
            key = (scorer_url, scorer_model)
            return list(await asyncio.gather(*(self._join(r, key) for r in rollouts)))

        return self.model.loop.run_sync(each())

    async def _join(self, rollout: Any, key: tuple[str | None, str | None]) -> RewardResult:
        """On the model's loop: add ``rollout`` to the pending batch of ``key`` and await its result."""
        loop = asyncio.get_running_loop()
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
