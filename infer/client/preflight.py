"""Fail fast before spending: check every endpoint a run will call before its first trajectory.

For each endpoint, at once and within ``timeout_s`` in all: its API-key variable is set when the
endpoint needs one; ``GET {base_url}/models`` answers (reachable); the key is accepted (not 401/403);
the named model is listed (when the server lists models; a server that lists none, or has no
``/models`` route, is taken on trust). A failure is one :class:`PreflightError` naming the URL,
the model and the variable, with its own exit code.
"""

from __future__ import annotations

import asyncio
import logging

import httpx2
import openai

from keyshot.infer.client.judge_client import EndpointConfig, MissingAPIKeyError
from keyshot.infer.client.transport import authorization, openai_client
from keyshot.infer.common.errors import EXIT_PREFLIGHT, KeyshotError
from keyshot.infer.common.redaction import redact

logger = logging.getLogger(__name__)


class PreflightError(KeyshotError):
    """An endpoint that cannot be used: unreachable, key missing or refused, model not served."""

    exit_code = EXIT_PREFLIGHT


async def _check(ep: EndpointConfig, timeout_s: float) -> str | None:
    where = f"endpoint {ep.name!r} ({ep.display_url}, model {ep.model!r})"
    try:
        key = ep.api_key()
    except MissingAPIKeyError:
        return (
            f"{where}: the environment variable {ep.api_key_env} is not set; export {ep.api_key_env}=<key> "
            "(or set api_key_env: null for a server without keys)"
        )
    api = openai_client(ep.base_url, timeout_s=timeout_s, max_connections=1)
    try:
        response = await api.get("/models", cast_to=httpx2.Response, options={"headers": authorization(key)})
    except openai.APITimeoutError:
        return f"{where}: no answer from {ep.display_url} within the preflight's time; is the server up?"
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc
        return f"{where}: cannot connect ({type(cause).__name__}: {redact(str(cause), [key])}); is the server up and the URL right?"
    except openai.APIStatusError as exc:
        response = exc.response
    finally:
        await api.close()
    if response.status_code in (401, 403):
        if key is None and ep.api_key_env:
            return (
                f"{where}: the server wants a key (HTTP {response.status_code}) and the environment variable "
                f"{ep.api_key_env} is not set; export {ep.api_key_env}=<key>"
            )
        variable = f"the key in ${ep.api_key_env}" if ep.api_key_env else "the request (no key sent)"
        return f"{where}: {variable} was refused (HTTP {response.status_code}); check the key and its permissions"
    if response.status_code == 404:
        logger.info("%s: no /models route; the model name is not checked", where)
        return None
    if response.status_code != 200:
        return (
            f"{where}: GET /models answered HTTP {response.status_code}: {redact(response.text[:200], [key])}"
        )
    try:
        served = [m.get("id") for m in response.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        return (
            f"{where}: GET /models did not answer an OpenAI model list; is this an OpenAI-compatible /v1 URL?"
        )
    if served and ep.model not in served:
        shown = ", ".join(map(str, served[:8])) + (" …" if len(served) > 8 else "")
        return f"{where}: model {ep.model!r} is not served there; it serves: {shown}"
    return None


async def _check_all(endpoints: list[EndpointConfig], timeout_s: float) -> list[str | None]:
    """One result per endpoint, in order: the problem, or None."""
    return list(await asyncio.gather(*(_check(ep, timeout_s) for ep in endpoints)))


def preflight(
    endpoints: list[EndpointConfig | None],
    timeout_s: float = 8.0,
    *,
    pool: list[EndpointConfig] | None = None,
) -> None:
    """Check ``endpoints`` (None entries skipped, duplicates checked once); raise on the first problem.

    ``pool`` (replicas of one model) passes when one of them does: the others are named in a warning
    and left to the pool, which takes them in once they answer.
    """
    unique: dict[tuple[str, str], EndpointConfig] = {}
    for ep in endpoints:
        if ep is not None:
            unique.setdefault((ep.base_url, ep.model), ep)
    members = list(pool or [])
    if not unique and not members:
        return
    results = asyncio.run(_check_all(list(unique.values()) + members, timeout_s))
    problems = [r for r in results[: len(unique)] if r]
    pool_problems = [r for r in results[len(unique) :] if r]
    if members and len(pool_problems) == len(members):
        problems.append(f"no endpoint of {members[0].model}'s pool answers: {'; '.join(pool_problems)}")
    elif pool_problems:
        logger.warning(
            "preflight: %d of %d endpoints of %s's pool do not answer (the pool uses the others and "
            "retries these): %s",
            len(pool_problems),
            len(members),
            members[0].model,
            "; ".join(pool_problems),
        )
    if problems:
        raise PreflightError("; ".join(problems))
    logger.info(
        "preflight: %d endpoint(s) reachable, keys accepted, models served", len(unique) + len(members)
    )
