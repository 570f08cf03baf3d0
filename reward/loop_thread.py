"""An event loop of a reward model's own, on a daemon thread, that any thread and any other loop can use.

Trainers call a reward from wherever they are: OpenRLHF once per sample, each in a thread of its own
(``asyncio.to_thread``), verl from its reward loop, TRL from its trainer's loop or a spawned worker. The
HTTP clients, the in-flight coalescing of identical requests and the batcher are bound to one event loop,
so a reward model runs every round of calls on its own loop: calls from everywhere meet there, share
batches, and nothing is asked twice because it was asked from another thread.

Building a LoopThread starts nothing: its thread starts on first use (the first coroutine submitted), or
at an explicit :meth:`LoopThread.start`, once. The owner stops it (:meth:`stop`, from its ``close`` and its
exit finaliser; a loop stopped, or never started, is not started again). A forked child has no copy of the
thread: the owner :meth:`abandon`\\ s it there (``os.register_at_fork``), and a later call says so instead
of hanging.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

#: How long :meth:`LoopThread.stop` waits for the loop's tasks to end and its thread to join.
STOP_TIMEOUT_S = 5.0


class LoopThread:
    """One event loop on a daemon thread, started on first use (or by :meth:`start`): submit coroutines
    with :meth:`run` (async) or :meth:`run_sync`, :meth:`stop` it."""

    def __init__(self, name: str = "keyshot-reward-loop"):
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._unusable: str | None = None  # why it cannot start (stopped, abandoned); None: it can
        self._starting = threading.Lock()

    def start(self) -> LoopThread:
        """Start the loop's thread unless it runs, and return once the loop runs (from any thread; the
        first use calls it). A loop stopped or abandoned raises RuntimeError saying why."""
        with self._starting:
            if self._thread is not None:
                return self
            if self._unusable is not None:
                raise RuntimeError(f"{self.name}: {self._unusable}")
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def serve() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()

            thread = threading.Thread(target=serve, name=self.name, daemon=True)
            thread.start()
            ready.wait()
            self._loop, self._thread = loop, thread
            return self

    @property
    def running(self) -> bool:
        """Whether the loop's thread runs (asking starts nothing)."""
        return self._thread is not None and self._thread.is_alive()

    def owns_current(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def _submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        try:
            loop = self.start()._loop
        except RuntimeError:
            coro.close()
            raise
        if loop is None:  # abandoned or stopped meanwhile
            coro.close()
            raise RuntimeError(f"{self.name}: {self._unusable}")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on this loop and return at once, from any thread: its future (a caller that
        stops waiting on it leaves it running: cancel the future to cancel it)."""
        return self._submit(coro)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from any loop (cancelling the await cancels it there)."""
        if self.owns_current():
            return await coro
        return await asyncio.wrap_future(self._submit(coro))

    def run_sync(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on this loop and wait for it (from any thread but this loop's own); past
        ``timeout`` seconds it is cancelled and ``TimeoutError`` raised."""
        if self.owns_current():
            coro.close()
            raise RuntimeError(
                f"{self.name}: run_sync() called on the loop itself; await the coroutine instead"
            )
        future = self._submit(coro)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self.name}: no result within {timeout} s") from None

    def abandon(self, why: str) -> None:
        """Forget the thread without stopping it (a forked child has no copy of it); later calls raise
        RuntimeError saying ``why`` (nothing starts again)."""
        self._unusable = why
        self._loop = self._thread = None
        self._starting = threading.Lock()  # a forked child's: the parent's may have been held at the fork

    def stop(self) -> None:
        """Cancel the loop's pending work, stop it and join its thread (a no-op once stopped; a loop never
        started stays so)."""
        with self._starting:  # a first use starting the loop meanwhile finds it stopped, not started after
            loop, thread = self._loop, self._thread
            self.abandon("stopped by its owner's close(); build a new one")
        if loop is None or thread is None:
            return
        if thread is threading.current_thread():
            loop.call_soon(loop.stop)
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        if loop.is_running():
            with contextlib.suppress(Exception):  # best effort: the loop may be gone at interpreter exit
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=STOP_TIMEOUT_S)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=STOP_TIMEOUT_S)
        if not loop.is_running():
            loop.close()
