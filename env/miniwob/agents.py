"""Scripted MiniWoB agents (the tests', benchmarks' and set-up check's players): :class:`ScriptedAgent`
does what the goal of a simple click or type task says, :class:`StoppingAgent` does the same but stops
before its last action (the submit), :class:`LoopingAgent` repeats its first action, :func:`random_action`
clicks at random."""

from __future__ import annotations

import random
import re

from keyshot.env.page import Page

_QUOTED = re.compile(r'"([^"]+)"')
_ELEMENT = re.compile(r"\[(?P<bid>[^\]]+)\] (?P<role>\w+) '(?P<name>[^']*)'")


def _elements(text: str) -> list[tuple[str, str, str]]:
    return [(m["bid"], m["role"], m["name"]) for m in _ELEMENT.finditer(text)]


class ScriptedAgent:
    """A scripted MiniWoB agent for the simple click and type tasks: ``Enter "X"`` fills the text field
    with X then clicks Submit; a quoted name is clicked (the button, link or tab of that name); otherwise
    the first button. Returns None once the page is done (or when it finds nothing to do)."""

    def __init__(self):
        self.filled = False

    def __call__(self, page: Page) -> str | None:
        if page.done:
            return None
        goal = page.text.split("\n", 1)[0]
        elements = _elements(page.text)
        quoted = _QUOTED.findall(goal)
        if goal.lower().startswith("goal: enter") and quoted and not self.filled:
            box = next((bid for bid, role, _ in elements if role == "textbox"), None)
            if box is not None:
                self.filled = True
                return f"fill('{box}', {quoted[0]!r})"
        wanted = "submit" if self.filled else (quoted[0] if quoted else None)
        for bid, role, name in elements:
            if role in ("button", "link", "tab") and (wanted is None or name.lower() == wanted.lower()):
                return f"click('{bid}')"
        return None


class StoppingAgent(ScriptedAgent):
    """:class:`ScriptedAgent` that stops before it submits: after filling the text field it does nothing
    more (None), so the task is never finished."""

    def __call__(self, page: Page) -> str | None:
        filled = self.filled
        action = super().__call__(page)
        return None if filled else action


class LoopingAgent(ScriptedAgent):
    """:class:`ScriptedAgent`'s first action, again and again (an agent stuck in a loop)."""

    def __init__(self):
        super().__init__()
        self.first: str | None = None

    def __call__(self, page: Page) -> str | None:
        if page.done:
            return None
        if self.first is None:
            self.first = super().__call__(page)
        return self.first


def random_action(page: Page, rng: random.Random) -> str:
    """A click on an element of the page picked at random (the random agent of the tests)."""
    bids = [bid for bid, _, _ in _elements(page.text)]
    return f"click('{rng.choice(bids)}')" if bids else "noop()"
