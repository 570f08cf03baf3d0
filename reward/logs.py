"""What keyshot's reward reports, named in one table (:data:`MEASURES`) and built in one place.

Trainers average what they are given: OpenRLHF turns each per-sample ``extra_logs`` value into a tensor and
means it over the batch, TRL gathers ``log_metric`` values across ranks (a key missing on one rank can hang
the gather). So every field here is a plain float, for every sample and every call, with the same keys:
a value that a sample does not have (no progress, no P(success)) is 0.0 with a ``has_`` field saying so,
never None, NaN or a sentinel such as -1 that a mean would take for a measurement.

Each measure has one name (``failed``, ``judge_calls``, ...) and its spellings follow from it: the
per-sample field ``keyshot_<name>`` (:func:`sample_logs`: OpenRLHF's ``extra_logs``, verl's extra keys,
OpenEnv's metadata, TRL's completion columns), TRL's metric ``keyshot/<name>`` (:func:`trainer_metrics`),
and the reward service's Prometheus counters, which are the table :data:`PROMETHEUS` (:class:`Metrics`
writes the ``/metrics`` page from it alone).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field

from keyshot.infer.common.processes import PerProcess
from keyshot.reward.model import RewardResult

logger = logging.getLogger(__name__)


def paid_calls(result: RewardResult, role: str) -> float:
    """Calls of ``role`` ('judge' or 'scorer') this result sent to an endpoint: ``RewardResult.paid_calls``,
    the ``sent`` of :func:`keyshot.infer.runs.counts.call_split` (cache hits and identical screenshots
    scored once excluded)."""
    return float(result.paid_calls.get(role, 0))


def credited_steps(step_rewards: Sequence[float] | None) -> float | None:
    """How many steps earned a positive reward; None without per-step rewards."""
    return None if step_rewards is None else float(sum(x > 0 for x in step_rewards))


def first_credited_step(step_rewards: Sequence[float] | None) -> float | None:
    """The first step that earned a positive reward; None without per-step rewards or when none did."""
    return next((float(t) for t, x in enumerate(step_rewards or ()) if x > 0), None)


@dataclass(frozen=True)
class Measure:
    """One measure of a result, under its one name. ``optional``: not every sample has one (its value is
    then None), so a ``has_`` field says which have."""

    name: str
    of: Callable[[RewardResult], float | None]
    optional: bool = False

    @property
    def key(self) -> str:
        """The per-sample field: ``keyshot_<name>``."""
        return f"keyshot_{self.name}"

    @property
    def has_key(self) -> str:
        """The per-sample field saying whether the sample has one (optional measures): ``keyshot_has_<name>``."""
        return f"keyshot_has_{self.name}"

    @property
    def metric(self) -> str:
        """The trainer's metric: ``keyshot/<name>``."""
        return f"keyshot/{self.name}"

    @property
    def count_metric(self) -> str:
        """How many samples of a call had one (optional measures): ``keyshot/<name>_n``."""
        return f"keyshot/{self.name}_n"


#: The measures every adapter reports, in the order of their fields.
MEASURES = (
    Measure("failed", lambda r: float(r.failed)),
    Measure("success", lambda r: float(bool(r.success) and not r.failed)),
    Measure("judge_calls", lambda r: paid_calls(r, "judge")),
    Measure("scorer_calls", lambda r: paid_calls(r, "scorer")),
    Measure("progress", lambda r: r.progress, optional=True),
    Measure("p_success", lambda r: r.p_success, optional=True),
    # with pipeline.step_rewards: how many steps earned a reward, and the first that did (0: the first page)
    Measure("credited_steps", lambda r: credited_steps(r.step_rewards), optional=True),
    Measure("first_credited_step", lambda r: first_credited_step(r.step_rewards), optional=True),
)

#: The per-sample fields of :func:`sample_logs`, in order.
SAMPLE_KEYS = tuple(key for m in MEASURES for key in ((m.key, m.has_key) if m.optional else (m.key,)))


def sample_logs(results: Sequence[RewardResult]) -> dict[str, list[float]]:
    """Per-sample fields (:data:`SAMPLE_KEYS`): ``keyshot_failed`` is 1.0 for a rollout given no verdict
    (whatever ``on_failure`` made its reward), ``keyshot_success`` 1.0 for a success verdict."""
    fields: dict[str, list[float]] = {}
    for m in MEASURES:
        values = [m.of(r) for r in results]
        fields[m.key] = [0.0 if v is None else float(v) for v in values]
        if m.optional:
            fields[m.has_key] = [float(v is not None) for v in values]
    return fields


def trainer_metrics(results: Sequence[RewardResult]) -> Iterator[tuple[str, float]]:
    """``(metric, value)`` pairs for a trainer that averages each metric as the sum over its count (TRL's
    ``log_metric``): each measure once per sample that has one, and each optional measure's
    ``keyshot/<name>_n`` once per call (how many samples of the call had one)."""
    for m in MEASURES:
        values = [m.of(r) for r in results]
        yield from ((m.metric, float(v)) for v in values if v is not None)
        if m.optional:
            yield m.count_metric, float(sum(v is not None for v in values))


# --------------------------------------------------------------------------- the service's counters
#: The seconds a request's latency histogram counts up to (Prometheus' ``le`` bounds).
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

#: The reward service's Prometheus families: name -> (type, help). ``/metrics`` is written from this table.
PROMETHEUS = {
    "keyshot_reward_requests_total": ("counter", "Requests answered, by route and HTTP code."),
    "keyshot_reward_request_seconds": ("histogram", "Seconds from a request's body to its answer, by route."),
    "keyshot_reward_rollouts_total": ("counter", "Rollouts scored."),
    "keyshot_reward_failures_total": ("counter", "Rollouts given no verdict (keyshot_failed)."),
    "keyshot_reward_on_failure_applied_total": ("counter", "Failed rollouts given on_failure's number."),
    "keyshot_reward_calls_total": ("counter", "Answers of each role, wherever they came from."),
    "keyshot_reward_paid_calls_total": ("counter", "Calls of each role sent to its endpoint."),
    "keyshot_reward_cache_hits_total": ("counter", "Answers of each role read from the call cache."),
    "keyshot_reward_same_image_total": (
        "counter",
        "Screenshot scores taken from an identical screenshot scored once in the same rollout.",
    ),
    "keyshot_reward_queue_depth": ("gauge", "Requests in flight."),
}
#: The per-role call counts of a result (:class:`~keyshot.reward.model.RewardResult`) each counter adds.
_CALL_COUNTERS = {
    "keyshot_reward_calls_total": "calls",
    "keyshot_reward_paid_calls_total": "paid_calls",
    "keyshot_reward_cache_hits_total": "cache_hits",
    "keyshot_reward_same_image_total": "same_image",
}


@dataclass
class Metrics:
    """The reward service's counters (they only grow) and their Prometheus text."""

    #: family -> labels -> value, for the counters of :data:`PROMETHEUS`
    counters: dict[str, dict[tuple[tuple[str, str], ...], int]] = field(default_factory=dict)
    #: route -> (cumulative bucket counts, count, sum of seconds)
    latency: dict[str, tuple[list[int], int, float]] = field(default_factory=dict)

    def add(self, family: str, n: int, **labels: str) -> None:
        if PROMETHEUS[family][0] != "counter":
            raise ValueError(f"{family} is a {PROMETHEUS[family][0]}, not a counter")
        values = self.counters.setdefault(family, {})
        key = tuple(labels.items())  # in the order given: route before code
        values[key] = values.get(key, 0) + n

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.add("keyshot_reward_requests_total", 1, route=route, code=str(status))
        buckets, count, total = self.latency.get(route) or ([0] * len(LATENCY_BUCKETS), 0, 0.0)
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                buckets[i] += 1
        self.latency[route] = (buckets, count + 1, total + seconds)

    def count(self, results: Sequence[RewardResult]) -> None:
        """Add the results' rollouts, failures and calls (each result's own counts, summed per role)."""
        self.add("keyshot_reward_rollouts_total", len(results))
        self.add("keyshot_reward_failures_total", sum(r.failed for r in results))
        self.add("keyshot_reward_on_failure_applied_total", sum(r.on_failure_applied for r in results))
        for family, attribute in _CALL_COUNTERS.items():
            for r in results:
                for role, n in getattr(r, attribute).items():
                    self.add(family, n, role=role)

    def text(self, queue_depth: int) -> str:
        """The Prometheus text exposition of every family of :data:`PROMETHEUS`."""
        lines: list[str] = []
        for family, (kind, help_text) in PROMETHEUS.items():
            lines += [f"# HELP {family} {help_text}", f"# TYPE {family} {kind}"]
            if kind == "histogram":
                for route, (buckets, count, total) in sorted(self.latency.items()):
                    for bound, n in zip((*LATENCY_BUCKETS, "+Inf"), (*buckets, count), strict=True):
                        lines.append(f'{family}_bucket{{route="{route}",le="{bound}"}} {n}')
                    lines.append(f'{family}_sum{{route="{route}"}} {total:.6f}')
                    lines.append(f'{family}_count{{route="{route}"}} {count}')
            elif kind == "gauge":
                lines.append(f"{family} {queue_depth}")
            else:
                values = self.counters.get(family) or ({(): 0} if not _labelled(family) else {})
                for labels, n in sorted(values.items()):
                    shown = ",".join(f'{k}="{v}"' for k, v in labels)
                    lines.append(f"{family}{{{shown}}} {n}" if shown else f"{family} {n}")
        return "\n".join(lines) + "\n"


def _labelled(family: str) -> bool:
    """Whether a counter's values carry labels (a route and code, or a role); one without has a value
    from the start."""
    return family == "keyshot_reward_requests_total" or family in _CALL_COUNTERS


#: The places warned about already (a forked child shares its parent's log: it keeps them)
_warned: PerProcess[set[str]] = PerProcess(set, keep_after_fork=True)


def warn_constant_groups(
    rollout_keys: Sequence[Hashable], group_keys: Sequence[Hashable], where: str, fix: str
) -> bool:
    """Warn once per ``where`` when every group of more than one sample scores one identical rollout.

    GRPO-style trainers compare the samples of a prompt: when each prompt's samples are scored on the same
    recorded rollout (a dataset column, not the sample's own episode), every group gets equal rewards and a
    zero advantage, and nothing else says so. Returns whether the batch has that shape.
    """
    groups: dict[Hashable, set[Hashable]] = {}
    for group, rollout in zip(group_keys, rollout_keys, strict=True):
        groups.setdefault(group, set()).add(rollout)
    sizes = Counter(group_keys)
    multi = [g for g in groups if sizes[g] > 1]
    constant = bool(multi) and all(len(groups[g]) == 1 for g in multi)
    with _warned.lock:
        first = constant and where not in _warned.items
        if first:
            _warned.items.add(where)
    if first:
        logger.warning(
            "%s: every sample of a prompt is scored on the same rollout, so a group's rewards are equal and "
            "its advantage is zero (the judge does not read the completion's final answer). %s",
            where,
            fix,
        )
    return constant
