"""Strings a regular expression allows, drawn at random from its parse tree (Python's own regex parser),
for tests that must hold for every string a pattern allows (``tests/infer/protocol/test_answer_format.py``).

The draw leans on the edges: a repetition takes its least or its most count as often as any other, and
the free text of a character class is filled, where ``fragments`` fit the class, with strings chosen to
trip a parser (labels such as ``Score:`` or ``Status:`` in the middle of a reasoning).
"""

from __future__ import annotations

import random
import re._constants as C  # noqa: N812 (the regex engine's own names)
import re._parser as P  # noqa: N812
from collections.abc import Sequence

#: Characters a class is tried against: ASCII, and a few that printable ASCII leaves out.
_CANDIDATES = [chr(i) for i in range(128)] + ["é", "—", "你", "\u00a0"]


def width(pattern: str) -> tuple[int, int]:
    """The least and the most characters a string of ``pattern`` holds."""
    return P.parse(pattern).getwidth()


def _allowed(members: list, candidates: Sequence[str] = _CANDIDATES) -> list[str]:
    """The candidate characters a character class (its parsed members) allows."""
    negate = any(op is C.NEGATE for op, _ in members)

    def member(ch: str) -> bool:
        code = ord(ch)
        for op, value in members:
            if op is C.LITERAL and code == value:
                return True
            if op is C.RANGE and value[0] <= code <= value[1]:
                return True
            if op is C.CATEGORY:
                raise NotImplementedError(f"character category {value} in a class")
        return False

    return [ch for ch in candidates if member(ch) != negate]


class RegexStrings:
    """Draws strings of ``pattern`` with ``rng``; ``fragments`` are tried inside free text."""

    def __init__(self, pattern: str, rng: random.Random, fragments: Sequence[str] = ()):
        self.tree = P.parse(pattern)
        self.rng = rng
        self.fragments = list(fragments)

    def draw(self) -> str:
        return self._items(self.tree)

    def _count(self, lo: int, hi: int) -> int:
        hi = min(hi, lo + 10_000) if hi == C.MAXREPEAT else hi
        return self.rng.choice([lo, hi, self.rng.randint(lo, hi)])

    def _items(self, items) -> str:
        out = []
        for op, value in items:
            if op is C.LITERAL:
                out.append(chr(value))
            elif op is C.IN:
                out.append(self.rng.choice(_allowed(value)))
            elif op is C.SUBPATTERN:
                out.append(self._items(value[3]))
            elif op is C.BRANCH:
                out.append(self._items(self.rng.choice(value[1])))
            elif op in (C.MAX_REPEAT, C.MIN_REPEAT):
                lo, hi, sub = value
                n = self._count(lo, hi)
                if len(sub) == 1 and sub[0][0] is C.IN:
                    out.append(self._text(_allowed(sub[0][1]), n))
                else:
                    out.append("".join(self._items(sub) for _ in range(n)))
            elif op is C.AT:
                continue  # anchors add no character
            else:
                raise NotImplementedError(f"regex operator {op} in a drawn pattern")
        return "".join(out)

    def _text(self, allowed: list[str], n: int) -> str:
        """``n`` characters of a class: random ones, and the fragments that fit it."""
        fits = [f for f in self.fragments if f and all(ch in allowed for ch in f)]
        text = ""
        while len(text) < n:
            if fits and self.rng.random() < 0.3:
                text += self.rng.choice(fits)
            else:
                text += self.rng.choice(allowed)
        return text[:n]
