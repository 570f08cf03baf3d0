"""The one client through which every judge, teacher and scorer call goes (docs/architecture.md, "One call path").

Payload building (:func:`build_payload`), the call with retries (:class:`JudgeClient`) and the
answer's parsing (callers pass ``validate``) are separate. Requests go through the official ``openai``
client (:mod:`keyshot.infer.client.transport`: pooling, timeouts, error classes; no retries or ambient headers of its
own). The client bounds concurrency with a semaphore, gives every request a timeout, retries what
the retry policy says to, as long as it says to (:mod:`keyshot.infer.client.retry`), caches well-formed answers (:mod:`keyshot.infer.client.cache`) and accounts tokens and cost
(:mod:`keyshot.infer.client.usage`). An answer cut by its token limit comes back with ``cut=True`` and ``valid=False``
(docs/architecture.md, "A verdict needs evidence"), from the endpoint or from the cache alike; it is never asked again. The API key
is read from the environment at call time and never appears in logs, exceptions, reprs or the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Any

import httpx2
import openai

from keyshot.infer.client.breaker import Breaker
from keyshot.infer.client.cache import CachedCompletion, CallCache, cache_key
from keyshot.infer.client.endpoint import (
    EndpointConfig,
    JudgeCallError,
    MissingAPIKeyError,
    answer_params,
    build_payload,
    is_reasoning_model,
)
from keyshot.infer.client.replies import BODY_EXCERPT, Answer, answer_cut, parse_body, retry_after_s
from keyshot.infer.client.retry import (
    RetryPolicy,
    Transient,
    counts_against_endpoint,
    status_failure,
    transient,
)
from keyshot.infer.client.transport import authorization, openai_client
from keyshot.infer.client.usage import BudgetExceededError, UsageLedger, token_cost_usd
from keyshot.infer.common.errors import EndpointDownError
from keyshot.infer.common.redaction import redact
from keyshot.infer.protocol.answer_format import AnswerFormat

logger = logging.getLogger(__name__)

__all__ = [  # the endpoint's names too, so that callers need one import
    "BudgetExceededError",
    "Completion",
    "EndpointDownError",
    "EndpointConfig",
    "JudgeCallError",
    "JudgeClient",
    "MissingAPIKeyError",
    "build_payload",
    "is_reasoning_model",
]


@dataclass
class Completion:
    """One answer. ``cut``: it was cut by its token limit (``valid`` is then False and ``error`` says so)."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    cached: bool
    attempts: int
    model: str
    valid: bool = True
    error: str | None = None
    logprobs: list[dict] | None = None
    saved_cost_usd: float = 0.0
    cut: bool = False


def cut_error(completion_tokens: int, limit: int | None) -> str:
    """What a cut answer's ``error`` says."""
    return f"answer cut by max_tokens after {completion_tokens} tokens (limit {limit})"


def token_limit(payload: dict[str, Any]) -> int | None:
    """The answer length limit a request body asks for."""
    return payload.get("max_completion_tokens") or payload.get("max_tokens")


Payload = dict[str, Any]
#: Checks an answer's text: an error string for a malformed answer, None for a good one.
Validate = Callable[[str], str | None] | None


def shared_answer(first: Completion) -> Completion:
    """The answer as a request that waited for an identical one gets it: cached, at no cost."""
    return dataclasses.replace(first, cached=True, cost_usd=0.0, attempts=0, saved_cost_usd=first.cost_usd)


class InFlight:
    """Identical requests in flight at the same time are sent once: the others wait for that answer,
    which they get through ``waiter`` (by default :func:`shared_answer`). ``keep(result)`` keeps a
    result for later identical requests too (synthesis keeps a malformed answer, which the call
    cache does not hold)."""

    def __init__(self) -> None:
        self._pending: dict[Hashable, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(
        self,
        key: Hashable,
        send: Callable[[], Awaitable[Any]],
        waiter: Callable[[Any], Any] = shared_answer,
        *,
        keep: Callable[[Any], bool] = lambda result: False,
    ) -> Any:
        """``send()`` unless the same ``key`` is on its way (or kept): then ``waiter(first)``."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._pending, self._loop = {}, loop
        pending = self._pending.get(key)
        if pending is not None:  # the same request is already on its way: wait for its answer, pay once
            return waiter(await asyncio.shield(pending))
        future: asyncio.Future = loop.create_future()
        self._pending[key] = future
        try:
            result = await send()
        except BaseException as exc:
            self._pending.pop(key, None)
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters get it, nobody else needs to
            raise
        future.set_result(result)
        if not keep(result):
            self._pending.pop(key, None)
        return result


class JudgeClient:
    """Async client of one OpenAI-compatible endpoint.

    Args:
        endpoint: where and how to call.
        cache: a shared :class:`CallCache`, or None for no caching.
        ledger: a shared :class:`UsageLedger` (one is created if None).
        rng: random source for backoff jitter (seed it for reproducible timing in tests).
    """

    def __init__(
        self,
        endpoint: EndpointConfig,
        cache: CallCache | None = None,
        ledger: UsageLedger | None = None,
        rng: random.Random | None = None,
    ):
        self.endpoint = endpoint
        self.cache = cache
        self.ledger = ledger if ledger is not None else UsageLedger()
        self.retry = RetryPolicy(endpoint, rng)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._api: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.breaker = Breaker(
            endpoint.name, endpoint.display_url, endpoint.breaker_failures, endpoint.breaker_window_s
        )
        self._in_flight = InFlight()  # identical requests in flight share one answer
        if endpoint.budget_usd is not None and not (
            endpoint.price_input_per_mtok or endpoint.price_output_per_mtok
        ):
            logger.warning("endpoint %r has a budget but no prices: the budget never binds", endpoint.name)

    def __repr__(self) -> str:
        return f"JudgeClient({self.endpoint.name!r}, url={self.endpoint.display_url!r})"

    @property
    def down(self) -> EndpointDownError | None:
        """Why the endpoint is declared down (its breaker tripped), or None."""
        return self.breaker.down

    # ------------------------------------------------------------------ loop-bound resources
    def _resources(self) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._api is None or self._semaphore is None:
            ep = self.endpoint
            self._api = openai_client(ep.base_url, timeout_s=ep.timeout_s, max_connections=ep.max_concurrency)
            self._semaphore = asyncio.Semaphore(ep.max_concurrency)
            self._loop = loop
        return self._api, self._semaphore

    async def aclose(self) -> None:
        if self._api is not None and self._loop is asyncio.get_running_loop():
            await self._api.close()
        self._api = None
        self._semaphore = None
        self._loop = None

    async def __aenter__(self) -> JudgeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------ the call
    def key_for(
        self,
        messages: list[dict],
        *,
        prompt_version: str,
        max_tokens: int | None = None,
        logprobs: int | None = None,
        answer_format: AnswerFormat | None = None,
    ) -> str:
        """The cache key :meth:`complete` uses for these arguments."""
        payload = build_payload(
            self.endpoint, messages, max_tokens=max_tokens, logprobs=logprobs, answer_format=answer_format
        )
        return cache_key(self.endpoint.model, prompt_version, messages, answer_params(payload))

    async def complete(
        self,
        messages: list[dict],
        *,
        prompt_version: str,
        max_tokens: int | None = None,
        logprobs: int | None = None,
        validate: Callable[[str], str | None] | None = None,
        answer_format: AnswerFormat | None = None,
    ) -> Completion:
        """One chat completion, from the cache or the endpoint.

        Identical requests in flight at the same time are sent once: the others wait for that
        answer (returned to them as ``cached``, at no cost). ``validate(text)`` returns an error string
        for a malformed answer; such an answer is asked
        again up to ``max_invalid_retries`` times, and if it stays malformed the last one is returned
        with ``valid=False`` and the error (never cached). An answer cut by the token limit is returned
        at once with ``cut=True`` and ``valid=False`` (cached: a re-run reads it as cut again). Raises
        :class:`JudgeCallError` when the endpoint fails for good and :class:`BudgetExceededError` when
        the budget is spent. ``answer_format``: the call's format, held to on a ``constrained`` endpoint
        (:func:`~keyshot.infer.client.endpoint.build_payload`).
        """
        payload = build_payload(
            self.endpoint, messages, max_tokens=max_tokens, logprobs=logprobs, answer_format=answer_format
        )
        key = cache_key(self.endpoint.model, prompt_version, messages, answer_params(payload))

        def shared(first: Completion) -> Completion:
            self.ledger.record_cache_hit(self.endpoint.name, first.cost_usd)
            return shared_answer(first)

        return await self._in_flight.run(
            key, lambda: self._complete(payload, key, prompt_version, validate), shared
        )

    async def _complete(
        self, payload: Payload, key: str, prompt_version: str, validate: Validate
    ) -> Completion:
        """One call without coalescing: the cache, else the endpoint (see :meth:`complete`)."""
        ep = self.endpoint
        if self.cache is None:
            return await self._call(payload, key, prompt_version, validate)
        hit = await self._claim_or_wait(key)
        if hit is not None:
            self.ledger.record_cache_hit(ep.name, hit.cost_usd)
            logger.debug("endpoint %r: cache hit %s", ep.name, key[:12])
            limit = token_limit(payload)
            cut = answer_cut(hit.finish_reason, hit.completion_tokens, limit)
            return Completion(
                text=hit.text,
                finish_reason=hit.finish_reason,
                prompt_tokens=hit.prompt_tokens,
                completion_tokens=hit.completion_tokens,
                cost_usd=0.0,
                cached=True,
                attempts=0,
                model=hit.model,
                logprobs=hit.logprobs,
                saved_cost_usd=hit.cost_usd,
                valid=not cut,
                error=cut_error(hit.completion_tokens, limit) if cut else None,
                cut=cut,
            )
        try:
            return await self._call(payload, key, prompt_version, validate)
        finally:
            self.cache.release(key)

    async def _claim_or_wait(self, key: str) -> CachedCompletion | None:
        """The cached answer, or None once this process holds the claim to pay for it. While another
        process sharing the cache file pays for the same call, wait for its answer (or its failure)."""
        ep, delay = self.endpoint, 0.05
        stale_s = ep.timeout_s * self.retry.max_attempts + 60.0  # no live call holds a claim longer
        while True:
            if self.down is not None:
                raise self.down
            hit = self.cache.get(key)
            if hit is not None:
                return hit
            if self.cache.claim(key, stale_s):
                hit = self.cache.get(key)  # answered between the look and the claim
                if hit is not None:
                    self.cache.release(key)
                return hit
            logger.debug("endpoint %r: %s is being paid for by another process; waiting", ep.name, key[:12])
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _call(self, payload: Payload, key: str, prompt_version: str, validate: Validate) -> Completion:
        """The call itself: retries, breaker, budget, the answer checked and cached."""
        ep = self.endpoint
        self.breaker.started()
        api_key = ep.api_key()
        self.ledger.record_call(ep.name)

        attempts = 0
        transient_failures = 0
        invalid_answers = 0
        spent = 0.0  # every paid answer of this call, malformed ones included
        while True:
            attempts += 1
            if self.down is not None:  # tripped by another call while this one waited
                raise self.down
            try:
                answer, cost = await self._send(payload, api_key, is_retry=attempts > 1)
            except Transient as exc:
                transient_failures += 1
                self.breaker.failed(exc.reason)
                final = self.retry.give_up(exc, transient_failures, attempts)
                if final is not None:
                    self.ledger.record_failure(ep.name)
                    raise final from None
                delay = self._delay(transient_failures, exc.delay_s)
                logger.debug(
                    "endpoint %r: attempt %d failed (%s); retrying in %.2fs",
                    ep.name,
                    attempts,
                    exc.reason,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            except JudgeCallError as exc:
                exc.attempts = attempts
                self.ledger.record_failure(ep.name)
                if counts_against_endpoint(exc.status):
                    self.breaker.failed(str(exc))
                raise

            self.breaker.answered()
            spent += cost
            limit = token_limit(payload)
            cut = answer_cut(answer.finish_reason, answer.completion_tokens, limit)
            error = validate(answer.text) if validate is not None and not cut else None
            if self.retry.ask_again(error, cut, invalid_answers):
                invalid_answers += 1
                logger.debug("endpoint %r: malformed answer (%s); asking again", ep.name, error)
                continue
            if cut:
                error = cut_error(answer.completion_tokens, limit)
                logger.debug("endpoint %r: %s", ep.name, error)
            completion = Completion(
                text=answer.text,
                finish_reason=answer.finish_reason,
                prompt_tokens=answer.prompt_tokens,
                completion_tokens=answer.completion_tokens,
                cost_usd=spent,
                cached=False,
                attempts=attempts,
                model=answer.model,
                valid=error is None,
                error=error,
                logprobs=answer.logprobs,
                cut=cut,
            )
            if error is not None and not cut:
                self.ledger.record_invalid(ep.name)
                logger.warning(
                    "endpoint %r: answer still malformed after %d tries: %s", ep.name, attempts, error
                )
            elif self.cache is not None:  # a cut answer too: it is read as cut again from the cache
                self.cache.put(
                    key,
                    model=answer.model,
                    prompt_version=prompt_version,
                    text=answer.text,
                    finish_reason=answer.finish_reason,
                    prompt_tokens=answer.prompt_tokens,
                    completion_tokens=answer.completion_tokens,
                    cost_usd=cost,
                    logprobs=answer.logprobs,
                )
            return completion

    def complete_sync(self, messages: list[dict], **kwargs: Any) -> Completion:
        """Blocking :meth:`complete` for scripts and notebooks (not from inside an event loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            raise RuntimeError("complete_sync() called inside a running event loop; await complete() instead")

        async def _once() -> Completion:
            try:
                return await self.complete(messages, **kwargs)
            finally:
                await self.aclose()

        return asyncio.run(_once())

    def _delay(self, failure_no: int, retry_after: float | None) -> float:
        return self.retry.delay(failure_no, retry_after)

    async def _send(
        self, payload: dict[str, Any], api_key: str | None, *, is_retry: bool
    ) -> tuple[Answer, float]:
        """One HTTP request under the semaphore (and the ledger's slot: a cluster's cap) and the per-call
        timeout."""
        ep = self.endpoint
        api, semaphore = self._resources()
        async with semaphore, self.ledger.request_slot(ep.name):
            while not self.ledger.begin_request(ep.name, ep.budget_usd, is_retry=is_retry):
                await asyncio.sleep(0.005)  # under a budget, the first priced answer is awaited
            paid, answer, cost = False, None, 0.0
            try:
                request = api.post(
                    "/chat/completions",
                    cast_to=httpx2.Response,
                    body=payload,
                    options={"headers": authorization(api_key)},
                )
                try:
                    response = await asyncio.wait_for(request, timeout=ep.timeout_s)
                    if response.status_code == 200:
                        answer = parse_body(response.content, ep.model)
                except openai.APIStatusError as exc:
                    response = exc.response
                except Exception as exc:
                    failure = transient(exc, timeout_s=ep.timeout_s, secrets=[api_key])
                    if failure is None:
                        raise
                    raise failure from None
                status = response.status_code
                if status == 200:
                    cost = token_cost_usd(
                        answer.prompt_tokens,
                        answer.completion_tokens,
                        ep.price_input_per_mtok,
                        ep.price_output_per_mtok,
                    )
                    paid = True
                    return answer, cost
                excerpt = redact(response.text[:BODY_EXCERPT], [api_key]).replace("\n", " ")
                raise status_failure(ep.name, status, excerpt, retry_after_s(response.headers))
            finally:
                if paid and answer is not None:
                    self.ledger.end_request(
                        ep.name,
                        paid=True,
                        prompt_tokens=answer.prompt_tokens,
                        completion_tokens=answer.completion_tokens,
                        cost_usd=cost,
                    )
                else:
                    self.ledger.end_request(ep.name)
