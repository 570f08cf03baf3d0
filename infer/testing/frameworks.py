"""The venvs of the frameworks that tests and benches run keyshot in, each built by its own ``make
setup-NAME`` beside this environment (vLLM: ``vllm``, OpenRLHF: ``openrlhf``, verl: ``verl``, OpenEnv:
``openenv``, whose client venvs ``.venv-openenv-core`` and ``.venv-openenv-trl`` tools/setup_openenv.sh
builds beside it): where a venv's python is, and the line that says how to build it when it is not there."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def python_env(framework: str) -> str:
    """The variable that names a framework venv's python: ``KEYSHOT_<FRAMEWORK>_PYTHON``."""
    return f"KEYSHOT_{framework.upper()}_PYTHON"


def framework_python(framework: str, flavour: str = "") -> Path:
    """``$KEYSHOT_<FRAMEWORK>_PYTHON``, else the python of ``.venv-<framework>`` beside this environment;
    with ``flavour``, the python of the venv ``<that venv>-<flavour>`` beside that one. The path may not
    exist: :func:`missing` says so, and how to build it."""
    configured = os.environ.get(python_env(framework))
    beside = Path(sys.prefix).parent / f".venv-{framework}" / "bin" / "python"
    python = Path(configured) if configured else beside
    if flavour:
        venv = python.parent.parent
        python = venv.with_name(f"{venv.name}-{flavour}") / "bin" / "python"
    return python


def missing(framework: str, flavour: str = "") -> str | None:
    """None when :func:`framework_python` exists; else one line naming the venv and how to build it."""
    python = framework_python(framework, flavour)
    if python.exists():
        return None
    how = f"`make setup-{framework}`" + ("" if flavour else f" or set ${python_env(framework)}")
    return f"no {python.parent.parent.name} ({python}): build it with {how}"
