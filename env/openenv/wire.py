"""A live page as the fields of OpenEnv's BrowserGym observation (the wire format TRL's OpenEnv examples
read), filled as OpenEnv's own BrowserGym server fills them: ``text`` and ``axtree_txt`` (the
accessibility tree with BrowserGym ids), ``goal``, ``last_action_error`` (whether the last action failed,
or the browser did), ``error`` (empty, as OpenEnv's server leaves it for an action's own error: only a
failed browser says why there), ``screenshot`` (H×W×3 0-255 integers, nested lists) and ``pruned_html``,
which keyshot's browser does not read yet (empty; OpenEnv's server fills it).

Plain Python (no OpenEnv), so it is checked where OpenEnv is not installed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from keyshot.env.page import Page

#: What a live page's text puts before its accessibility tree (after the goal and the action's error).
STRUCTURE = "\n\nPage structure:\n"
ERROR = "\n\nError: "


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
    return {
        "text": tree,
        "axtree_txt": tree,
        "pruned_html": "",
        "goal": goal,
        "error": page.error or "",
        "last_action_error": bool(page.error or action_error),
        "screenshot": None if image is None else np.asarray(image).tolist(),
    }
