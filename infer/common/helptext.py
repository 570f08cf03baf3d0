"""--help shows prose, not reST: module docstrings double as help texts, so their markup goes."""

from __future__ import annotations

import re


def plain(text: str | None) -> str | None:
    """``code`` → code, :class:`X` → X, a ``::`` literal-block marker → ``:``."""
    if not text:
        return text
    text = re.sub(r":(?:class|func|mod|meth|data|attr):`~?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("::\n", ":\n")
