"""When a run stops early instead of paying for calls that cannot help.

:class:`Breaker`, the circuit breaker of an endpoint: when to declare it down instead of retrying. Shared by
:class:`keyshot.infer.client.judge_client.JudgeClient` (one endpoint) and :class:`keyshot.infer.client.pool.EndpointPool` (replicas).
:class:`CutWatch`: when the first answers under a token limit were all cut by it (the pipeline's).
"""

from __future__ import annotations

import logging
import time

from keyshot.infer.common.errors import CutAnswersError, EndpointDownError

logger = logging.getLogger(__name__)

#: How many first answers under one token limit, all cut, stop a run.
CUT_WATCH_FIRST = 8


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


class CutWatch:
    """The answers given under one token limit (``setting``, e.g. ``scorer.endpoint.max_tokens``) in a run.

    When its first ``first`` answers were all cut by the limit, it goes down
    (:class:`~keyshot.infer.common.errors.CutAnswersError`: the limit is too small for the model) and stays down;
    ``first=None`` never goes down, it only counts (reference mode, which reads cut answers as the
    reference does). Its counts tell the user what to change (:meth:`report`).
    """

    def __init__(self, setting: str, first: int | None = CUT_WATCH_FIRST, trained_tokens: int | None = None):
        self.setting, self.first = setting, first
        self.trained_tokens = trained_tokens  # the longest answer the scorer was trained on, when known
        self.answers = 0
        self.cut = 0
        self.cut_tokens = 0  # the most completion tokens of a cut answer
        self.longest_tokens = 0  # the most completion tokens of any answer
        self.down: CutAnswersError | None = None

    def answered(self, cut: bool, completion_tokens: int) -> None:
        """Count an answer (cached ones too: they were cut just the same)."""
        self.answers += 1
        self.longest_tokens = max(self.longest_tokens, completion_tokens)
        if cut:
            self.cut += 1
            self.cut_tokens = max(self.cut_tokens, completion_tokens)
        if self.down is None and self.answers == self.first and self.cut == self.first:
            self.down = CutAnswersError(
                self.setting, self.answers, self.cut_tokens, self.longest_tokens, self.trained_tokens
            )

    def check(self) -> None:
        """Raise the watch's CutAnswersError once it is down."""
        if self.down is not None:
            raise self.down

    def report(self) -> dict:
        return {
            "setting": self.setting,
            "answers": self.answers,
            "cut": self.cut,
            "cut_tokens": self.cut_tokens,
            "longest_tokens": self.longest_tokens,
            "trained_tokens": self.trained_tokens,
        }
