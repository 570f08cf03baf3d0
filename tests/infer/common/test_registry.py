"""keyshot.infer.common.registry: members by name, a duplicate refused, an unknown name refused with the
known ones listed."""

from __future__ import annotations

import pytest

from keyshot.infer.common.config import ConfigError
from keyshot.infer.common.registry import DuplicateName, Registry, UnknownName


def one() -> int:
    return 1


def test_members_are_found_by_name_in_the_order_they_registered():
    kinds = Registry("colour", "paint.colour")
    kinds.add("red", "#f00")

    @kinds.register("blue", "navy")
    def blue() -> str:
        return "#00f"

    assert kinds.names() == ("red", "blue", "navy") and len(kinds) == 3
    assert kinds.get("red") == "#f00" and kinds.get("navy") is blue and "blue" in kinds
    assert list(kinds.items())[0] == ("red", "#f00")


def test_a_name_registered_twice_is_refused_naming_both():
    kinds = Registry("colour")
    kinds.add("one", one)
    with pytest.raises(
        DuplicateName, match=r"colour 'one' is registered already \(by .*test_registry\.one\)"
    ):
        kinds.add("one", len)
    assert kinds.get("one") is one  # the first stays
    with pytest.raises(ValueError, match="non-empty string"):
        kinds.add("", one)


def test_an_unknown_name_is_a_config_error_listing_the_known_ones():
    kinds = Registry("colour", "paint.colour")
    for name in ("red", "blue"):
        kinds.add(name, name)
    with pytest.raises(UnknownName) as raised:
        kinds.get("green")
    assert str(raised.value) == "unknown colour 'green' (paint.colour); known: red, blue"
    assert isinstance(raised.value, ConfigError)  # one line on the command line, exit 2
    assert str(kinds.unknown("x", ("auto", *kinds.names()))) == (
        "unknown colour 'x' (paint.colour); known: auto, red, blue"
    )
    assert "none registered" in str(Registry("colour").unknown("x"))
    with pytest.raises(UnknownName):
        kinds.get(["not", "hashable"])


def test_a_member_removed_is_unknown_again():
    kinds = Registry("colour")
    kinds.add("red", 1)
    kinds.remove("red")
    assert "red" not in kinds
    kinds.add("red", 2)  # the name is free again
    with pytest.raises(UnknownName):
        kinds.remove("blue")
