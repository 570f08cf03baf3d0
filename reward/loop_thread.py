"""An event loop of a reward model's own, on a daemon thread, that any thread and any other loop can use.

Trainers call a reward from wherever they are: OpenRLHF once per sample, each in a thread of its own
(``asyncio.to_thread``), verl from its reward loop, TRL from its trainer's loop or a spawned worker. The
HTTP clients, the in-flight coalescing of identical requests and the batcher are bound to one event loop,
so a reward model runs every round of calls on its own loop: calls from everywhere meet there, share
batches, and nothing is asked twice because it was asked from another thread.

The thread is started on first use and again after a fork (a forked child has no copy of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """One event loop on a daemon thread; :meth:`run` (async) and :meth:`run_sync` submit coroutines."""

    def __init__(self, name: str = "keyshot-reward-loop"):
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid: int | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop, started if needed (and restarted in a forked child)."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not self._thread.is_alive():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def serve() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                self._thread = threading.Thread(target=serve, name=self.name, daemon=True)
                self._thread.start()
                ready.wait()
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    @property
    def started(self) -> bool:
        """Whether this process has a running loop here (nothing is started by asking)."""
        return self._loop is not None and self._pid == os.getpid() and self._thread.is_alive()

    def owns_current(self) -> bool:
        """Whether the caller runs on this loop's thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from another loop (cancelling the await cancels it there)."""
        if self.owns_current():
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    def run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and wait for it (from any thread but this loop's own)."""
        if self.owns_current():
            coro.close()
            raise RuntimeError("run_sync() called on the reward loop itself; await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        """Stop the loop and join its thread (pending work is cancelled)."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None or self._pid != os.getpid():
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
            with contextlib.suppress(Exception):  # best effort at shutdown
                asyncio.run_coroutine_threadsafe(cancel_all(), loop).result(timeout=5)
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not loop.is_running():
            loop.close()
