"""An OpenAI-compatible endpoint as configured, and the JSON body of a request to it.

:class:`EndpointConfig` says where and how to call (its key is read from the environment at call time,
never stored); :func:`build_payload` makes a chat-completions body from messages (reasoning models get
``max_completion_tokens`` and no temperature; a ``constrained`` endpoint gets the call's answer format as vLLM's
``structured_outputs``). :class:`keyshot.infer.client.judge_client.JudgeClient` sends it.
"""

from __future__ import annotations

import ipaddress
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from keyshot.infer.common.redaction import check_env_name, redact_url
from keyshot.infer.protocol.answer_format import AnswerFormat

_REASONING_MODEL = re.compile(r"^(o1|o3|o4|gpt-5)")


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
    ``max_run_retries`` times in all (what is retried and how long it waits:
    :mod:`keyshot.infer.client.retry`). The endpoint is declared down (:class:`~keyshot.infer.common.errors.EndpointDownError`,
    the run stops) once ``breaker_failures`` requests in a row failed (any call) and none has
    succeeded for ``breaker_window_s`` seconds: a dead endpoint trips within seconds, a flaky one
    whose requests still get through now and then does not.

    ``constrained``: hold every answer to its call's answer format (the prompt set's, as a regular
    expression: :mod:`keyshot.infer.protocol.answer_format`) with vLLM's structured outputs, so that no
    answer is lost to its format or cut by ``max_tokens``. Only for a vLLM server (preflight refuses any
    other endpoint) and never in reference mode; it changes what a model can say, so a run records it.
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
    constrained: bool = False

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
    answer_format: AnswerFormat | None = None,
) -> dict[str, Any]:
    """The JSON body of one chat-completions request. ``logprobs=k`` asks for the generated
    tokens' log-probabilities with the ``k`` most likely alternatives each. ``answer_format``: the
    call's format, sent as vLLM's ``structured_outputs`` regex when the endpoint is ``constrained``."""
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
    if endpoint.constrained and answer_format is not None:
        body["structured_outputs"] = {"regex": answer_format.regex(limit)}
    body.update(endpoint.extra_body)
    return body


def answer_params(payload: dict[str, Any]) -> dict[str, Any]:
    """Everything in the body except model and messages: the parameters that change the answer."""
    return {k: v for k, v in payload.items() if k not in ("model", "messages")}
