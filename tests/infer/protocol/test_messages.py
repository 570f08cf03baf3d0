from __future__ import annotations

import pytest

from keyshot.infer.protocol.messages import (
    MAX_KEPT_IMAGES,
    NO_DESCRIPTION,
    key_points_messages,
    outcome_messages,
    scorer_answer,
    scorer_example,
    scorer_messages,
)
from keyshot.infer.protocol.parsing import parse_score
from keyshot.infer.protocol.prompts import load_prompt_set, prompt_set_for_version

URL = "data:image/jpeg;base64,/9j/AAAA"


def test_prompt_sets_are_versioned_data():
    om2w, general = load_prompt_set("online_mind2web"), load_prompt_set("general")
    assert om2w.version != general.version and om2w.version.startswith("online_mind2web@")
    assert prompt_set_for_version(om2w.version) is om2w
    with pytest.raises(ValueError, match="not shipped"):
        prompt_set_for_version("online_mind2web@0000000000")
    # Trailing spaces of the reference strings are kept.
    assert "  \n" in om2w.system("key_screenshot")


def test_key_points_and_scorer_messages():
    ps = load_prompt_set()
    kp = key_points_messages(ps, "Buy milk")
    assert kp[1]["content"] == [{"type": "text", "text": "Task: Buy milk"}]
    msgs = scorer_messages(ps, "Buy milk", "\n1. milk", URL)
    assert msgs[0] == {"role": "system", "content": ps.system("key_screenshot")}
    text, image = msgs[1]["content"]
    assert text["text"].startswith("**Task**: Buy milk\n\n**Key Points for Task Completion**: \n1. milk")
    assert image == {"type": "image_url", "image_url": {"url": URL, "detail": "high"}}
    assert scorer_messages(ps, "Buy milk", "\n1. milk", None)[1]["content"][1] == {"type": "image"}


def test_scorer_example_adds_the_answer_and_keeps_one_schema():
    ps = load_prompt_set()
    turns = scorer_example(ps, "t", "k", scorer_answer("It shows the cart.", 4))
    assert [t["role"] for t in turns] == ["system", "user", "assistant"]
    assert all(isinstance(t["content"], list) for t in turns)
    answer = turns[2]["content"][0]["text"]
    assert parse_score(answer).score == 4 and parse_score(answer).thought == "It shows the cart."


def test_outcome_strict_pairs_images_with_descriptions():
    ps = load_prompt_set()
    msgs = outcome_messages(
        ps, "T", "K", ["click(1)", "type(2)"], None, [URL, URL], ["first", ""], mode="strict"
    )
    text = msgs[1]["content"][0]["text"]
    assert "Action History:\n1. click(1)\n2. type(2)" in text
    assert text.endswith(f"their reasons:\n1. first\n2. {NO_DESCRIPTION}")
    assert [p["image_url"]["url"] for p in msgs[1]["content"][1:]] == [URL, URL]
    with pytest.raises(ValueError, match="pair up"):
        outcome_messages(ps, "T", "K", [], None, [URL], [], mode="strict")
    with pytest.raises(ValueError, match="at most"):
        outcome_messages(ps, "T", "K", [], None, [URL] * 51, ["x"] * 51, mode="strict")


def test_outcome_reference_quirks():
    ps = load_prompt_set()
    msgs = outcome_messages(ps, "T", "K", ["a"], None, [URL] * 52, ["x", ""] * 26, mode="reference")
    images = msgs[1]["content"][1:]
    assert len(images) == MAX_KEPT_IMAGES
    assert images[0]["image_url"]["url"].startswith("data:image/png;base64,")  # defect 1, kept for parity
    assert msgs[1]["content"][0]["text"].endswith("\n26. x")  # empty thoughts dropped: drift (defect 8)


def test_outcome_without_screenshots_and_general_actions():
    ps = load_prompt_set("general")
    msgs = outcome_messages(ps, "T", "K", ["click(1)"], ["open the menu"], [], [])
    text = msgs[1]["content"][0]["text"]
    assert text.endswith("Action History:\n1. click(1). Reasoning: open the menu")
    assert len(msgs[1]["content"]) == 1
