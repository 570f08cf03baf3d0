"""A pool of scorer endpoints serving one model: each call goes to the least-loaded live endpoint.

``scorer.endpoints: [...]`` in a judge config (several ``keyshot serve`` replicas, one per GPU or
node) builds an :class:`EndpointPool`, which callers use exactly as one :class:`~keyshot.infer.client.judge_client.JudgeClient`.

* **Routing**: the live endpoint with the fewest requests in flight (ties: the least used so far).
* **Fail-over** (the retry policy's, :mod:`keyshot.infer.client.retry`): an endpoint that fails a
  request (connection refused, timeout, 5xx, 429, its circuit breaker) is taken out for ``cooldown_s`` and the request goes to another one at once; after the
  cool-down it is tried again. Only when every endpoint is out and none has answered for the breaker
  window does the pool itself give up (:class:`~keyshot.infer.common.errors.EndpointDownError`, the run stops and
  resumes later), so no trajectory is lost, and none is judged twice.
* **One answer per request**: members share the call cache (one model, so one cache key), and
  identical requests in flight at once are sent once, whichever endpoint would take them.
* **Accounting**: each endpoint is its own row in the usage ledger (``model@host:port``), so the run
  summary shows calls and errors per endpoint.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from keyshot.infer.client.breaker import Breaker
from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.endpoint import EndpointConfig, JudgeCallError
from keyshot.infer.client.judge_client import Completion, InFlight, JudgeClient
from keyshot.infer.client.retry import POOL_MEMBER_RETRIES, fails_over, pool_attempts
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import ConfigError
from keyshot.infer.common.errors import EndpointDownError

logger = logging.getLogger(__name__)

DEFAULT_COOLDOWN_S = 30.0


def member_configs(endpoints: list[EndpointConfig]) -> list[EndpointConfig]:
    """The pool's endpoints, each named ``model@host:port`` and failing over instead of retrying.

    Raises ConfigError when they do not serve one model (their answers would not be interchangeable).
    """
    models = sorted({ep.model for ep in endpoints})
    if len(models) != 1:
        raise ConfigError(
            f"scorer.endpoints must all serve one model (one cache, one protocol), got {models}"
        )
    if any(ep.budget_usd is not None for ep in endpoints):
        raise ConfigError(
            "a pool of endpoints cannot carry budget_usd (each replica would get the whole budget): pools are "
            "for self-hosted servers; cap the paid judge instead"
        )
    out = []
    for ep in endpoints:
        url = urlparse(ep.base_url)
        name = f"{ep.name}@{url.hostname}:{url.port or ''}".rstrip(":")
        out.append(dataclasses.replace(ep, name=name, max_retries=POOL_MEMBER_RETRIES))
    names = [ep.name for ep in out]
    if len(set(names)) != len(names):
        raise ValueError(f"scorer.endpoints: the same endpoint is listed twice ({names})")
    return out


@dataclass
class _Member:
    client: JudgeClient
    in_flight: int = 0
    used: int = 0
    out_until: float = 0.0
    last_error: str | None = None

    @property
    def name(self) -> str:
        return self.client.endpoint.name


class EndpointPool:
    """Several endpoints, one model; the :class:`~keyshot.infer.client.judge_client.JudgeClient` interface.

    Args:
        endpoints: the endpoints (same model; see :func:`member_configs`).
        cache: the shared call cache.
        ledger: the shared usage ledger (one row per endpoint).
        cooldown_s: how long an endpoint that failed is left out before it is tried again.
    """

    def __init__(
        self,
        endpoints: list[EndpointConfig],
        cache: CallCache | None = None,
        ledger: UsageLedger | None = None,
        *,
        cooldown_s: float = DEFAULT_COOLDOWN_S,
    ):
        if not endpoints:
            raise ValueError("an endpoint pool needs at least one endpoint")
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.cache = cache
        self.members = [_Member(JudgeClient(ep, cache, self.ledger)) for ep in member_configs(endpoints)]
        self.endpoint = ep = endpoints[0]  # the model, generation settings and breaker bounds of the pool
        self.cooldown_s = cooldown_s
        self._in_flight = InFlight()
        urls = ", ".join(m.client.endpoint.display_url for m in self.members)
        # the pool's own breaker: it trips only when every endpoint is out and none answers
        self.breaker = Breaker(
            f"{ep.model} (pool of {len(self.members)})", urls, ep.breaker_failures, ep.breaker_window_s
        )

    def __repr__(self) -> str:
        return f"EndpointPool({[m.name for m in self.members]})"

    def key_for(self, messages: list[dict], **kwargs: Any) -> str:
        return self.members[0].client.key_for(messages, **kwargs)

    def _pick(self) -> _Member | None:
        now = time.monotonic()
        live = [m for m in self.members if m.out_until <= now]
        if not live:
            return None
        member = min(live, key=lambda m: (m.in_flight, m.used))
        if member.client.down is not None:  # back from its cool-down: its breaker starts afresh
            member.client.breaker.reset()
        return member

    def _take_out(self, member: _Member, reason: str) -> None:
        member.last_error = reason
        if member.out_until <= time.monotonic():
            others = sum(1 for m in self.members if m is not member and m.out_until <= time.monotonic())
            logger.warning(
                "endpoint %s taken out for %.0f s (%s); %d other endpoint(s) carry on",
                member.name,
                self.cooldown_s,
                reason,
                others,
            )
        member.out_until = time.monotonic() + self.cooldown_s
        self.breaker.failed(reason, may_trip=all(m.out_until > time.monotonic() for m in self.members))

    async def complete(self, messages: list[dict], **kwargs: Any) -> Completion:
        """One chat completion from the cache or the least-loaded live endpoint (see the module doc)."""
        key = self.key_for(
            messages,
            **{
                k: kwargs.get(k)
                for k in ("prompt_version", "max_tokens", "logprobs", "answer_format")
                if k in kwargs
            },
        )
        return await self._in_flight.run(key, lambda: self._route(messages, kwargs))

    async def _route(self, messages: list[dict], kwargs: dict[str, Any]) -> Completion:
        self.breaker.started()
        attempts_left = pool_attempts(self.endpoint, len(self.members))
        while True:
            member = self._pick()
            if member is None:  # every endpoint is cooling down: wait for the first to come back
                wake = min(m.out_until for m in self.members) - time.monotonic()
                await asyncio.sleep(max(0.05, min(wake, 5.0)))
                continue
            member.in_flight += 1
            member.used += 1
            try:
                completion = await member.client.complete(messages, **kwargs)
            except EndpointDownError as exc:
                self._take_out(member, exc.last_error)
            except JudgeCallError as exc:
                if not fails_over(exc):
                    raise
                self._take_out(member, str(exc))
                attempts_left -= 1
                if attempts_left <= 0:
                    raise
            else:
                self.breaker.answered()
                return completion
            finally:
                member.in_flight -= 1

    async def aclose(self) -> None:
        for m in self.members:
            await m.client.aclose()
