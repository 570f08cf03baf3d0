"""Reading log-probabilities at the place the parser read an answer.

``logprobs`` is the OpenAI ``choices[0].logprobs.content`` list: per generated token its text, logprob
and ``top_logprobs`` alternatives. The score's distribution (the scorer's expected score) and the
status's (the outcome's probability of success) are read at the token where the parser found them.
"""

from __future__ import annotations

import math

from keyshot.infer.protocol.parsing import Mode, status_word_offset

_SUCCESS = ("success", "successful", "succeeded")
_FAILURE = ("failure", "failed", "fail", "unsuccessful")
_STRIP = " \t\n\"'`*[(<"


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
    """True for a token that begins a success word, False for a failure word, None for others."""
    word = token.strip(_STRIP).lower()
    if not word:
        return None
    if any(w.startswith(word) or word.startswith(w) for w in _FAILURE):
        return False
    if any(w.startswith(word) or word.startswith(w) for w in _SUCCESS):
        return True
    return None


def p_success_from_logprobs(
    text: str, logprobs: list[dict] | None, success: bool | None, mode: Mode = "strict"
) -> float | None:
    """P(success) at the status word the parser read: the offered tokens that begin a success word
    against those that begin a failure word, renormalised over the two; None when the answer has no
    status, the token there is not a status word matching the reading, or no alternative is either."""
    if not logprobs or success is None:
        return None
    offset = status_word_offset(text, mode)
    position = None if offset is None else token_index(text, logprobs, offset)
    if position is None or _status_of(str(logprobs[position].get("token") or "")) is not success:
        return None
    p = {True: 0.0, False: 0.0}
    for tok, prob in alternatives(logprobs[position]).items():
        if (status := _status_of(tok)) is not None:
            p[status] += prob
    total = p[True] + p[False]
    return p[True] / total if total > 0 else None
