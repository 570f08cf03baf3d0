"""The retry policy of every endpoint call: which failures are retried, how long to wait, how many times.

* **Retried** (:class:`Transient`): HTTP 408, 409, 429 and every 5xx, no answer within ``timeout_s``,
  a broken connection, and a 200 whose body is not a chat completion (empty, not JSON, no choices, no
  message). Any other status fails the call at once; 401/403/404 say the endpoint itself is wrong
  (key, permission, URL or model) and count towards its circuit breaker.
* **Malformed answers** (a well-formed completion that the caller's ``validate`` rejects) are asked
  again up to ``max_invalid_retries`` times. **A cut answer** (stopped by its token limit) is never
  asked again: the same limit would cut it the same way.
* **Waiting**: exponential backoff from ``backoff_base_s``, doubling per failure up to
  ``backoff_max_s``, with jitter (a random half to all of it); a server's ``Retry-After`` is honoured
  but capped at ``backoff_max_s``.
* **Limits**: a call gives up after ``max_retries`` retried failures; a run (one client) retries at
  most ``max_run_retries`` times in all, then every call that fails again gives up.
* **Pools** fail over instead of retrying: a pool member retries nothing (``POOL_MEMBER_RETRIES``), a
  failure that is the endpoint's (:func:`fails_over`) sends the request to another member, and a
  request tries ``max_retries + 1`` times per member in all.

The limits are :class:`~keyshot.infer.client.endpoint.EndpointConfig` fields; the call loop
(:class:`~keyshot.infer.client.judge_client.JudgeClient`) asks this module at every turn.
"""

from __future__ import annotations

import asyncio
import random

import openai

from keyshot.infer.client.endpoint import EndpointConfig, JudgeCallError
from keyshot.infer.client.replies import MalformedReply
from keyshot.infer.common.redaction import redact

#: Statuses retried besides every 5xx: request timeout, conflict, too many requests.
RETRYABLE_STATUS = frozenset({408, 409, 429})
#: Non-retryable answers that say the endpoint itself is wrong (key, permission, URL or model), not
#: the request: they count towards the circuit breaker.
ENDPOINT_FAULT_STATUS = frozenset({401, 403, 404})
#: A pool member's retries: it fails over to another member instead.
POOL_MEMBER_RETRIES = 0


class Transient(Exception):
    """A failure worth retrying: ``delay_s`` is the server's Retry-After, if it sent one."""

    def __init__(self, reason: str, delay_s: float | None = None, status: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s
        self.status = status


def retried_status(status: int) -> bool:
    """Whether an HTTP error status is retried."""
    return status in RETRYABLE_STATUS or status >= 500


def counts_against_endpoint(status: int | None) -> bool:
    """Whether a failure that is not retried still says the endpoint is broken (its breaker counts it)."""
    return status in ENDPOINT_FAULT_STATUS


def fails_over(exc: JudgeCallError) -> bool:
    """True when a pool member's failure is the endpoint's (worth another member), not the request's own."""
    return exc.status is None or retried_status(exc.status) or counts_against_endpoint(exc.status)


def pool_attempts(endpoint: EndpointConfig, members: int) -> int:
    """How many endpoint failures a pool's request survives before it gives up."""
    return (endpoint.max_retries + 1) * members


def transient(exc: BaseException, *, timeout_s: float, secrets: list[str | None]) -> Transient | None:
    """The retried failure that ``exc``, raised while sending a request or reading its reply, is; None
    for any other (``secrets`` are redacted from the message)."""
    if isinstance(exc, asyncio.TimeoutError | openai.APITimeoutError):
        return Transient(f"no answer within {timeout_s:g}s")
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc
        return Transient(f"connection error: {type(cause).__name__}: {redact(str(cause), secrets)}")
    if isinstance(exc, MalformedReply):
        return Transient(str(exc))
    return None


def status_failure(
    endpoint: str, status: int, excerpt: str, retry_after: float | None
) -> Transient | JudgeCallError:
    """The failure an HTTP error status is: retried (honouring ``retry_after``) or the call's end."""
    if retried_status(status):
        return Transient(f"HTTP {status}: {excerpt}", delay_s=retry_after, status=status)
    return JudgeCallError(endpoint, f"HTTP {status}: {excerpt}", status=status)


class RetryPolicy:
    """One client's retry state: its endpoint's limits, its jitter source and the run's retries so far."""

    def __init__(self, endpoint: EndpointConfig, rng: random.Random | None = None):
        self.endpoint = endpoint
        self.rng = rng or random.Random()
        self.run_retries = 0

    @property
    def max_attempts(self) -> int:
        """The most requests one call sends for failures that are retried."""
        return self.endpoint.max_retries + 1

    def delay(self, failure_no: int, retry_after: float | None) -> float:
        """Seconds to wait after the ``failure_no``-th retried failure of a call (1-based)."""
        ep = self.endpoint
        if retry_after is not None:
            return min(retry_after, ep.backoff_max_s)
        ceiling = min(ep.backoff_max_s, ep.backoff_base_s * 2 ** (failure_no - 1))
        return ceiling * self.rng.uniform(0.5, 1.0)

    def give_up(self, failure: Transient, failures: int, attempts: int) -> JudgeCallError | None:
        """After a call's ``failures``-th retried failure: the error to end it with, or None to retry.
        Counts the retry against the run's budget."""
        ep = self.endpoint
        self.run_retries += 1
        if self.run_retries > ep.max_run_retries:
            why = f"the run's retry budget ({ep.max_run_retries}) is spent"
        elif failures > ep.max_retries:
            why = f"gave up after {attempts} attempts"
        else:
            return None
        return JudgeCallError(
            ep.name, f"{why}; last error: {failure.reason}", status=failure.status, attempts=attempts
        )

    def ask_again(self, error: str | None, cut: bool, invalid_answers: int) -> bool:
        """Whether an answer is asked again: malformed (``error``) and not cut, within ``max_invalid_retries``."""
        return error is not None and not cut and invalid_answers < self.endpoint.max_invalid_retries
