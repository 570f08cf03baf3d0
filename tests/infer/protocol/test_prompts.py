"""keyshot.infer.protocol.prompts: the prompt sets are a registry. keyshot's two come from its JSON; a set
registered beside them is loaded, versioned, parsed with its own labels and recognised by the fake
server; an unknown variant is refused with the known ones listed, a name taken or a set missing a
string is refused."""

from __future__ import annotations

import pytest

from keyshot.infer.common.registry import DuplicateName
from keyshot.infer.protocol.parsing import parse_score
from keyshot.infer.protocol.prompts import (
    KEYS,
    PROMPT_SETS,
    VARIANTS,
    PromptSetError,
    PromptSource,
    load_prompt_set,
    prompt_set_for_version,
    register_prompt_set,
)
from keyshot.infer.testing.fake_requests import identify_step

TERSE = "terse"


def terse_strings() -> dict[str, str]:
    return {key: f"Terse {key}." for key in KEYS}


@pytest.fixture
def terse():
    source = register_prompt_set(TERSE, PromptSource(terse_strings, "Why:", "Mark"))
    try:
        yield source
    finally:
        PROMPT_SETS.remove(TERSE)
        load_prompt_set.cache_clear()


def test_keyshots_own_sets_are_registered_and_keep_their_versions():
    assert PROMPT_SETS.names()[:2] == VARIANTS
    for variant in VARIANTS:
        prompts = load_prompt_set(variant)
        assert prompt_set_for_version(prompts.version) is prompts
        assert {key for key, _ in prompts.strings} == set(KEYS)


def test_an_unknown_variant_is_refused_with_the_known_ones():
    with pytest.raises(PromptSetError) as raised:
        load_prompt_set("webjudge-9")
    assert str(raised.value) == (
        "unknown prompt variant 'webjudge-9' (pipeline.prompt_variant); known: online_mind2web, general"
    )
    with pytest.raises(ValueError, match="unknown prompt variant 'webjudge-9'"):
        parse_score("Score: 3", variant="webjudge-9")


def test_a_registered_set_is_loaded_parsed_with_its_labels_and_recognised(terse):
    prompts = load_prompt_set(TERSE)
    assert prompts.system("outcome") == "Terse outcome.system." and prompts.version.startswith("terse@")
    assert prompt_set_for_version(prompts.version) is prompts
    answer = "Why: the cart shows the item.\nMark 4"
    assert parse_score(answer, "reference", variant=TERSE).score == 4
    assert parse_score(answer, "reference", variant=TERSE).thought.strip() == "the cart shows the item."
    request = {"messages": [{"role": "system", "content": prompts.system("key_points")}]}
    assert identify_step(request) == "key_points"


def test_a_name_taken_or_a_set_missing_a_string_is_refused(terse):
    with pytest.raises(DuplicateName, match="prompt variant 'general' is registered already"):
        register_prompt_set("general", terse)
    register_prompt_set("half", PromptSource(lambda: {"key_points.system": "x"}, "Why:", "Mark"))
    try:
        with pytest.raises(PromptSetError, match="prompt set 'half' has no key_points.user, "):
            load_prompt_set("half")
    finally:
        PROMPT_SETS.remove("half")
