"""Parsers on every released WebJudge answer of AgentRewardBench (dev) and on hand-made cases."""

from __future__ import annotations

import gzip
import json
import math
import re

import pytest

from keyshot.infer.protocol.parsing import ParseError, parse_key_points, parse_score, parse_status
from tests.support.paths import FIXTURES

with gzip.open(FIXTURES / "arb_parsing" / "dev_responses.jsonl.gz", "rt", encoding="utf-8") as _fh:
    RECORDS = [json.loads(line) for line in _fh]


def variant_of(record: dict) -> str:
    # WebJudge-7B was trained on and served with the online_mind2web scorer prompt; the API
    # judges of the released run used the general prompt set.
    return "online_mind2web" if record["judge"] == "webjudge_7B" else "general"


def scorer_answers():
    for r in RECORDS:
        for i, item in enumerate(r["image_judge_record"]):
            yield r, i, item


def test_fixture_is_the_whole_dev_split():
    assert len(RECORDS) == 215
    assert sum(len(r["image_judge_record"]) for r in RECORDS) == 3679


def test_reference_mode_reproduces_every_recorded_score():
    mismatches = [
        (r["path"], i, item["Score"], parse_score(item["Response"], "reference", variant_of(r)).score)
        for r, i, item in scorer_answers()
        if parse_score(item["Response"], "reference", variant_of(r)).score != item["Score"]
    ]
    assert mismatches == []


def test_strict_mode_differs_only_where_the_reference_misreads():
    differences = []
    for r, _, item in scorer_answers():
        variant = variant_of(r)
        ref = parse_score(item["Response"], "reference", variant)
        strict = parse_score(item["Response"], "strict", variant)
        if strict.score != ref.score:
            differences.append((item["Response"], ref, strict))
    # The cases, shown: the general reference parser only reads "### Score", so a plain
    # "Score: 1" line is a silent 0; strict reads the labelled score. One answer has no score at
    # all ("Answer: 0"): the reference says 0, strict says invalid.
    assert len(differences) == 6
    for text, ref, strict in differences:
        assert ref.score == 0
        if strict.valid:
            label = re.search(r"(?:^|\n)Score: ([1-5])\s*$", text)
            assert label and int(label.group(1)) == strict.score
        else:
            assert strict.score is None and "Score" not in text and strict.error


def test_reference_thoughts_and_keep_rule_rebuild_every_released_outcome_prompt():
    from keyshot.infer.protocol.messages import outcome_messages
    from keyshot.infer.protocol.prompts import load_prompt_set

    general = load_prompt_set("general")
    for r in RECORDS:
        parsed = [
            parse_score(item["Response"], "reference", variant_of(r)) for item in r["image_judge_record"]
        ]
        kept = [p for p in parsed if p.score >= 3]
        images = ["data:image/jpeg;base64,AAAA"] * len(kept)
        messages = outcome_messages(
            general, r["goal"], r["key_points"], [], None, images, [p.thought for p in kept], mode="reference"
        )
        text = messages[1]["content"][0]["text"]
        head, _, tail = text.partition("Action History:\n")
        # (ARB cut VisualWebArena's input-image line from the goal, so compare from the key points on.)
        assert r["input_text"].startswith("User Task: "), r["path"]
        assert (
            "\n\nKey Points: " + head.split("\n\nKey Points: ", 1)[1] + "Action History:\n" in r["input_text"]
        )
        snapshot_marker = "their reasons:\n"
        if kept:
            assert r["input_text"].endswith(snapshot_marker + tail.split(snapshot_marker, 1)[1]), r["path"]
        else:
            assert snapshot_marker not in r["input_text"]
        n_images = sum(1 for part in messages[1]["content"] if part["type"] == "image_url")
        assert n_images == r["n_outcome_images"], r["path"]


def reference_status_rule(text: str) -> bool:
    """The reference's outcome rule, transcribed: success iff "success" follows the first "status:"."""
    try:
        return "success" in text.lower().split("status:")[1]
    except IndexError:
        return False


def test_reference_status_matches_the_rule_on_every_released_outcome():
    for r in RECORDS:
        assert parse_status(r["outcome_response"], "reference").success == reference_status_rule(
            r["outcome_response"]
        )


def test_strict_status_agrees_on_every_well_formed_released_outcome():
    for r in RECORDS:
        strict = parse_status(r["outcome_response"], "strict")
        assert strict.valid, r["outcome_response"][-200:]
        assert strict.success == parse_status(r["outcome_response"], "reference").success


@pytest.mark.parametrize(
    ("text", "reference", "strict"),
    [
        ('Thoughts: fine.\nStatus: "success"', True, True),
        ('Thoughts: no.\nStatus: "failure"', False, False),
        ("Thoughts: the agent was unsuccessful.\nStatus: unsuccessful", True, False),  # defect 4
        ("Thoughts: x\nStatus: not successful", True, False),  # defect 4
        ("Thoughts: x\n**Status**: Success", False, True),  # bold label: reference finds no "status:"
        (
            "Thoughts: cut off before the verdict because max_tokens",
            False,
            None,
        ),  # defect 3: explicit invalid
        ("Status: maybe", False, None),
    ],
)
def test_status_cases(text, reference, strict):
    assert parse_status(text, "reference").success is reference
    result = parse_status(text, "strict")
    assert result.success is strict
    assert result.valid is (strict is not None)
    if strict is None:
        assert result.error


@pytest.mark.parametrize(
    ("text", "reference", "strict"),
    [
        ("**Reasoning**: a login page.\n\n**Score**: 2", 2, 2),
        ("**Reasoning**: shows a Credit Score 750 field.\n\n**Score**: 4", 5, 4),  # defect 4
        ("**Reasoning**: a long answer cut by max_tokens before the", 0, None),  # defect 3
        ("**Reasoning**: ok\n\n**Score**: 10", 1, None),
        ("**Reasoning**: fine\n\nScore (1-5): 3", 1, 3),
    ],
)
def test_score_cases(text, reference, strict):
    assert parse_score(text, "reference").score == reference
    result = parse_score(text, "strict")
    assert result.score == strict
    assert result.valid is (strict is not None)


def test_score_thought_is_the_first_reasoning_paragraph():
    text = "**Reasoning**: The cart shows\ntwo iPads.\n\nMore detail.\n\n**Score**: 5"
    assert parse_score(text, "reference").thought == "The cart shows two iPads."
    assert parse_score(text, "strict").thought == "The cart shows two iPads."


def test_key_points_reference_and_strict():
    answer = "Sure.\n\n**Key Points**:\n1. Find a hotel\n\n   2. Sort by price"
    assert parse_key_points(answer, "reference") == "\n1. Find a hotel\n2. Sort by price"
    assert parse_key_points(answer, "strict") == "\n1. Find a hotel\n2. Sort by price"
    bold_colon_inside = "**Key Points:**\n1. Find a hotel"
    assert parse_key_points(bold_colon_inside, "strict") == "\n1. Find a hotel"
    assert parse_key_points(bold_colon_inside, "reference").startswith(
        "**"
    )  # the reference keeps the stray bold
    with pytest.raises(ParseError):
        parse_key_points("  \n", "strict")
    with pytest.raises(ValueError, match="parse mode"):
        parse_key_points("x", "lenient")


def test_p_success_is_read_where_the_status_was_read():
    from keyshot.infer.protocol.logprobs import read_status_probability
    from keyshot.infer.protocol.parsing import status_word_offset

    head = 'Thoughts: the page shows Status: in passing.\n**Status:** "'
    text = head + 'success"'
    assert text[status_word_offset(text) :].startswith("success")
    tokens = [
        _logprob(head, {head: 1.0}),
        _logprob("success", {"success": 0.6, " fail": 0.3, "Succ": 0.05, "maybe": 0.05}),
        _logprob('"', {'"': 1.0}),
    ]
    reading = read_status_probability(text, tokens, True)
    assert reading.p_success == pytest.approx(0.65 / 0.95) and reading.alternatives == 3
    assert read_status_probability(text, tokens, False) is None  # the token there is not the reading
    assert read_status_probability(text, tokens[:2], True) is None  # tokens that are not the text
    assert read_status_probability("no status here", tokens, True) is None
    unsure = text.replace("success", "unsuccessful")
    tokens[1] = _logprob("unsuccessful", {"unsuccessful": 0.7, "success": 0.3})
    assert read_status_probability(unsure, tokens, False).p_success == pytest.approx(0.3)


def _logprob(token: str, alts: dict[str, float]) -> dict:
    """One generated token with its top alternatives (probabilities), as an OpenAI server returns it."""
    return {
        "token": token,
        "logprob": math.log(alts[token]),
        "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in alts.items()],
    }


def _status_answer(word: str, alts: dict[str, float]) -> tuple[str, list[dict]]:
    """``Status: "<word>"`` with ``word`` one token offered among ``alts``."""
    head = 'Thoughts: done.\nStatus: "'
    return head + word + '"', [_logprob(head, {head: 1.0}), _logprob(word, alts), _logprob('"', {'"': 1.0})]


def test_every_status_word_the_parser_reads_is_read_for_p_success():
    """One table of status words: each word the parser accepts gets a p_success of its own side."""
    from keyshot.infer.protocol.logprobs import read_status_probability
    from keyshot.infer.protocol.parsing import STATUS_WORDS

    for word, success in STATUS_WORDS.items():
        other = "failure" if success else "success"
        text, tokens = _status_answer(word, {word: 0.7, other: 0.3})
        assert parse_status(text).success is success, word
        reading = read_status_probability(text, tokens, success)
        assert reading is not None, word
        assert reading.p_success == pytest.approx(0.7 if success else 0.3), word
        assert reading.alternatives == 2 and reading.note is None, word


def test_p_success_counts_every_status_word_offered():
    """The issue's numbers: "not" (of "not successful") is a failure alternative, so success 0.5, "not"
    0.45, failure 0.05 give 0.5, not 0.5 / 0.55 = 0.909; "complete" is read, not None."""
    from keyshot.infer.protocol.logprobs import read_status_probability

    text, tokens = _status_answer("success", {"success": 0.5, "not": 0.45, "failure": 0.05})
    reading = read_status_probability(text, tokens, True)
    assert reading.p_success == pytest.approx(0.5) and reading.alternatives == 3
    text, tokens = _status_answer("complete", {"complete": 0.6, "incomplete": 0.3, "in": 0.1})
    assert parse_status(text).success is True
    assert read_status_probability(text, tokens, True).p_success == pytest.approx(0.6)
    head = 'Status: "'
    text = head + 'not successful"'
    tokens = [
        _logprob(head, {head: 1.0}),
        _logprob("not", {"not": 0.8, "success": 0.2}),
        _logprob(" successful", {" successful": 1.0}),
        _logprob('"', {'"': 1.0}),
    ]
    assert parse_status(text).success is False
    assert read_status_probability(text, tokens, False).p_success == pytest.approx(0.2)


def test_p_success_of_one_side_only_says_so():
    """No failure word among the returned tokens: p_success is 1.0 as far as they show, and the reading says
    that a failure word outside them had at most the least returned probability."""
    from keyshot.infer.protocol.logprobs import read_status_probability

    text, tokens = _status_answer("success", {"success": 0.9, "Success": 0.04, "maybe": 0.01})
    reading = read_status_probability(text, tokens, True)
    assert reading.p_success == 1.0 and reading.alternatives == 2
    assert "no failure word among the 3 tokens returned" in reading.note and "p <= 0.01" in reading.note
    text, tokens = _status_answer("failure", {"failure": 0.97, "maybe": 0.03})
    reading = read_status_probability(text, tokens, False)
    assert reading.p_success == 0.0 and "no success word" in reading.note


# ---------------------------------------------------------------- when each key point was first met
def test_key_point_steps_are_read_strictly():
    from keyshot.infer.protocol.parsing import parse_first_met, parse_key_point_steps

    shots = {0, 1, 2, 3}
    good = (
        "Here is my reading.\n**Key Point 1**: Screenshot 2\nKey Point 2: none.\nkey point 3: screenshot #0"
    )
    assert parse_key_point_steps(good, 3, shots).steps == [2, None, 0]
    for text, why in [
        ("Key Point 1: Screenshot 2", "no line for key point(s) [2]"),
        ("Key Point 1: Screenshot 2\nKey Point 1: none\nKey Point 2: none", "answered twice"),
        ("Key Point 1: Screenshot 9\nKey Point 2: none", "screenshot 9 is not one of"),
        ("Key Point 1: probably the second\nKey Point 2: none", "neither 'Screenshot N' nor 'none'"),
        ("Key Point 3: none\nKey Point 1: none\nKey Point 2: none", "key point 3 named, but there are 2"),
        ("", "no line for key point(s) [1, 2]"),
    ]:
        result = parse_key_point_steps(text, 2, shots)
        assert (result.steps, result.valid) == (None, False) and why in result.error, text
    assert parse_first_met('Status: "success"\nFirst Met: Screenshot 3', True, shots).steps == [3]
    assert parse_first_met('Status: "failure"\nFirst Met: none', False, shots).steps == [None]
    for text, success, why in [
        ('Status: "success"\nFirst Met: none', True, "status success, but First Met: none"),
        ('Status: "failure"\nFirst Met: Screenshot 1', False, "status failure, but"),
        ('Status: "success"', True, "0 'First Met:' lines"),
        ("Status: maybe\nFirst Met: Screenshot 1", None, "no status read"),
    ]:
        result = parse_first_met(text, success, shots)
        assert result.steps is None and why in result.error, text
