"""Reading log-probabilities at the place the parser read an answer.

``logprobs`` is the OpenAI ``choices[0].logprobs.content`` list: per generated token its text, logprob
and ``top_logprobs`` alternatives. The score's distribution (the scorer's expected score) and the
status's (the outcome's probability of success) are read at the token where the parser found them.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

from keyshot.infer.common.text import count_of
from keyshot.infer.protocol.parsing import STATUS_MARKS, STATUS_WORDS, Mode, status_word_offset

_STRIP = string.whitespace + STATUS_MARKS


def token_index(text: str, logprobs: list[dict], offset: int) -> int | None:
    """The generated token that covers character ``offset`` of ``text``, or None when the tokens'
    strings do not concatenate to the text (a server splitting UTF-8 bytes)."""
    tokens = [str(item.get("token") or "") for item in logprobs]
    if "".join(tokens) != text:
        return None
    start = 0
    for i, tok in enumerate(tokens):
        if start <= offset < start + len(tok):
            return i
        start += len(tok)
    return None


def alternatives(item: dict) -> dict[str, float]:
    """The probability of each token offered at one position (its own and its ``top_logprobs``)."""
    probs: dict[str, float] = {}
    for alt in [*(item.get("top_logprobs") or []), item]:
        lp = alt.get("logprob")
        if isinstance(lp, int | float) and math.isfinite(lp):
            tok = str(alt.get("token") or "")
            probs[tok] = max(probs.get(tok, 0.0), math.exp(lp))
    return probs


def _status_of(token: str) -> bool | None:
    """True for a token that begins a success word of :data:`~keyshot.infer.protocol.parsing.STATUS_WORDS`
    (or is one, continued), False for a failure word's, None for others and for a token that could begin
    either."""
    word = token.strip(_STRIP).lower()
    if not word:
        return None
    says = {success for w, success in STATUS_WORDS.items() if w.startswith(word) or word.startswith(w)}
    return says.pop() if len(says) == 1 else None


@dataclass(frozen=True)
class StatusProbability:
    """P(success) at the status word, with what it rests on: ``alternatives``, the status words among the
    tokens offered there (success and failure words together); ``note`` says when one side had none of
    them (a word outside the returned top-k is unseen, so 1.0 or 0.0 is only what the top-k shows)."""

    p_success: float
    alternatives: int
    note: str | None = None


def read_status_probability(
    text: str, logprobs: list[dict] | None, success: bool | None, mode: Mode = "strict"
) -> StatusProbability | None:
    """P(success) at the status word the parser read: the offered tokens that begin a success word
    against those that begin a failure word, renormalised over the two; None when the answer has no
    status, the token there is not a status word matching the reading, or no alternative is either."""
    if not logprobs or success is None:
        return None
    offset = status_word_offset(text, mode)
    position = None if offset is None else token_index(text, logprobs, offset)
    if position is None or _status_of(str(logprobs[position].get("token") or "")) is not success:
        return None
    offered = alternatives(logprobs[position])
    p = {True: 0.0, False: 0.0}
    counted = 0
    for tok, prob in offered.items():
        if (status := _status_of(tok)) is not None:
            p[status] += prob
            counted += 1
    total = p[True] + p[False]
    if total <= 0:
        return None
    note = None
    missing = [name for status, name in ((False, "failure"), (True, "success")) if p[status] == 0]
    if missing:
        least = min(offered.values())
        note = (
            f"no {missing[0]} word among the {count_of(len(offered), 'token', 'tokens')} returned at the status word: p_success "
            f"{p[True] / total:.1f} says only that; a {missing[0]} word outside them had p <= {least:.3g} "
            "(ask for more with pipeline.outcome_logprobs)"
        )
    return StatusProbability(p[True] / total, counted, note)
