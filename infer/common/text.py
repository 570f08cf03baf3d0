"""Text shown in terminal tables and plots."""

from __future__ import annotations

ELLIPSIS = "…"


def count_of(n: int, singular: str, plural: str) -> str:
    """``"1 trajectory has"``, ``"2 trajectories have"``."""
    return f"{n} {singular if n == 1 else plural}"


def shorten_middle(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters by an ellipsis in the middle, so that ids that share a
    prefix keep what tells them apart (``2024-12-18_12-49-54_De…ll-menu_4``)."""
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    if len(text) <= width:
        return text
    if width == 1:
        return ELLIPSIS
    tail = (width - 1) // 2
    head = width - 1 - tail
    return text[:head] + ELLIPSIS + text[len(text) - tail :]
