"""The layers of docs/architecture.md hold: the protocol is a leaf, infer/ uses neither data_synth/ nor
train/, and bench/ does not reach into tests/ (what it shares with them lives in infer/testing/)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The protocol: prompt sets, messages, parsers, the image policy and the scorer's chat rendering (they may
#: import the error base, infer/errors.py, itself a leaf).
PROTOCOL = ("prompts", "messages", "parsing", "images", "rendering")


def imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at the top or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def sources(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


@pytest.mark.parametrize("module", PROTOCOL)
def test_the_protocol_is_a_leaf(module):
    keyshot = {
        m
        for m in imported(REPO / "infer" / f"{module}.py")
        if m.split(".")[0] in ("infer", "data_synth", "train")
    }
    outside = {m for m in keyshot if m.removeprefix("infer.") not in (*PROTOCOL, "errors")}
    assert not outside, f"infer/{module}.py imports {sorted(outside)}: the protocol imports only itself"


def test_the_error_base_is_a_leaf():
    assert not {
        m
        for m in imported(REPO / "infer" / "errors.py")
        if m.split(".")[0] in ("infer", "data_synth", "train")
    }


def test_infer_uses_neither_synthesis_nor_training():
    found = {
        str(path.relative_to(REPO)): sorted(
            m for m in imported(path) if m.split(".")[0] in ("data_synth", "train", "tests", "bench")
        )
        for path in sources("infer")
    }
    assert not {k: v for k, v in found.items() if v}


def test_bench_does_not_import_tests():
    found = {
        str(path.relative_to(REPO)): sorted(m for m in imported(path) if m.split(".")[0] == "tests")
        for path in sources("bench")
    }
    assert not {k: v for k, v in found.items() if v}


def test_the_scan_sees_imports_inside_functions(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from train.recipe import run\n    import data_synth.cli\n")
    assert imported(probe) == {"train.recipe", "data_synth.cli"}
