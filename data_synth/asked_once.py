"""One synthesis session sends a byte-identical request once, whichever trajectory, layout or teacher asks it.

One trajectory's screenshot is often another's (one episode in two layouts, an agent stuck on a page),
and two teachers may serve one model. Every client of a session is wrapped in :class:`AskedOnce`; the
wrappers share one :class:`keyshot.infer.client.judge_client.InFlight` keyed by the request's own cache key
(model, prompt version, messages with their images, generation parameters: exactly what is sent), so
nothing but the bytes of the request tells two calls apart. While a request is on its way, later
identical ones wait for its answer; after it came back malformed (the call cache keeps well-formed
answers only) they get that answer too, as a cache hit at no cost; a well-formed answer is the call
cache's to give from then on. Key points, screenshot scores and outcome verdicts alike.
"""

from __future__ import annotations

from typing import Any

from keyshot.infer.client.judge_client import Completion, InFlight, JudgeClient, shared_answer
from keyshot.infer.client.pool import EndpointPool
from keyshot.infer.client.usage import UsageLedger

_KEY_ARGS = ("prompt_version", "max_tokens", "logprobs", "answer_format")


class AskedOnce:
    """``client.complete`` through the session's shared :class:`InFlight` (see the module doc)."""

    def __init__(self, name: str, client: JudgeClient | EndpointPool, asked: InFlight, ledger: UsageLedger):
        self.name = name  # the teacher (or judge) a shared answer is counted to, as a cache hit
        self.client = client
        self.asked = asked
        self.ledger = ledger

    async def complete(self, messages: list[dict], **kwargs: Any) -> Completion:
        key = self.client.key_for(messages, **{k: kwargs[k] for k in _KEY_ARGS if k in kwargs})

        def shared(first: Completion) -> Completion:
            self.ledger.record_cache_hit(self.name, first.cost_usd)
            return shared_answer(first)

        return await self.asked.run(
            key,
            lambda: self.client.complete(messages, **kwargs),
            shared,
            keep=lambda answer: not answer.valid,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
