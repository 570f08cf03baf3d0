"""The one client through which every judge, teacher and scorer call goes (DESIGN.md contract 7).

Payload building (:func:`build_payload`), the call with retries (:class:`JudgeClient`) and the
answer's parsing (callers pass ``validate``) are separate. Requests go through the official ``openai``
client (:mod:`infer.transport`: pooling, timeouts, error classes; no retries or ambient headers of its
own). The client bounds concurrency with a semaphore, gives every request a timeout, retries
429/5xx/timeouts/broken connections/malformed bodies with exponential backoff and jitter (honouring
``Retry-After``), caches well-formed answers (:mod:`infer.cache`) and accounts tokens and cost
(:mod:`infer.usage`). The API key is read from the environment at call time and never appears in
logs, exceptions, reprs or the cache.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import ipaddress
import json
import logging
import os
import random
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import httpx2
import openai

from infer.cache import CachedCompletion, CallCache, cache_key
from infer.errors import EndpointDownError
from infer.redaction import check_env_name, redact, redact_url
from infer.transport import authorization, openai_client
from infer.usage import BudgetExceededError, UsageLedger, token_cost_usd

logger = logging.getLogger(__name__)

__all__ = [
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

RETRYABLE_STATUS = frozenset({408, 409, 429})
#: Non-retryable answers that say the endpoint itself is wrong (key, permission, URL or model), not
#: the request: they count towards the circuit breaker.
ENDPOINT_FAULT_STATUS = frozenset({401, 403, 404})
_REASONING_MODEL = re.compile(r"^(o1|o3|o4|gpt-5)")
_BODY_EXCERPT = 300


class JudgeCallError(RuntimeError):
    """A call failed for good: a non-retryable HTTP error, or retries exhausted."""

    def __init__(self, endpoint: str, message: str, status: int | None = None, attempts: int = 0):
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts
        super().__init__(f"endpoint {endpoint!r}: {message}")


class MissingAPIKeyError(JudgeCallError):
    """The endpoint needs an API key and its environment variable is not set."""


@dataclass
class EndpointConfig:
    """An OpenAI-compatible chat endpoint and how to call it.

    ``api_key_env`` names the environment variable holding the key (the key itself is never
    stored). Prices are USD per million tokens. ``reasoning_model`` overrides the name rule of
    :func:`is_reasoning_model`.

    Fault bounds: a call is retried at most ``max_retries`` times; a run retries at most
    ``max_run_retries`` times in all. The endpoint is declared down (:class:`~infer.errors.EndpointDownError`,
    the run stops) once ``breaker_failures`` requests in a row failed (any call) and none has
    succeeded for ``breaker_window_s`` seconds: a dead endpoint trips within seconds, a flaky one
    whose requests still get through now and then does not.
    """

    base_url: str
    model: str
    api_key_env: str | None = "OPENAI_API_KEY"
    timeout_s: float = 120.0
    max_concurrency: int = 8
    max_retries: int = 6
    max_invalid_retries: int = 2
    backoff_base_s: float = 1.0
    backoff_max_s: float = 60.0
    max_tokens: int = 1024
    temperature: float = 0.0
    seed: int | None = 0
    price_input_per_mtok: float = 0.0
    price_output_per_mtok: float = 0.0
    budget_usd: float | None = None
    extra_body: dict[str, Any] = field(default_factory=dict)
    reasoning_model: bool | None = None
    name: str = ""
    breaker_failures: int = 8
    breaker_window_s: float = 10.0
    max_run_retries: int = 1000

    def __post_init__(self) -> None:
        if not self.name:
            self.name = self.model
        check_env_name(self.api_key_env, f"endpoint {self.name!r}: api_key_env")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(
                f"endpoint {self.name!r}: base_url must start with http:// or https://, "
                f"got {redact_url(self.base_url)!r}"
            )
        if self.breaker_failures < 1 or self.breaker_window_s < 0:
            raise ValueError(
                f"endpoint {self.name!r}: breaker_failures must be >= 1 and breaker_window_s >= 0"
            )
        if self.max_run_retries < 0:
            raise ValueError(f"endpoint {self.name!r}: max_run_retries must be >= 0")
        if self.max_tokens < 1:
            raise ValueError(f"endpoint {self.name!r}: max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= 2:
            raise ValueError(
                f"endpoint {self.name!r}: temperature must be within [0, 2], got {self.temperature}"
            )
        if self.max_concurrency < 1:
            raise ValueError(f"endpoint {self.name!r}: max_concurrency must be >= 1")
        if self.timeout_s <= 0:
            raise ValueError(f"endpoint {self.name!r}: timeout_s must be > 0")
        if self.max_retries < 0 or self.max_invalid_retries < 0:
            raise ValueError(f"endpoint {self.name!r}: retry limits must be >= 0")

    @property
    def display_url(self) -> str:
        """``base_url`` as it may be printed or written (credentials redacted)."""
        return redact_url(self.base_url)

    @property
    def is_reasoning(self) -> bool:
        return is_reasoning_model(self.model, self.reasoning_model)

    def needs_api_key(self) -> bool:
        """Remote endpoints need a key; loopback, private-network and bare host names may have none."""
        host = (urlparse(self.base_url).hostname or "").lower()
        if host in ("localhost", "") or "." not in host and ":" not in host:
            return False
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return not host.endswith((".local", ".localhost", ".internal"))
        return not (addr.is_loopback or addr.is_private or addr.is_unspecified)

    def api_key(self) -> str | None:
        """The key from the environment, None for keyless local endpoints; raises if a needed key is missing."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if key:
            return key
        if self.needs_api_key():
            raise MissingAPIKeyError(
                self.name,
                f"environment variable {self.api_key_env} is not set; it must hold the API key for "
                f"{self.display_url} (or set api_key_env to null for an endpoint without keys)",
            )
        return None


def is_reasoning_model(model: str, override: bool | None = None) -> bool:
    """True for OpenAI reasoning models (o1*, o3*, o4*, gpt-5*), which take
    ``max_completion_tokens`` and reject ``temperature``. ``override`` wins when given."""
    if override is not None:
        return override
    return bool(_REASONING_MODEL.match(model.lower().rsplit("/", 1)[-1]))


def build_payload(
    endpoint: EndpointConfig,
    messages: list[dict],
    *,
    max_tokens: int | None = None,
    logprobs: int | None = None,
) -> dict[str, Any]:
    """The JSON body of one chat-completions request. ``logprobs=k`` asks for the generated
    tokens' log-probabilities with the ``k`` most likely alternatives each."""
    body: dict[str, Any] = {"model": endpoint.model, "messages": messages}
    limit = endpoint.max_tokens if max_tokens is None else max_tokens
    if endpoint.is_reasoning:
        body["max_completion_tokens"] = limit
    else:
        body["max_tokens"] = limit
        body["temperature"] = endpoint.temperature
    if endpoint.seed is not None:
        body["seed"] = endpoint.seed
    if logprobs is not None:
        body["logprobs"] = True
        body["top_logprobs"] = logprobs
    body.update(endpoint.extra_body)
    return body


def _answer_params(payload: dict[str, Any]) -> dict[str, Any]:
    """Everything in the body except model and messages: the parameters that change the answer."""
    return {k: v for k, v in payload.items() if k not in ("model", "messages")}


@dataclass
class Completion:
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


class _Transient(Exception):
    """A failure worth retrying: ``delay_s`` is the server's Retry-After, if it sent one."""

    def __init__(self, reason: str, delay_s: float | None = None, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s
        self.status = status


@dataclass
class _Answer:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str
    logprobs: list[dict] | None


def retry_after_s(headers: httpx2.Headers) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _parse_logprobs(choice: dict) -> list[dict] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
        return None
    out = []
    for item in lp["content"]:
        out.append(
            {
                "token": item.get("token"),
                "logprob": item.get("logprob"),
                "top_logprobs": [
                    {"token": t.get("token"), "logprob": t.get("logprob")}
                    for t in item.get("top_logprobs") or []
                ],
            }
        )
    return out


def _parse_body(raw: bytes, fallback_model: str) -> _Answer:
    """Read a 200 response; raises _Transient for bodies that are empty or not a chat completion."""
    if not raw.strip():
        raise _Transient("empty response body")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _Transient(f"response body is not JSON ({exc.msg if hasattr(exc, 'msg') else exc})") from None
    if not isinstance(data, dict):
        raise _Transient("response body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise _Transient("response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise _Transient("response choice has no message")
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise _Transient("response message content is not a string")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return _Answer(
        text=content,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        model=str(data.get("model") or fallback_model),
        logprobs=_parse_logprobs(choice),
    )


class Breaker:
    """The circuit breaker of an endpoint (or of a pool of them).

    It trips (:class:`~infer.errors.EndpointDownError`) once ``failures`` requests in a row failed and
    none has been answered for ``window_s`` seconds, counted from the first request: a dead endpoint trips
    within seconds, a flaky one whose requests still get through now and then does not. Once tripped it
    stays down (every later request raises at once) until :meth:`reset`.
    """

    def __init__(self, name: str, url: str, failures: int, window_s: float):
        self.name, self.url, self.failures, self.window_s = name, url, failures, window_s
        self.in_a_row = 0
        self.last_good: float | None = None
        self.down: EndpointDownError | None = None

    def started(self) -> None:
        """A request is about to be sent: the quiet time counts from the first one."""
        if self.down is not None:
            raise self.down
        if self.last_good is None:
            self.last_good = time.monotonic()

    def failed(self, reason: str, *, may_trip: bool = True) -> None:
        """Count a failed request; raises EndpointDownError when the breaker is (or now goes) down."""
        self.in_a_row += 1
        quiet_s = time.monotonic() - (self.last_good or time.monotonic())
        if self.down is None and may_trip and self.in_a_row >= self.failures and quiet_s >= self.window_s:
            self.down = EndpointDownError(self.name, self.url, self.in_a_row, reason)
            logger.error("%s", self.down)
        if self.down is not None:
            raise self.down

    def answered(self) -> None:
        self.in_a_row = 0
        self.last_good = time.monotonic()

    def reset(self) -> None:
        """Close a tripped breaker (a pool tries an endpoint again after its cool-down)."""
        self.down = None
        self.in_a_row = 0


class InFlight:
    """Identical requests in flight at the same time are sent once: the others wait for that answer,
    which they get as ``cached`` at no cost."""

    def __init__(self) -> None:
        self._pending: dict[str, asyncio.Future] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(
        self,
        key: str,
        send: Callable[[], Awaitable[Completion]],
        shared: Callable[[Completion], object] = lambda first: None,
    ) -> Completion:
        """``send()`` unless the same ``key`` is on its way; ``shared(first)`` is called for each waiter."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._pending, self._loop = {}, loop
        pending = self._pending.get(key)
        if pending is not None:  # the same request is already on its way: wait for its answer, pay once
            first: Completion = await asyncio.shield(pending)
            shared(first)
            return dataclasses.replace(
                first, cached=True, cost_usd=0.0, attempts=0, saved_cost_usd=first.cost_usd
            )
        future: asyncio.Future = loop.create_future()
        self._pending[key] = future
        try:
            result = await send()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: waiters get it, nobody else needs to
            raise
        else:
            future.set_result(result)
            return result
        finally:
            self._pending.pop(key, None)


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
        self._rng = rng or random.Random()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._api: openai.AsyncOpenAI | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self.breaker = Breaker(
            endpoint.name, endpoint.display_url, endpoint.breaker_failures, endpoint.breaker_window_s
        )
        self._run_retries = 0
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
    ) -> str:
        """The cache key :meth:`complete` uses for these arguments."""
        payload = build_payload(self.endpoint, messages, max_tokens=max_tokens, logprobs=logprobs)
        return cache_key(self.endpoint.model, prompt_version, messages, _answer_params(payload))

    async def complete(
        self,
        messages: list[dict],
        *,
        prompt_version: str,
        max_tokens: int | None = None,
        logprobs: int | None = None,
        validate: Callable[[str], str | None] | None = None,
    ) -> Completion:
        """One chat completion, from the cache or the endpoint.

        Identical requests in flight at the same time are sent once: the others wait for that
        answer (returned to them as ``cached``, at no cost). ``validate(text)`` returns an error string
        for a malformed answer; such an answer is asked
        again up to ``max_invalid_retries`` times, and if it stays malformed the last one is returned
        with ``valid=False`` and the error (never cached). Raises :class:`JudgeCallError` when the
        endpoint fails for good and :class:`BudgetExceededError` when the budget is spent.
        """
        payload = build_payload(self.endpoint, messages, max_tokens=max_tokens, logprobs=logprobs)
        key = cache_key(self.endpoint.model, prompt_version, messages, _answer_params(payload))

        def shared(first: Completion) -> Completion:
            self.ledger.record_cache_hit(self.endpoint.name, first.cost_usd)
            return first

        return await self._in_flight.run(
            key, lambda: self._complete(payload, key, prompt_version, validate), shared
        )

    async def _complete(
        self,
        payload: dict[str, Any],
        key: str,
        prompt_version: str,
        validate: Callable[[str], str | None] | None,
    ) -> Completion:
        """One call without coalescing: the cache, else the endpoint (see :meth:`complete`)."""
        ep = self.endpoint
        if self.cache is None:
            return await self._call(payload, key, prompt_version, validate)
        hit = await self._claim_or_wait(key)
        if hit is not None:
            self.ledger.record_cache_hit(ep.name, hit.cost_usd)
            logger.debug("endpoint %r: cache hit %s", ep.name, key[:12])
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
            )
        try:
            return await self._call(payload, key, prompt_version, validate)
        finally:
            self.cache.release(key)

    async def _claim_or_wait(self, key: str) -> CachedCompletion | None:
        """The cached answer, or None once this process holds the claim to pay for it. While another
        process sharing the cache file pays for the same call, wait for its answer (or its failure)."""
        ep, delay = self.endpoint, 0.05
        stale_s = ep.timeout_s * (ep.max_retries + 1) + 60.0  # no live call holds a claim longer
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

    async def _call(
        self,
        payload: dict[str, Any],
        key: str,
        prompt_version: str,
        validate: Callable[[str], str | None] | None,
    ) -> Completion:
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
            except _Transient as exc:
                transient_failures += 1
                self.breaker.failed(exc.reason)
                self._run_retries += 1
                if self._run_retries > ep.max_run_retries:
                    self.ledger.record_failure(ep.name)
                    raise JudgeCallError(
                        ep.name,
                        f"the run's retry budget ({ep.max_run_retries}) is spent; last error: {exc.reason}",
                        status=exc.status,
                        attempts=attempts,
                    ) from None
                if transient_failures > ep.max_retries:
                    self.ledger.record_failure(ep.name)
                    raise JudgeCallError(
                        ep.name,
                        f"gave up after {attempts} attempts; last error: {exc.reason}",
                        status=exc.status,
                        attempts=attempts,
                    ) from None
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
                if exc.status in ENDPOINT_FAULT_STATUS:
                    self.breaker.failed(str(exc))
                raise

            self.breaker.answered()
            spent += cost
            error = validate(answer.text) if validate is not None else None
            if error is not None and invalid_answers < ep.max_invalid_retries:
                invalid_answers += 1
                logger.debug("endpoint %r: malformed answer (%s); asking again", ep.name, error)
                continue
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
            )
            if error is not None:
                self.ledger.record_invalid(ep.name)
                logger.warning(
                    "endpoint %r: answer still malformed after %d tries: %s", ep.name, attempts, error
                )
            elif self.cache is not None:
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
        ep = self.endpoint
        if retry_after is not None:
            return min(retry_after, ep.backoff_max_s)
        ceiling = min(ep.backoff_max_s, ep.backoff_base_s * 2 ** (failure_no - 1))
        return ceiling * self._rng.uniform(0.5, 1.0)

    async def _send(
        self, payload: dict[str, Any], api_key: str | None, *, is_retry: bool
    ) -> tuple[_Answer, float]:
        """One HTTP request under the semaphore and the per-call timeout."""
        ep = self.endpoint
        api, semaphore = self._resources()
        async with semaphore:
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
                except (asyncio.TimeoutError, openai.APITimeoutError):
                    raise _Transient(f"no answer within {ep.timeout_s:g}s") from None
                except openai.APIConnectionError as exc:
                    cause = exc.__cause__ or exc
                    raise _Transient(
                        f"connection error: {type(cause).__name__}: {redact(str(cause), [api_key])}"
                    ) from None
                except openai.APIStatusError as exc:
                    response = exc.response
                status = response.status_code
                if status == 200:
                    answer = _parse_body(response.content, ep.model)
                    cost = token_cost_usd(
                        answer.prompt_tokens,
                        answer.completion_tokens,
                        ep.price_input_per_mtok,
                        ep.price_output_per_mtok,
                    )
                    paid = True
                    return answer, cost
                excerpt = redact(response.text[:_BODY_EXCERPT], [api_key]).replace("\n", " ")
                if status in RETRYABLE_STATUS or status >= 500:
                    raise _Transient(
                        f"HTTP {status}: {excerpt}", delay_s=retry_after_s(response.headers), status=status
                    )
                raise JudgeCallError(ep.name, f"HTTP {status}: {excerpt}", status=status)
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
