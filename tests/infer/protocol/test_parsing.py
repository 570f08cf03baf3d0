"""Parsers on every released WebJudge answer of AgentRewardBench (dev) and on hand-made cases."""

from __future__ import annotations

import gzip
import json
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
    import math

    from keyshot.infer.protocol.logprobs import p_success_from_logprobs
    from keyshot.infer.protocol.parsing import status_word_offset

    def lp(token, alts):
        return {
            "token": token,
            "logprob": math.log(alts[token]),
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in alts.items()],
        }

    head = 'Thoughts: the page shows Status: in passing.\n**Status:** "'
    text = head + 'success"'
    assert text[status_word_offset(text) :].startswith("success")
    tokens = [
        lp(head, {head: 1.0}),
        lp("success", {"success": 0.6, " fail": 0.3, "Succ": 0.05, "maybe": 0.05}),
        lp('"', {'"': 1.0}),
    ]
    assert p_success_from_logprobs(text, tokens, True) == pytest.approx(0.65 / 0.95)
    assert p_success_from_logprobs(text, tokens, False) is None  # the token there is not the reading
    assert p_success_from_logprobs(text, tokens[:2], True) is None  # tokens that are not the text
    assert p_success_from_logprobs("no status here", tokens, True) is None
    unsure = text.replace("success", "unsuccessful")
    tokens[1] = lp("unsuccessful", {"unsuccessful": 0.7, "success": 0.3})
    assert p_success_from_logprobs(unsure, tokens, False) == pytest.approx(0.3)
