"""The HTTP side of every endpoint call: the official ``openai`` client, with keyshot deciding what is sent.

The ``openai`` client gives the request building, connection pooling, timeouts and the error classes
(:class:`openai.APIStatusError` with the response, :class:`openai.APIConnectionError`,
:class:`openai.APITimeoutError`). Two things stay keyshot's:

- **Retries**: the client is built with ``max_retries=0``. :class:`keyshot.infer.client.judge_client.JudgeClient` retries
  itself (honouring ``Retry-After``) because every failed attempt counts towards the endpoint's circuit
  breaker, the run's retry budget and the usage ledger, which the library's hidden retries would not.
- **What leaves the machine**: the library reads ``OPENAI_API_KEY``, ``OPENAI_ORG_ID``,
  ``OPENAI_PROJECT_ID`` and ``OPENAI_CUSTOM_HEADERS`` from the environment and would send them to any
  endpoint, a local vLLM server or a third-party API included. keyshot sets ``Authorization`` on every
  request from the variable the endpoint's config names (or omits it), and a request hook drops every
  header not in :data:`SENT_HEADERS`, so nothing ambient reaches an endpoint it was not meant for.
"""

from __future__ import annotations

import httpx2
from openai import AsyncOpenAI, Omit

#: The only request headers an endpoint receives (``x-stainless-*``, the library's own description of
#: itself, is kept too).
SENT_HEADERS = frozenset(
    {
        "host",
        "accept",
        "accept-encoding",
        "connection",
        "content-type",
        "content-length",
        "user-agent",
        "authorization",
    }
)

#: Stands in for the library's own key, which keyshot never uses: the key goes in each request.
_NO_CLIENT_KEY = "keyshot-sets-authorization-per-request"


async def _send_only_keyshot_headers(request: httpx2.Request) -> None:
    for name in list(request.headers):
        lowered = name.lower()
        if lowered not in SENT_HEADERS and not lowered.startswith("x-stainless-"):
            del request.headers[name]


def openai_client(base_url: str, *, timeout_s: float, max_connections: int = 8) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` for one endpoint: no retries of its own, at most ``max_connections``
    connections, redirects not followed, only :data:`SENT_HEADERS` sent. Pass each request's
    ``Authorization`` with :func:`authorization`."""
    http = httpx2.AsyncClient(
        timeout=httpx2.Timeout(timeout_s),
        limits=httpx2.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        follow_redirects=False,
        event_hooks={"request": [_send_only_keyshot_headers]},
    )
    return AsyncOpenAI(
        api_key=_NO_CLIENT_KEY,
        base_url=base_url,
        max_retries=0,
        timeout=timeout_s,
        http_client=http,
    )


def authorization(api_key: str | None) -> dict[str, str | Omit]:
    """The request's ``Authorization`` header: the endpoint's key, or explicitly none."""
    return {"Authorization": f"Bearer {api_key}" if api_key else Omit()}
