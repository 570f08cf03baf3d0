"""The faults the fake server injects (rate limits, server errors, timeouts, dropped connections,
malformed bodies, answers without a score): scripted per request, then drawn with a seeded RNG."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from random import Random

FAULT_KINDS = ("429", "500", "503", "timeout", "disconnect", "malformed", "garbage")


@dataclass
class FaultPlan:
    """Which faults to inject: ``script`` (one entry per chat request, None = no fault) is used
    first, then each request draws from ``rates`` with a seeded RNG."""

    rates: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    script: list[str | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        for kind in list(self.rates) + [s for s in self.script if s is not None]:
            if kind not in FAULT_KINDS:
                raise ValueError(f"unknown fault kind {kind!r}; choose from {', '.join(FAULT_KINDS)}")
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError(f"fault rates sum to {sum(self.rates.values()):.3f} > 1")
        self._rng = Random(self.seed)
        self._lock = threading.Lock()
        self._scripted = 0

    @classmethod
    def uniform(cls, total_rate: float, seed: int = 0, kinds: tuple[str, ...] = FAULT_KINDS) -> FaultPlan:
        return cls({k: total_rate / len(kinds) for k in kinds}, seed=seed)

    def next_fault(self) -> str | None:
        with self._lock:
            if self._scripted < len(self.script):
                self._scripted += 1
                return self.script[self._scripted - 1]
            draw = self._rng.random()
        acc = 0.0
        for kind in FAULT_KINDS:
            acc += self.rates.get(kind, 0.0)
            if draw < acc:
                return kind
        return None
