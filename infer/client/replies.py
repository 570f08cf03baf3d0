"""Reading an endpoint's reply: the answer, whether it was cut, the wait the server asks for.

A reply that is not a usable chat completion (an empty or non-JSON body, no choices, no message) raises
:class:`MalformedReply`; whether that is retried is the retry policy's business
(:mod:`keyshot.infer.client.retry`).
"""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass

import httpx2

#: How much of an error body a message quotes.
BODY_EXCERPT = 300
#: Finish reasons that say the answer was cut by its token limit (OpenAI and vLLM say "length";
#: Anthropic's native name is "max_tokens").
CUT_FINISH_REASONS = frozenset({"length", "max_tokens"})


class MalformedReply(ValueError):
    """A 200 reply whose body is not a chat completion."""


@dataclass
class Answer:
    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    model: str
    logprobs: list[dict] | None


def answer_cut(finish_reason: str | None, completion_tokens: int, limit: int | None) -> bool:
    """True when an answer was cut by its token limit: the endpoint says so (``finish_reason``), or it
    gives no reason and the answer used the whole limit. A cut answer is a failed call
    (docs/architecture.md, "A verdict needs evidence"): asking again with the same limit gives the same cut."""
    if finish_reason in CUT_FINISH_REASONS:
        return True
    return finish_reason is None and limit is not None and completion_tokens >= limit


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


def parse_logprobs(choice: dict) -> list[dict] | None:
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


def parse_body(raw: bytes, fallback_model: str) -> Answer:
    """Read a 200 response; raises MalformedReply for bodies that are empty or not a chat completion."""
    if not raw.strip():
        raise MalformedReply("empty response body")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MalformedReply(
            f"response body is not JSON ({exc.msg if hasattr(exc, 'msg') else exc})"
        ) from None
    if not isinstance(data, dict):
        raise MalformedReply("response body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise MalformedReply("response has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedReply("response choice has no message")
    content = message.get("content")
    if content is None:
        content = ""
    if not isinstance(content, str):
        raise MalformedReply("response message content is not a string")
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    return Answer(
        text=content,
        finish_reason=choice.get("finish_reason"),
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        model=str(data.get("model") or fallback_model),
        logprobs=parse_logprobs(choice),
    )
