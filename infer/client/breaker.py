"""The circuit breaker of an endpoint: when to declare it down and stop the run instead of retrying.

Shared by :class:`keyshot.infer.client.judge_client.JudgeClient` (one endpoint) and :class:`keyshot.infer.client.pool.EndpointPool` (replicas).
"""

from __future__ import annotations

import logging
import time

from keyshot.infer.common.errors import EndpointDownError

logger = logging.getLogger(__name__)


class Breaker:
    """The circuit breaker of an endpoint (or of a pool of them).

    It trips (:class:`~keyshot.infer.common.errors.EndpointDownError`) once ``failures`` requests in a row failed and
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
