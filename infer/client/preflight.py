"""Fail fast before spending: check every endpoint a run will call before its first trajectory.

For each endpoint, at once and within ``timeout_s`` in all: its API-key variable is set when the
endpoint needs one; ``GET {base_url}/models`` answers (reachable); the key is accepted (not 401/403);
the named model is listed (when the server lists models; a server that lists none, or has no
``/models`` route, is taken on trust). A failure is one :class:`PreflightError` naming the URL,
the model and the variable, with its own exit code.

An endpoint with ``constrained: true`` must be a vLLM server that reads structured outputs: its model card
says ``owned_by: vllm`` and ``GET /version`` (at the server's root) names vLLM
:data:`STRUCTURED_OUTPUTS_SINCE` or later (older servers ignore the field without a word). Any other
endpoint (an API judge, a server that does not say what it is) is refused with one line naming the
key, never sent unconstrained requests in its place.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence

import httpx2
import openai

from keyshot.infer.client.judge_client import EndpointConfig, MissingAPIKeyError
from keyshot.infer.client.transport import authorization, openai_client
from keyshot.infer.common.errors import EXIT_PREFLIGHT, KeyshotError
from keyshot.infer.common.redaction import redact

logger = logging.getLogger(__name__)

#: The first vLLM whose chat requests read ``structured_outputs`` (earlier ones ignore it silently).
STRUCTURED_OUTPUTS_SINCE = (0, 10, 2)


class PreflightError(KeyshotError):
    """An endpoint that cannot be used: unreachable, key missing or refused, model not served."""

    exit_code = EXIT_PREFLIGHT


class Refusal(str):
    """A problem no pool tolerates: an endpoint that answers but cannot do what it is configured for."""


async def _check(ep: EndpointConfig, timeout_s: float, section: str | None = None) -> str | None:
    where = f"endpoint {ep.name!r} ({ep.display_url}, model {ep.model!r})"
    problem, cards = await _check_models(ep, timeout_s, where)
    if problem is None and ep.constrained:
        key = f"{section}.constrained" if section else f"constrained (endpoint {ep.name!r})"
        why = await _not_vllm(ep, cards, timeout_s)
        if why:
            return Refusal(
                f"{where}: {key}=true needs a vLLM server (>= {'.'.join(map(str, STRUCTURED_OUTPUTS_SINCE))}, "
                f"structured outputs) and this endpoint is not known to be one ({why}); set {key}=false"
            )
    return problem


async def _check_models(ep: EndpointConfig, timeout_s: float, where: str) -> tuple[str | None, list[dict]]:
    """The problem with ``GET /models`` (None: none), and the model cards it listed."""
    try:
        key = ep.api_key()
    except MissingAPIKeyError:
        return (
            f"{where}: the environment variable {ep.api_key_env} is not set; export {ep.api_key_env}=<key> "
            "(or set api_key_env: null for a server without keys)"
        ), []
    api = openai_client(ep.base_url, timeout_s=timeout_s, max_connections=1)
    try:
        response = await api.get("/models", cast_to=httpx2.Response, options={"headers": authorization(key)})
    except openai.APITimeoutError:
        return f"{where}: no answer from {ep.display_url} within the preflight's time; is the server up?", []
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc
        return (
            f"{where}: cannot connect ({type(cause).__name__}: {redact(str(cause), [key])}); "
            "is the server up and the URL right?"
        ), []
    except openai.APIStatusError as exc:
        response = exc.response
    finally:
        await api.close()
    if response.status_code in (401, 403):
        if key is None and ep.api_key_env:
            return (
                f"{where}: the server wants a key (HTTP {response.status_code}) and the environment variable "
                f"{ep.api_key_env} is not set; export {ep.api_key_env}=<key>"
            ), []
        variable = f"the key in ${ep.api_key_env}" if ep.api_key_env else "the request (no key sent)"
        return (
            f"{where}: {variable} was refused (HTTP {response.status_code}); check the key and its permissions"
        ), []
    if response.status_code == 404:
        logger.info("%s: no /models route; the model name is not checked", where)
        return None, []
    if response.status_code != 200:
        return (
            f"{where}: GET /models answered HTTP {response.status_code}: {redact(response.text[:200], [key])}"
        ), []
    try:
        cards = [m for m in response.json().get("data", []) if isinstance(m, dict)]
    except (ValueError, AttributeError):
        return (
            f"{where}: GET /models did not answer an OpenAI model list; is this an OpenAI-compatible /v1 URL?"
        ), []
    served = [m.get("id") for m in cards]
    if served and ep.model not in served:
        shown = ", ".join(map(str, served[:8])) + (" …" if len(served) > 8 else "")
        return f"{where}: model {ep.model!r} is not served there; it serves: {shown}", cards
    return None, cards


def root_url(base_url: str) -> str:
    """The server's root of an OpenAI-compatible ``…/v1`` URL (where vLLM answers ``/version``)."""
    return re.sub(r"/v1/?$", "", base_url.rstrip("/")) or base_url


def _version(text: str) -> tuple[int, ...] | None:
    """``(major, minor, patch)`` of a version string such as ``0.32.0`` or ``0.10.2rc1+cpu``."""
    found = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", text)
    return tuple(int(part or 0) for part in found.groups()) if found else None


async def _not_vllm(ep: EndpointConfig, cards: list[dict], timeout_s: float) -> str | None:
    """Why ``ep`` is not known to be a vLLM server that reads structured outputs, or None when it is."""
    card = next((c for c in cards if c.get("id") == ep.model), None)
    if card is None:
        return "its GET /models lists no card of the model"
    if card.get("owned_by") != "vllm":
        return f"its model card says owned_by {card.get('owned_by')!r}, not 'vllm'"
    key = ep.api_key()
    api = openai_client(root_url(ep.base_url), timeout_s=timeout_s, max_connections=1)
    try:
        response = await api.get("/version", cast_to=httpx2.Response, options={"headers": authorization(key)})
        version = _version(str(response.json().get("version", "")))
    except (openai.APIError, ValueError, AttributeError) as exc:
        return f"GET /version at its root gave no vLLM version ({type(exc).__name__})"
    finally:
        await api.close()
    if version is None:
        return "GET /version at its root gave no vLLM version"
    if version < STRUCTURED_OUTPUTS_SINCE:
        return f"it runs vLLM {'.'.join(map(str, version))}, which ignores structured outputs"
    return None


async def _check_all(
    endpoints: list[EndpointConfig], timeout_s: float, sections: list[str | None]
) -> list[str | None]:
    """One result per endpoint, in order: the problem, or None."""
    return list(
        await asyncio.gather(
            *(_check(ep, timeout_s, sec) for ep, sec in zip(endpoints, sections, strict=True))
        )
    )


def preflight(
    endpoints: list[EndpointConfig | None],
    timeout_s: float = 8.0,
    *,
    pool: list[EndpointConfig] | None = None,
    sections: Sequence[str | None] = (),
    pool_section: str | None = None,
) -> None:
    """Check ``endpoints`` (None entries skipped, duplicates checked once); raise on the first problem.

    ``pool`` (replicas of one model) passes when one of them does: the others are named in a warning
    and left to the pool, which takes them in once they answer. ``sections`` (one per endpoint) and
    ``pool_section`` are where the config holds them (``judge``, ``scorer.endpoint``, ``scorer.endpoints``),
    so that a problem names the key to change.
    """
    unique: dict[tuple[str, str, bool], tuple[EndpointConfig, str | None]] = {}
    for i, ep in enumerate(endpoints):
        if ep is not None:
            unique.setdefault(
                (ep.base_url, ep.model, ep.constrained), (ep, sections[i] if i < len(sections) else None)
            )
    members = list(pool or [])
    if not unique and not members:
        return
    checked = [ep for ep, _ in unique.values()] + members
    names = [sec for _, sec in unique.values()] + [
        f"{pool_section}[{i}]" if pool_section else None for i in range(len(members))
    ]
    results = asyncio.run(_check_all(checked, timeout_s, names))
    problems = [r for r in results[: len(unique)] if r]
    pool_problems = [r for r in results[len(unique) :] if r]
    problems += [r for r in pool_problems if isinstance(r, Refusal)]  # not a replica that is down: refused
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
