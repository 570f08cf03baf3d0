"""A framework venv's python, found by one rule for tests and benches (keyshot.infer.testing.frameworks):
``$KEYSHOT_<NAME>_PYTHON``, else ``.venv-<name>`` beside this environment, the OpenEnv client venvs beside
the OpenEnv venv; the same interpreter keyshot's own vLLM rule finds; and the line that says how to build
one that is missing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from keyshot.infer.serve import plan
from keyshot.infer.testing.frameworks import framework_python, missing, python_env


def venv_python(venv: Path) -> Path:
    python = venv / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.touch()
    return python


def test_the_variable_names_the_venv_and_its_client_venvs_are_beside_it(tmp_path, monkeypatch):
    server = venv_python(tmp_path / "elsewhere" / ".venv-openenv")
    monkeypatch.setenv("KEYSHOT_OPENENV_PYTHON", str(server))
    assert framework_python("openenv") == server and missing("openenv") is None
    trl = tmp_path / "elsewhere" / ".venv-openenv-trl" / "bin" / "python"
    assert framework_python("openenv", "trl") == trl
    assert missing("openenv", "trl") == f"no .venv-openenv-trl ({trl}): build it with `make setup-openenv`"
    venv_python(trl.parent.parent)
    assert missing("openenv", "trl") is None


def test_without_the_variable_the_venv_beside_this_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("KEYSHOT_VERL_PYTHON", raising=False)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    expected = tmp_path / ".venv-verl" / "bin" / "python"
    assert framework_python("verl") == expected
    assert missing("verl") == (
        f"no .venv-verl ({expected}): build it with `make setup-verl` or set $KEYSHOT_VERL_PYTHON"
    )


def test_vllm_is_found_where_keyshots_own_rule_finds_it(tmp_path, monkeypatch):
    assert python_env("vllm") == plan.ENV_VLLM_PYTHON
    monkeypatch.setenv(plan.ENV_VLLM_PYTHON, "/opt/vllm/bin/python")
    assert str(framework_python("vllm")) == plan.vllm_python() == "/opt/vllm/bin/python"
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("this environment has vLLM: keyshot's rule takes it first")
    monkeypatch.delenv(plan.ENV_VLLM_PYTHON)
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    beside = venv_python(tmp_path / ".venv-vllm")
    assert framework_python("vllm") == beside and plan.vllm_python() == str(beside)
