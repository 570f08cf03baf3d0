"""Usage and cost accounting for judge/teacher endpoints, with a spending cap.

One :class:`UsageLedger` can be shared by several clients (judge, scorer, teachers); it keeps one
:class:`EndpointUsage` per endpoint name. Costs come from the per-million-token prices of the
endpoint; a cache hit costs nothing and its original cost is counted as saved.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import threading
from dataclasses import asdict, dataclass

from keyshot.infer.common.errors import EXIT_BUDGET, RunStopError
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy, target_size, visual_tokens

logger = logging.getLogger(__name__)


class BudgetExceededError(RunStopError):
    """A call was refused because the endpoint's spending cap is reached."""

    exit_code = EXIT_BUDGET

    def __init__(self, endpoint: str, spent_usd: float, budget_usd: float, projected_usd: float):
        self.endpoint = endpoint
        self.spent_usd = spent_usd
        self.budget_usd = budget_usd
        self.projected_usd = projected_usd
        super().__init__(
            f"endpoint {endpoint!r}: budget ${budget_usd:.4f} reached (spent ${spent_usd:.4f}, "
            f"${projected_usd:.4f} counting calls in flight); no further call is sent"
        )


@dataclass
class EndpointUsage:
    """Counters for one endpoint. ``calls`` are complete() calls that missed the cache;
    ``requests`` are HTTP requests (calls + retries); ``paid_requests`` got a 200 with usage."""

    name: str
    calls: int = 0
    requests: int = 0
    paid_requests: int = 0
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0
    invalid: int = 0
    budget_stops: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    saved_cost_usd: float = 0.0
    in_flight: int = 0

    @property
    def mean_request_cost_usd(self) -> float:
        return self.cost_usd / self.paid_requests if self.paid_requests else 0.0


_PATCHES = re.compile(r"^openai_patches:(\d+(?:\.\d+)?)$")
IMAGE_TOKEN_RULES = ("qwen", "openai_tiles", "openai_patches:M", "claude", "<int>")

#: The rule assumed for a model whose config names none (``keyshot judge --dry-run``): the first prefix of
#: the model's name that matches; any other model counts as Qwen2.5-VL (a vLLM-served open model).
MODEL_IMAGE_TOKEN_RULES = (
    ("gpt-4.1-mini", "openai_patches:1.62"),
    ("gpt-4.1-nano", "openai_patches:2.46"),
    ("o4-mini", "openai_patches:1.72"),
    ("gpt-", "openai_tiles"),
    ("o1", "openai_tiles"),
    ("o3", "openai_tiles"),
    ("claude", "claude"),
)


def image_token_rule(model: str) -> str:
    """The ``image_tokens`` rule assumed for ``model`` (:data:`MODEL_IMAGE_TOKEN_RULES`)."""
    name = model.rsplit("/", 1)[-1].lower()
    return next((rule for prefix, rule in MODEL_IMAGE_TOKEN_RULES if name.startswith(prefix)), "qwen")


def check_image_token_rule(rule: str, teacher: str = "") -> None:
    if rule in ("qwen", "openai_tiles", "claude") or _PATCHES.match(rule):
        return
    try:
        if int(rule) >= 0:
            return
    except ValueError:
        pass
    raise ValueError(
        f"teacher {teacher!r}: image_tokens {rule!r} is not one of {', '.join(IMAGE_TOKEN_RULES)}"
    )


def image_token_count(rule: str, width: int, height: int, policy: ImagePolicy = DEFAULT_POLICY) -> int:
    """Prompt tokens of one ``width×height`` screenshot under an ``image_tokens`` rule, applied to the
    image that is sent (after ``policy``). The providers' published formulas at the time of writing, an
    assumption of cost estimates only: real costs come from the ``usage`` the endpoints return.

    * ``qwen``: exact for Qwen2.5-VL on vLLM: one token per 28×28 px.
    * ``openai_tiles``: GPT-4o / GPT-4.1 "high" detail: fit in 2048×2048, shortest side to 768, then
      85 + 170 per 512-px tile.
    * ``openai_patches:M``: GPT-4.1-mini / -nano, o4-mini: 32-px patches, at most 1536, times the
      model's multiplier ``M`` (1.62 for GPT-4.1-mini, 2.46 for -nano, 1.72 for o4-mini).
    * ``claude``: Anthropic: long side at most 1568 px and area at most 1.15 MP, then ``w·h/750``.
    * an integer: that many tokens per image, whatever its size.
    """
    if rule == "qwen":
        return visual_tokens(width, height, policy)
    w, h = target_size(width, height, policy)
    if rule == "openai_tiles":
        scale = min(1.0, 2048 / max(w, h))
        w, h = w * scale, h * scale
        scale = min(1.0, 768 / min(w, h))
        w, h = w * scale, h * scale
        return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)
    match = _PATCHES.match(rule)
    if match:
        patches = math.ceil(w / 32) * math.ceil(h / 32)
        if patches > 1536:
            shrink = math.sqrt(1536 / patches)
            patches = min(1536, math.ceil(w * shrink / 32) * math.ceil(h * shrink / 32))
        return math.ceil(patches * float(match.group(1)))
    if rule == "claude":
        scale = min(1.0, 1568 / max(w, h), math.sqrt(1_150_000 / (w * h)))
        return math.ceil(w * scale * h * scale / 750)
    return int(rule)


#: Characters a token of prompt text is taken to be, where a cost is estimated before any call.
CHARS_PER_TOKEN = 4.0


def token_cost_usd(prompt_tokens: int, completion_tokens: int, price_in: float, price_out: float) -> float:
    """Cost in USD for the given token counts at per-million-token prices."""
    return (prompt_tokens * price_in + completion_tokens * price_out) / 1_000_000


class UsageLedger:
    """Thread-safe per-endpoint usage counters."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._usage: dict[str, EndpointUsage] = {}

    def _get(self, name: str) -> EndpointUsage:
        if name not in self._usage:
            self._usage[name] = EndpointUsage(name=name)
        return self._usage[name]

    def usage(self, name: str) -> EndpointUsage:
        """A copy of the counters of endpoint ``name`` (zeros if it was never used)."""
        with self._lock:
            return EndpointUsage(**asdict(self._get(name)))

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._usage)

    # ------------------------------------------------------------------ recording
    def record_call(self, name: str) -> None:
        with self._lock:
            self._get(name).calls += 1

    def record_cache_hit(self, name: str, saved_cost_usd: float) -> None:
        with self._lock:
            u = self._get(name)
            u.cache_hits += 1
            u.saved_cost_usd += saved_cost_usd

    def request_slot(self, name: str) -> contextlib.AbstractAsyncContextManager:
        """What one HTTP request to endpoint ``name`` holds while it is sent, beside its client's own cap:
        nothing in one process; on a Ray cluster, one of the endpoint's cluster-wide slots
        (:class:`~keyshot.infer.engines.ray_engine.ClusterLedger`)."""
        return contextlib.nullcontext()

    def begin_request(self, name: str, budget_usd: float | None, *, is_retry: bool) -> bool:
        """Reserve a slot for one HTTP request; False = wait and ask again; raises BudgetExceededError.

        The request is refused when the money already spent, plus the mean cost of a request
        times the requests still in flight, has reached the budget: a call never starts past it.
        Under a budget, the first request of an endpoint runs alone, so that later ones have a
        cost estimate (without it a burst of concurrent first calls could all start unpriced).
        """
        with self._lock:
            u = self._get(name)
            if budget_usd is not None:
                projected = u.cost_usd + u.in_flight * u.mean_request_cost_usd
                if projected >= budget_usd:
                    u.budget_stops += 1
                    raise BudgetExceededError(name, u.cost_usd, budget_usd, projected)
                if u.paid_requests == 0 and u.in_flight > 0:
                    return False
            u.in_flight += 1
            u.requests += 1
            if is_retry:
                u.retries += 1
            return True

    def end_request(
        self,
        name: str,
        *,
        paid: bool = False,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        cost_usd: float = 0.0,
    ) -> None:
        """Release the slot taken by :meth:`begin_request`; a paid answer (a 200 with a
        completion, well-formed or not) adds its usage."""
        with self._lock:
            u = self._get(name)
            u.in_flight -= 1
            if paid:
                u.paid_requests += 1
                u.prompt_tokens += prompt_tokens
                u.completion_tokens += completion_tokens
                u.cost_usd += cost_usd

    def record_failure(self, name: str) -> None:
        with self._lock:
            self._get(name).failures += 1

    def record_invalid(self, name: str) -> None:
        with self._lock:
            self._get(name).invalid += 1

    # ------------------------------------------------------------------ reports
    def total_cost_usd(self) -> float:
        with self._lock:
            return sum(u.cost_usd for u in self._usage.values())

    def as_dict(self) -> dict[str, dict]:
        """``{endpoint name: counters}``; ``in_flight`` is left out (always 0 after a run)."""
        with self._lock:
            out = {}
            for name in sorted(self._usage):
                d = asdict(self._usage[name])
                d.pop("in_flight")
                d.pop("name")
                out[name] = d
            return out

    @classmethod
    def summed(cls, ledgers: list[dict[str, dict]]) -> UsageLedger:
        """One ledger adding up several :meth:`as_dict` dumps (the shards of a run)."""
        total = cls()
        for ledger in ledgers:
            for name, counters in (ledger or {}).items():
                usage = total._get(name)
                for key, value in counters.items():
                    if hasattr(usage, key):
                        setattr(usage, key, getattr(usage, key) + value)
        return total

    def table(self) -> str:
        """A Markdown summary, one row per endpoint and a total row."""
        cols = [
            ("calls", "calls"),
            ("requests", "HTTP requests"),
            ("cache_hits", "cache hits"),
            ("retries", "retries"),
            ("failures", "failures"),
            ("invalid", "invalid"),
            ("prompt_tokens", "prompt tokens"),
            ("completion_tokens", "completion tokens"),
            ("cost_usd", "cost $"),
            ("saved_cost_usd", "saved $"),
        ]
        rows = self.as_dict()
        lines = [
            "| endpoint | " + " | ".join(label for _, label in cols) + " |",
            "|---|" + "---:|" * len(cols),
        ]
        totals: dict[str, float] = {key: 0 for key, _ in cols}
        for name, d in rows.items():
            lines.append(f"| {name} | " + " | ".join(_fmt(key, d[key]) for key, _ in cols) + " |")
            for key, _ in cols:
                totals[key] += d[key]
        if len(rows) > 1:
            lines.append("| **total** | " + " | ".join(_fmt(key, totals[key]) for key, _ in cols) + " |")
        return "\n".join(lines)

    def table_if_used(self) -> str:
        """:meth:`table`, or "" when no endpoint was called (a summary then says so)."""
        return self.table() if self.names() else ""


def _fmt(key: str, value: float) -> str:
    if key.endswith("_usd"):
        return f"{value:.4f}"
    return f"{int(value):,}"
