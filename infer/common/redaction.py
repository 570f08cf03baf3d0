"""Keeping secrets out of everything keyshot writes or prints.

API keys live in environment variables; configs name the variable (``api_key_env``), never the key.
:func:`check_env_name` refuses a value that is not a variable name (a key pasted into the field) and
shows at most its first 4 characters. :func:`redact_url` hides credentials in URLs
(``https://user:pass@host/v1`` → ``https://***@host/v1``); :func:`redact` does it for every URL in a
text and removes known secret values.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>]+")
_SECRET_QUERY = re.compile(r"((?:api[_-]?key|key|token|secret|password|sig)=)[^&#\s]+", re.IGNORECASE)


def check_env_name(value: str | None, field: str) -> None:
    """Raise ValueError unless ``value`` looks like an environment variable name (or is None)."""
    if value is None or ENV_NAME.match(value):
        return
    shown = value[:4] + "…" if len(value) > 4 else "…"
    raise ValueError(
        f"{field} must name an environment variable (like OPENAI_API_KEY), not hold a key: got {shown!r}; "
        f"put the key in the environment (export NAME=...) and set {field}: NAME"
    )


def redact_url(url: str) -> str:
    """``url`` with its user:password part and secret-looking query values replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "***"
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = _SECRET_QUERY.sub(r"\1***", parts.query)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every URL's credentials and each of ``secrets`` (when non-empty) replaced."""
    text = _URL.sub(lambda m: redact_url(m.group(0)), text)
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


_SECRET_FIELD = re.compile(r"key|token|secret|password|header", re.IGNORECASE)


def redact_override(item: str) -> str:
    """A ``key.sub=value`` override fit to print: the value of a secret-looking field (``*key*``,
    ``*token*``, ``*secret*``, ``*password*``, ``*header*``) cut to its first 4 characters, URLs redacted."""
    key, sep, value = item.partition("=")
    if _SECRET_FIELD.search(key.rsplit(".", 1)[-1]):
        value = value[:4] + "…" if len(value) > 4 else "…"
    return key + sep + redact(value)


def redact_config(data: Any) -> Any:
    """A config dict (``config_to_dict``) safe to write: URLs redacted, header values hidden."""
    if isinstance(data, dict):
        out = {}
        for key, value in data.items():
            if key in ("headers", "default_headers") and isinstance(value, dict):
                out[key] = {k: "***" for k in value}
            else:
                out[key] = redact_config(value)
        return out
    if isinstance(data, list):
        return [redact_config(v) for v in data]
    if isinstance(data, str) and "://" in data:
        return redact(data)
    return data
