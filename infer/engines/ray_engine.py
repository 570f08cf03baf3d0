"""Run one step of keyshot's pipeline over rows on Ray Data: the engine ``keyshot judge``, ``keyshot synth``
and ``keyshot reward filter`` call with ``--engine ray``.

The engine schedules only. A command hands it its items (one row each: a trajectory, a labelling job, a
rollout, pickled: paths, never screenshots) and a *stage*: a picklable factory that builds, once per Ray
actor, the command's own object with an ``async one(item) -> dict`` (its clients with their cache, retries,
breaker and budget; its parsers and records). Ray Data runs the actors (``map_batches`` over an actor pool,
spread over the nodes), retries what a lost worker or node was doing, and applies backpressure; each actor
keeps at most ``per_actor`` items in flight (its own event loop, :class:`_StageActor`). The results come back
to the driver as they are done, which writes them (the command's writer, resumable): nothing but rows and
results passes through the driver.

Usage is counted on the whole cluster by one ledger actor (:class:`ClusterLedger`): every client's ledger
calls go to it, so ``budget_usd`` holds over the cluster exactly as in one process
(:meth:`~keyshot.infer.client.usage.UsageLedger.begin_request`). The same ledger can hold each endpoint's
``max_concurrency`` over the whole cluster (:class:`SlotCaps`): a request takes one of the endpoint's slots
from one gate actor while it is sent, so whichever actor has requests waiting uses what the others leave free
(a cap split into fixed shares per actor leaves slots idle on one actor while another waits).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import pickle
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from keyshot.infer.client.usage import BudgetExceededError, UsageLedger
from keyshot.infer.common.errors import KeyshotError

logger = logging.getLogger(__name__)

#: Tasks (blocks) one actor runs at once (Ray Data's ``max_concurrent_calls_per_actor``), and batches one
#: task has in flight (Ray Data's async map); the actor's own bound (``per_actor``) decides what runs.
TASKS_PER_ACTOR = 4
BATCHES_PER_TASK = 4
#: How long the actors may take to start (a cluster without room for them fails then, naming it).
ACTORS_START_S = 300


class Stage(Protocol):
    """What one actor runs: ``one(item)`` for each item it gets, ``flush()`` after each batch."""

    async def one(self, item: Any) -> dict: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class EnginePlan:
    """How a run is spread: ``actors`` actors (at most one per node unless there are more actors than
    nodes), each with at most ``per_actor`` items in flight and ``cpus`` CPUs reserved."""

    actors: int
    per_actor: int
    cpus: float = 0.25

    @classmethod
    def for_cap(cls, total: int, nodes: int, per_actor: int | None = None, actors: int | None = None):
        """The plan of a run with ``total`` items in flight in all (the one-process run's ``concurrency``)
        over ``nodes`` nodes: one actor per node, the cap shared out; ``per_actor`` sets each actor's own
        cap instead (each node the one-process cap: ``per_actor=total``)."""
        actors = max(1, actors or nodes)
        return cls(actors=actors, per_actor=max(1, per_actor or math.ceil(total / actors)))

    def record(self) -> dict:
        return {"actors": self.actors, "per_actor": self.per_actor}


@dataclass(frozen=True)
class EngineOptions:
    """``--engine ray``'s options: the cluster (``address``; None: a local one keyshot starts and ends) and
    the spread (``actors``, default one per node; ``per_actor``, default the run's cap shared out)."""

    address: str | None = None
    actors: int | None = None
    per_actor: int | None = None

    def plan(self, total: int, nodes: int) -> EnginePlan:
        return EnginePlan.for_cap(total, nodes, per_actor=self.per_actor, actors=self.actors)

    def slot_caps(self, endpoints) -> SlotCaps | None:
        """The caps the cluster's gate holds for ``endpoints``: each endpoint's cap over the whole cluster,
        or None where each actor was given a cap of its own (``--ray-per-actor``: each actor its endpoints'
        whole caps)."""
        return SlotCaps.of(endpoints) if self.per_actor is None else None


ENGINES = ("process", "ray")


def add_engine_arguments(p) -> None:
    """The engine options every command that has one takes (judge, synth, reward filter)."""
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="process",
        help="where the work runs: this process (default) or a Ray cluster (Ray Data; pip install "
        "'keyshot[ray]'; docs/scaling.md)",
    )
    p.add_argument(
        "--ray-address",
        metavar="auto|HOST:PORT",
        help="--engine ray: the cluster to join (its token in RAY_AUTH_TOKEN); default: a local cluster "
        "that ends with keyshot",
    )
    p.add_argument("--ray-actors", type=int, metavar="N", help="--engine ray: actors (default: one per node)")
    p.add_argument(
        "--ray-per-actor",
        type=int,
        metavar="K",
        help="--engine ray: items in flight per actor (default: the run's concurrency shared out over "
        "the actors, so the whole cluster keeps the one-process cap)",
    )


def engine_options(args) -> EngineOptions | None:
    """The parsed engine options: None for this process (refusing Ray's options without --engine ray)."""
    given = [f for f in ("ray_address", "ray_actors", "ray_per_actor") if getattr(args, f) is not None]
    if args.engine != "ray":
        if given:
            flag = "--" + given[0].replace("_", "-")
            raise EngineOptionError(f"{flag} needs --engine ray")
        return None
    for name in ("ray_actors", "ray_per_actor"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise EngineOptionError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return EngineOptions(args.ray_address, args.ray_actors, args.ray_per_actor)


class EngineOptionError(KeyshotError):
    """An engine option that cannot be used."""


class _StageActor:
    """The callable class Ray Data runs on each actor: builds the stage once, then judges each batch's
    items concurrently, at most ``per_actor`` at once over every batch the actor holds."""

    def __init__(self, factory: Callable[[], Stage], per_actor: int, cwd: str):
        os.chdir(cwd)  # the driver's relative paths mean the same here (a shared filesystem)
        self.stage = factory()
        self.per_actor = per_actor
        self.slots: asyncio.Semaphore | None = None

    async def __call__(self, batch: dict) -> dict:
        if self.slots is None:  # the actor's one event loop (Ray Data's async map)
            self.slots = asyncio.Semaphore(self.per_actor)
        slots = self.slots

        async def one(blob: bytes) -> bytes:
            async with slots:
                return pickle.dumps(await self.stage.one(pickle.loads(blob)))

        results = await asyncio.gather(*(one(b) for b in batch["item"]))
        await asyncio.to_thread(self.stage.flush)
        return {"key": list(batch["key"]), "result": list(results)}


def run_rows(
    items: list[tuple[str, Any]],
    factory: Callable[[], Stage],
    plan: EnginePlan,
) -> Iterator[tuple[str, dict]]:
    """``(key, result)`` for each of ``items`` (``(key, item)``, keys unique), in the order they are done.
    A stage that must stop (a spent budget) says so in its results and the caller reads on: every item
    comes back."""
    import ray
    import ray.data

    if not items:
        return
    rows = [{"key": key, "item": pickle.dumps(item)} for key, item in items]
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    # the work starts once every actor is up: the first one up would otherwise take the first blocks of all
    ctx.wait_for_min_actors_s = ACTORS_START_S
    # twice the actor's bound waiting in its running tasks, so a slot that frees is taken at once; a block
    # (what a lost worker redoes) is one task's batches
    batch = max(1, math.ceil(2 * plan.per_actor / (TASKS_PER_ACTOR * BATCHES_PER_TASK)))
    # enough blocks that every actor's tasks have one from the start (a short run's few blocks would all go
    # to the first actor free), and never more than rows
    blocks = min(
        len(rows), max(plan.actors * TASKS_PER_ACTOR, math.ceil(len(rows) / (batch * BATCHES_PER_TASK)))
    )
    ds = ray.data.from_items(rows, override_num_blocks=blocks)
    with warnings.catch_warnings():  # SPREAD has no named parameter yet (Ray 2.60 warns of the kwargs)
        warnings.simplefilter("ignore", DeprecationWarning)
        # Ray Data restarts a lost actor and retries its tasks (max_restarts=-1, max_task_retries=-1)
        ds = ds.map_batches(
            _StageActor,
            fn_constructor_args=(factory, plan.per_actor, os.getcwd()),
            batch_size=batch,
            batch_format="numpy",
            compute=ray.data.ActorPoolStrategy(
                size=plan.actors,
                max_tasks_in_flight_per_actor=TASKS_PER_ACTOR,
                max_concurrent_calls_per_actor=TASKS_PER_ACTOR,
            ),
            num_cpus=plan.cpus,
            scheduling_strategy="SPREAD",  # one actor per node where there are as many nodes
        )
    batches = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
    try:
        for batch in batches:
            for key, blob in zip(batch["key"], batch["result"], strict=True):
                yield str(key), pickle.loads(blob)
    finally:
        batches.close()  # Ray Data ends the run's execution here, before the caller shuts Ray down


# ---------------------------------------------------------------------------- the cluster's ledger
class _LedgerActor:
    """One :class:`UsageLedger` for the whole cluster (a Ray actor: calls are served one at a time)."""

    def __init__(self) -> None:
        self.ledger = UsageLedger()

    def apply(self, method: str, args: tuple, kwargs: dict) -> tuple[str, Any]:
        try:
            return "ok", getattr(self.ledger, method)(*args, **kwargs)
        except BudgetExceededError as exc:
            return "budget", (exc.endpoint, exc.spent_usd, exc.budget_usd, exc.projected_usd)

    def as_dict(self) -> dict:
        return self.ledger.as_dict()

    def ping(self) -> bool:
        return True


#: How long past its endpoint's timeout a slot stays lent: a request holds its slot at most its timeout, so
#: a slot held longer was held by a worker or node that died, and is taken back.
SLOT_LEASE_MARGIN_S = 30.0


@dataclass(frozen=True)
class SlotCaps:
    """The endpoints whose in-flight caps hold over the whole cluster: name -> (cap, lease seconds)."""

    caps: dict[str, tuple[int, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, endpoints) -> SlotCaps:
        """The caps of ``endpoints`` (EndpointConfigs): each its ``max_concurrency``, lent for its
        ``timeout_s`` plus :data:`SLOT_LEASE_MARGIN_S`; two clients of one name (the ledger's key) share the
        sum of their caps, as their requests would in one process."""
        caps: dict[str, tuple[int, float]] = {}
        for e in endpoints:
            cap, lease_s = caps.get(e.name, (0, 0.0))
            caps[e.name] = (cap + e.max_concurrency, max(lease_s, e.timeout_s + SLOT_LEASE_MARGIN_S))
        return cls(caps)


class _GateActor:
    """The cluster's request slots (an async Ray actor: one event loop serves every call). A slot is lent
    to one request and taken back when it is returned or when its lease ends (its holder died)."""

    def __init__(self, caps: SlotCaps):
        self.caps = caps.caps
        self.lent: dict[str, dict[int, float]] = {name: {} for name in self.caps}
        self.changed = asyncio.Condition()
        self.tokens = 0
        self.reclaimed = 0

    def _take_back_expired(self, name: str) -> None:
        now = time.monotonic()
        lent = self.lent[name]
        for token in [t for t, until in lent.items() if until <= now]:
            del lent[token]
            self.reclaimed += 1
            logger.warning("endpoint %r: a request slot outlived its lease (a lost worker): taken back", name)

    async def acquire(self, name: str) -> int:
        cap, lease_s = self.caps[name]
        lent = self.lent[name]
        async with self.changed:
            while True:
                self._take_back_expired(name)
                if len(lent) < cap:
                    self.tokens += 1
                    lent[self.tokens] = time.monotonic() + lease_s
                    return self.tokens
                soonest = min(lent.values()) - time.monotonic()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), timeout=max(0.01, soonest))

    async def release(self, name: str, token: int) -> None:
        async with self.changed:
            if self.lent[name].pop(token, None) is not None:
                self.changed.notify()

    async def state(self) -> dict:
        return {"lent": {n: len(v) for n, v in self.lent.items()}, "reclaimed": self.reclaimed}


class _ClusterSlot:
    """One request's hold on one of its endpoint's cluster-wide slots (``async with``)."""

    def __init__(self, gate: Any, name: str):
        self.gate, self.name, self.token = gate, name, None

    async def __aenter__(self) -> _ClusterSlot:
        self.token = await self.gate.acquire.remote(self.name)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.gate.release.remote(self.name, self.token)  # not awaited: the request goes on at once


class ClusterLedger(UsageLedger):
    """A worker's ledger: each count goes to the cluster's ledger actor (in order: Ray runs one caller's
    calls to an actor in the order sent). Only a request under a budget waits for its answer. With a gate
    (:meth:`create` given caps), each request to a capped endpoint holds one of its cluster-wide slots."""

    def __init__(self, handle: Any, gate: Any = None, gated: frozenset[str] = frozenset()):
        super().__init__()
        self.handle = handle
        self.gate = gate
        self.gated = gated

    @classmethod
    def create(cls, caps: SlotCaps | None = None) -> ClusterLedger:
        """The ledger actor of a new run (and, with ``caps``, its gate actor), on the driver's node (a lost
        worker node loses no count and no slot); they end with the driver."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        handle = ray.remote(num_cpus=0, scheduling_strategy=here)(_LedgerActor).remote()
        if not caps or not caps.caps:
            return cls(handle)
        # every request of the cluster passes here: as many calls in flight as slots, and more waiting
        waiting = max(1000, 4 * sum(cap for cap, _ in caps.caps.values()))
        gate = ray.remote(num_cpus=0, scheduling_strategy=here, max_concurrency=waiting)(_GateActor).remote(
            caps
        )
        return cls(handle, gate, frozenset(caps.caps))

    def request_slot(self, name: str) -> contextlib.AbstractAsyncContextManager:
        if self.gate is None or name not in self.gated:
            return contextlib.nullcontext()
        return _ClusterSlot(self.gate, name)

    def record(self) -> dict:
        """What run.json's engine record says of the caps: held over the cluster (by the gate) or per actor,
        and how many slots the gate took back from holders that died."""
        state = self.gate_state()
        if state is None:
            return {"endpoint_caps": "per actor"}
        return {"endpoint_caps": "cluster", "slots_taken_back": state["reclaimed"]}

    def gate_state(self) -> dict | None:
        """Slots lent now per endpoint, and how many were taken back from lost holders (None: no gate)."""
        import ray

        return None if self.gate is None else ray.get(self.gate.state.remote())

    def _send(self, method: str, *args: Any, **kwargs: Any):
        return self.handle.apply.remote(method, args, kwargs)

    def record_call(self, name: str) -> None:
        self._send("record_call", name)

    def record_cache_hit(self, name: str, saved_cost_usd: float) -> None:
        self._send("record_cache_hit", name, saved_cost_usd)

    def record_failure(self, name: str) -> None:
        self._send("record_failure", name)

    def record_invalid(self, name: str) -> None:
        self._send("record_invalid", name)

    def end_request(self, name: str, **kwargs: Any) -> None:
        self._send("end_request", name, **kwargs)

    def begin_request(self, name: str, budget_usd: float | None, *, is_retry: bool) -> bool:
        ref = self._send("begin_request", name, budget_usd, is_retry=is_retry)
        if budget_usd is None:
            return True
        import ray

        status, value = ray.get(ref)
        if status == "budget":
            raise BudgetExceededError(*value)
        return value

    def flush(self) -> None:
        """Wait until every count sent from here is in the ledger (before a batch's results leave)."""
        import ray

        ray.get(self.handle.ping.remote())

    def as_dict(self) -> dict[str, dict]:
        import ray

        return ray.get(self.handle.as_dict.remote())

    def local(self) -> UsageLedger:
        """The counts as a plain ledger (the summary's)."""
        return UsageLedger.summed([self.as_dict()])

    def __reduce__(self):
        return (ClusterLedger, (self.handle, self.gate, self.gated))
