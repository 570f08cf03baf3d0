"""Responders: ``(request_json) -> completion text``. The built-in ones identify the WebJudge step from the
system prompt (``keyshot.infer.protocol.prompts``) and answer deterministically: key points split from
the task, a screenshot score from :mod:`keyshot.infer.testing.fake_rules`, an outcome by a named rule."""

from __future__ import annotations

import re
from collections.abc import Callable

from PIL import Image

from keyshot.infer.testing.fake_requests import (
    ResponderError,
    decode_data_url,
    decode_image,
    identify_step,
    user_parts,
)
from keyshot.infer.testing.fake_rules import SCORE_RULES, score_image, stable_fraction

GARBAGE_TEXT = "I had a look at this and I think it is probably fine, more or less."

Responder = Callable[[dict], str]


def _task_after(label: str, text: str) -> str:
    for line in text.splitlines():
        if line.startswith(label):
            return line[len(label) :].strip()
    return text.strip().splitlines()[0] if text.strip() else ""


def key_points_answer(task: str) -> str:
    pieces = [p.strip(" .") for p in re.split(r",|;|\.\s|\band\b", task)]
    points = [p for p in pieces if p] or [task.strip() or "complete the task"]
    return "**Key Points**:\n" + "\n".join(f"{i + 1}. {p[:1].upper() + p[1:]}" for i, p in enumerate(points))


def outcome_answer(task: str, n_images: int, rule: str, context: str = "") -> str:
    if rule == "evidence":  # 1-3 key screenshots needed, by the task and key points (each key point its own)
        need = 1 + int(stable_fraction(context.encode()) * 3)
        success = n_images >= need
        why = f"{n_images} key screenshot(s) of the {need} needed show evidence"
    elif rule == "any_image":
        success = n_images > 0
        why = f"{n_images} key screenshot(s) show evidence" if success else "no key screenshot shows evidence"
    elif rule == "task_hash":
        success = stable_fraction(task.encode()) < 0.5
        why = "the trajectory covers every key point" if success else "a key point is not met"
    elif rule in ("always_success", "always_failure"):
        success = rule == "always_success"
        why = "fixed verdict"
    else:
        raise ValueError(f"unknown outcome rule {rule!r}")
    status = "success" if success else "failure"
    return f'Thoughts: For the task "{task[:80]}", {why}.\nStatus: "{status}"'


#: A listed screenshot of the step question (:func:`keyshot.infer.protocol.messages.screenshot_listing`).
_LISTED = re.compile(r"^Screenshot (\d+) \(score (\d|unread)\): ", re.M)
FIRST_MET = "First Met: Screenshot N"
#: The score from which the fake judge takes a listed screenshot to show a key point met.
MET_SCORE = 3


def is_follow_up(request: dict) -> bool:
    """Whether the request follows an answer of the judge's (the step question after the outcome)."""
    return any(m.get("role") == "assistant" for m in request.get("messages", []))


def met_screenshots(text: str) -> list[int]:
    """The listed screenshots, in order, whose score shows a key point met (at least :data:`MET_SCORE`)."""
    return [int(i) for i, score in _LISTED.findall(text) if score != "unread" and int(score) >= MET_SCORE]


def key_point_steps_answer(text: str) -> str:
    """The step question's answer: key point k is first met at the k-th listed screenshot scored at least
    :data:`MET_SCORE` (none when there are fewer), so progress rises with each such screenshot."""
    block = text.split("The key points:", 1)[-1].split("\n\n", 2)[0]
    count = len(re.findall(r"^\d+\. ", block, re.M))
    met = met_screenshots(text)
    lines = [
        f"Key Point {k + 1}: " + (f"Screenshot {met[k]}" if k < len(met) else "none") for k in range(count)
    ]
    return "\n".join(lines)


def first_met_line(text: str, answer: str) -> str:
    """The line a per-key-point outcome answer adds when asked: its first screenshot scored at least
    :data:`MET_SCORE` (else the last listed one) when the status is success, none otherwise."""
    if '"failure"' in answer:
        return "\nFirst Met: none"
    listed = [int(i) for i, _ in _LISTED.findall(text)]
    met = met_screenshots(text) or listed[-1:]
    return f"\nFirst Met: Screenshot {met[0]}" if met else "\nFirst Met: none"


def make_judge(
    outcome_rule: str = "any_image", score_rule: str = "brightness", *, reasoning_words: int = 0
) -> Responder:
    """A deterministic WebJudge judge for all three steps.

    Key points: the task split into clauses. Scorer: ``score_rule`` applied to the screenshot.
    Outcome: ``any_image`` (success iff at least one kept screenshot was attached), ``evidence`` (iff
    at least 1-3 were, the number set by the request's text: the key points of one task differ), ``task_hash``,
    ``always_success`` or ``always_failure``. ``reasoning_words`` makes the scorer verbose: that many
    more words of reasoning before the score (about two tokens each), so a small ``max_tokens`` cuts
    the answer before its score (the server answers ``finish_reason: "length"``).
    """
    outcome_answer("", 0, outcome_rule)  # reject an unknown rule now, not at the first request
    score_image(score_rule, Image.new("RGB", (1, 1)))

    def respond(request: dict) -> str:
        step = identify_step(request)
        text, images = user_parts(request)
        if step == "key_points":
            return key_points_answer(_task_after("Task:", text))
        if step == "outcome" and is_follow_up(request):
            return key_point_steps_answer(text)
        if step == "outcome":
            points = re.search(r"Key Points:(.*?)\n\n", text, re.S)
            task = _task_after("User Task:", text)
            answer = outcome_answer(
                task, len(images), outcome_rule, task + (points.group(1) if points else "")
            )
            return answer + first_met_line(text, answer) if FIRST_MET in text else answer
        return _score_answer(images, score_rule, reasoning_words)

    return respond


def _score_answer(images: list[str], rule: str, reasoning_words: int = 0) -> str:
    if len(images) != 1:
        raise ResponderError(f"a key-screenshot request needs exactly one image, got {len(images)}")
    score, description = SCORE_RULES[rule](decode_image(images[0]))
    more = "".join(f" Region {i + 1} of the page was looked at." for i in range(-(-reasoning_words // 7)))
    return (
        f"**Reasoning**: {description}{more} It is judged by its {rule.replace('_', ' ')}."
        f"\n\n**Score**: {score}"
    )


def make_teacher(rule: str = "brightness", garbage_rate: float = 0.0, seed: int = 0) -> Responder:
    """A teacher for the key-screenshot step with its own scoring rule.

    A share ``garbage_rate`` of screenshots (chosen by a hash of the image bytes and ``seed``, so
    the same screenshot always gets the same kind of answer) is answered without a score. The
    other two steps are answered like :func:`make_judge`.
    """
    if rule not in SCORE_RULES:
        raise ValueError(f"unknown scoring rule {rule!r}; choose one of {', '.join(SCORE_RULES)}")
    judge = make_judge(score_rule=rule)

    def respond(request: dict) -> str:
        if identify_step(request) != "key_screenshot":
            return judge(request)
        _, images = user_parts(request)
        if len(images) == 1 and stable_fraction(decode_data_url(images[0]), seed) < garbage_rate:
            return GARBAGE_TEXT
        return _score_answer(images, rule)

    return respond


judge_responder: Responder = make_judge()


def echo_responder(request: dict) -> str:
    """Answers with the last user message's text."""
    return user_parts(request)[0]


def get_responder(name: str) -> Responder:
    """Built-in responders by name: ``judge``, ``judge:OUTCOME_RULE``, ``teacher:RULE[:GARBAGE_RATE]``, ``echo``."""
    kind, _, rest = name.partition(":")
    if kind == "judge":
        return make_judge(rest) if rest else judge_responder
    if kind == "teacher":
        rule, _, rate = rest.partition(":")
        return make_teacher(rule or "brightness", float(rate) if rate else 0.0)
    if kind == "echo":
        return echo_responder
    raise ValueError(f"unknown responder {name!r}; use judge[:RULE], teacher:RULE[:GARBAGE_RATE] or echo")
