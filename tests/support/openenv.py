"""The OpenEnv venv (tools/setup_openenv.sh) and the drivers the OpenEnv tests run in it: openenv is not
installed in .venv (its gradio pins an older pillow), so OpenEnv's own code runs there, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON_ENV = "KEYSHOT_OPENENV_PYTHON"
FRAMEWORK = REPO / "tests" / "framework"


def openenv_python() -> str:
    """``$KEYSHOT_OPENENV_PYTHON``, else .venv-openenv's python; skips, naming the set-up, when neither is."""
    path = os.environ.get(PYTHON_ENV) or str(REPO / ".venv-openenv" / "bin" / "python")
    if not Path(path).exists():
        pytest.skip(
            f"no OpenEnv venv: build it with `make setup-openenv` (tools/setup_openenv.sh) or set {PYTHON_ENV}"
        )
    return path


def run_driver(name: str, plan: dict, timeout_s: float = 300) -> object:
    """Run tests/framework/NAME with ``plan`` in the OpenEnv venv; its last output line, read as JSON."""
    done = subprocess.run(
        [openenv_python(), str(FRAMEWORK / name), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
