"""The answer format of each WebJudge call as a regular expression: what constrained decoding holds an
answer to (vLLM's structured outputs, ``constrained: true`` on an endpoint; docs/reliability.md).

One pattern per prompt variant and step, written from the format the prompt set asks for
(``prompts/webjudge_prompts.json``) and read back by the protocol's own parsers
(:mod:`keyshot.infer.protocol.parsing`, strict mode; ``tests/infer/protocol/test_answer_format.py`` checks every kind
of string a pattern allows):

* key points: ``**Key Points**:`` and a numbered list, one point per line;
* key screenshot, ``online_mind2web``: ``**Reasoning**: …`` then ``**Score**: N`` (the released
  WebJudge-7B's style, the prompt's optional ``1.``/``2.`` numbering allowed);
  ``general``: ``### Reasoning: …`` then ``### Score: N``;
* outcome: ``Thoughts: …`` then ``Status: "success"`` or ``Status: "failure"``.

The free text (reasoning, thoughts, key points) is printable ASCII, so an answer of ``n`` characters is
at most ``n`` tokens, and its length is bounded so that the whole answer stays below the call's token
limit: a constrained answer always ends in its score or status, never cut by ``max_tokens``. That bound
is also what it costs: a reasoning longer than the limit allows is cut short by the pattern (raise the
limit for longer reasoning). Reference mode never constrains (parity with the reference's requests).
"""

from __future__ import annotations

from dataclasses import dataclass

from keyshot.infer.protocol.prompts import STEPS, prompt_source

#: One character of free text: printable ASCII (a token of it holds at least one character).
LINE_CHAR = "[ -~]"
#: Free text that may also break lines (the outcome's thoughts).
TEXT_CHAR = "[ -~\\n]"
#: The first character of free text: not blank (a key point of spaces is no key point).
FIRST_CHAR = "[!-~]"
#: The least room for free text (characters) a token limit must leave; a smaller limit is refused.
MIN_TEXT = 8
#: The most key points a constrained key-point answer lists.
MAX_KEY_POINTS = 5


class AnswerFormatError(ValueError):
    """A token limit too small for a constrained answer of its step."""


@dataclass(frozen=True)
class Piece:
    """A fixed part of a pattern: its regex and the most characters it matches."""

    regex: str
    width: int


_SPECIAL = set(".^$*+?{}[]\\|()")


def _escape(text: str) -> str:
    """``text`` as a regex literal in the syntax every structured-output back-end reads: a backslash
    before regex operators only, a line break as ``\\n``."""
    return "".join("\\n" if c == "\n" else "\\" + c if c in _SPECIAL else c for c in text)


def _lit(text: str) -> Piece:
    return Piece(_escape(text), len(text))


def _optional(text: str) -> Piece:
    return Piece(f"(?:{_escape(text)})?", len(text))


# The fixed parts around the free text of each call, per prompt variant.
_SCORE = {
    "online_mind2web": (
        (_optional("1. "), _lit("**Reasoning**: ")),
        (Piece("\\n\\n?", 2), _optional("2. "), _lit("**Score**: ")),
    ),
    "general": ((_lit("### Reasoning: "),), (Piece("\\n\\n?", 2), _lit("### Score: "))),
}
_DIGIT = Piece("[1-5]", 1)
_KEY_POINTS_LABEL = _lit("**Key Points**:")
_THOUGHTS = _lit("Thoughts: ")
_STATUS = (_lit('\nStatus: "'), Piece("(?:success|failure)", 7), _lit('"'))


def _free(char: str, most: int) -> str:
    """Free text of 1..``most`` characters of ``char``, the first one not blank."""
    return f"{FIRST_CHAR}{char}{{0,{most - 1}}}"


def _width(pieces: tuple[Piece, ...]) -> int:
    return sum(p.width for p in pieces)


def _join(pieces: tuple[Piece, ...]) -> str:
    return "".join(p.regex for p in pieces)


@dataclass(frozen=True)
class AnswerFormat:
    """The answer format of one call (``step``: key_points, key_screenshot or outcome) of one prompt
    variant. :meth:`regex` is the pattern for a call whose answer may hold ``max_tokens`` tokens."""

    variant: str
    step: str

    def __post_init__(self) -> None:
        prompt_source(self.variant)  # PromptSetError (a ValueError) naming the known ones
        if self.step == "key_screenshot" and self.variant not in _SCORE:
            raise ValueError(
                f"prompt variant {self.variant!r} has no answer format for constrained decoding: add the "
                "fixed parts around its reasoning and score to _SCORE (keyshot.infer.protocol.answer_format)"
            )
        if self.step not in STEPS:
            raise ValueError(f"unknown step {self.step!r}; one of {', '.join(STEPS)}")

    def fixed_width(self) -> int:
        """The most characters the pattern's fixed parts take (one key point's, for key points)."""
        if self.step == "key_screenshot":
            before, after = _SCORE[self.variant]
            return _width(before) + _width(after) + _DIGIT.width
        if self.step == "outcome":
            return _THOUGHTS.width + _width(_STATUS)
        return _KEY_POINTS_LABEL.width + len("\n1. ")

    def min_tokens(self) -> int:
        """The least token limit a constrained call of this step takes (room for its fixed parts, at
        least :data:`MIN_TEXT` characters of free text and the end-of-answer token)."""
        return self.fixed_width() + MIN_TEXT + 1

    def regex(self, max_tokens: int) -> str:
        """The pattern of an answer of at most ``max_tokens - 1`` characters (the last token is the
        end of the answer), so a constrained answer is never cut by its limit."""
        if max_tokens < self.min_tokens():
            raise AnswerFormatError(
                f"a constrained {self.step} answer ({self.variant}) needs max_tokens >= {self.min_tokens()}, "
                f"got {max_tokens}"
            )
        budget = max_tokens - 1
        if self.step == "key_screenshot":
            before, after = _SCORE[self.variant]
            text = budget - self.fixed_width()
            return f"{_join(before)}{_free(LINE_CHAR, text)}{_join(after)}{_DIGIT.regex}"
        if self.step == "outcome":
            text = budget - self.fixed_width()
            return f"{_THOUGHTS.regex}{_free(TEXT_CHAR, text)}{_join(_STATUS)}"
        return self._key_points(budget)

    def _key_points(self, budget: int) -> str:
        """``**Key Points**:`` and 1..k numbered lines, k and each line's length within ``budget``."""
        room = budget - _KEY_POINTS_LABEL.width
        count = max(1, min(MAX_KEY_POINTS, room // (4 * MIN_TEXT)))
        text = room // count - len("\n9. ")
        body = ""
        for i in range(count, 0, -1):  # "\n1. A(?:\n2. B(?:\n3. C)?)?", built from the last point
            item = f"\\n{i}\\. {_free(LINE_CHAR, text)}"
            body = item + (f"(?:{body})?" if body else "")
        return _KEY_POINTS_LABEL.regex + body


def answer_format(variant: str, step: str) -> AnswerFormat:
    """The answer format of ``step`` in prompt variant ``variant``."""
    return AnswerFormat(variant, step)
