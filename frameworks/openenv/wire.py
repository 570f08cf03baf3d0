"""A live page as the fields of OpenEnv's BrowserGym observation (the wire format TRL's OpenEnv examples
read), filled as OpenEnv's own BrowserGym server fills them: ``text`` and ``axtree_txt`` (the
accessibility tree with BrowserGym ids), ``pruned_html`` (BrowserGym's ``prune_html`` of the page's DOM),
``goal``, ``last_action_error`` (whether the last action failed, or the browser did), ``error`` (empty, as
OpenEnv's server leaves it for an action's own error: only a failed browser says why there) and
``screenshot`` (H×W×3 0-255 integers: nested lists on the wire).

The screenshot is held as :class:`Pixels` (its uint8 array, 2.7 MB at 1280x720) and written out as nested
lists only while the answer's JSON is encoded, a row at a time. As nested Python lists, one 1280x720
screenshot is 77 MiB of objects; OpenEnv's WebSocket handler keeps each session's last observation and its
dumped dict until the session's next message, so 256 sessions held 19 GB (bench/RESULTS.md).

Plain Python and pydantic (no OpenEnv), so it is checked where OpenEnv is not installed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from pydantic_core import SchemaSerializer, core_schema

from keyshot.env.page import Page

#: What a live page's text puts before its accessibility tree (after the goal and the action's error).
STRUCTURE = "\n\nPage structure:\n"
ERROR = "\n\nError: "

_ROWS = core_schema.generator_schema(
    core_schema.list_schema(core_schema.list_schema(core_schema.int_schema()))
)


def _rows(pixels: Pixels) -> Iterator[list[list[int]]]:
    return (row.tolist() for row in pixels.array)


class Pixels:
    """A screenshot as an observation holds it: its H×W×3 uint8 ``array``. In JSON (pydantic's
    ``model_dump_json``, which OpenEnv's server sends) it is the nested lists of 0-255 integers OpenEnv's
    clients read, built a row at a time; in a Python-mode dump it stays itself, so a dumped observation
    holds the array, not 2.8 M integers. ``numpy.asarray(pixels)`` is the array."""

    __slots__ = ("array",)
    __pydantic_serializer__ = SchemaSerializer(
        core_schema.any_schema(
            serialization=core_schema.plain_serializer_function_ser_schema(
                _rows, when_used="json", return_schema=_ROWS
            )
        )
    )

    def __init__(self, array: np.ndarray):
        self.array = array

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        return self.array if dtype is None else self.array.astype(dtype)

    def tolist(self) -> list[list[list[int]]]:
        """The nested lists the wire carries (77 MiB of Python objects at 1280x720: for tests)."""
        return self.array.tolist()

    def __repr__(self) -> str:
        return f"Pixels({'x'.join(map(str, self.array.shape))})"


def split_text(text: str) -> tuple[str, str]:
    """``(last action's error, accessibility tree)`` of a live page's text: ``Goal: ...``, an optional
    ``Error: ...`` paragraph, then ``Page structure:`` and the tree."""
    head, found, tree = text.partition(STRUCTURE)
    if not found:
        head, tree = text, ""
    return head.partition(ERROR)[2], tree


def wire_fields(page: Page, goal: str) -> dict[str, Any]:
    """The BrowserGym observation fields of ``page`` (``url``, the reward, ``done`` and metadata excepted)."""
    action_error, tree = split_text(page.text)
    image = page.image()
    html = page.html or ""
    return {
        "text": tree or html,  # OpenEnv's server: the tree, else the pruned HTML
        "axtree_txt": tree,
        "pruned_html": html,
        "goal": goal,
        "error": page.error or "",
        "last_action_error": bool(page.error or action_error),
        "screenshot": None if image is None else Pixels(np.asarray(image)),
    }
