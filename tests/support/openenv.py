"""The OpenEnv venv (tools/setup_openenv.sh) and the drivers the OpenEnv tests run in it: openenv is not
installed in .venv (its gradio pins an older pillow), so OpenEnv's own code runs there, in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from keyshot.env.openenv import launch
from tests.support import paths

REPO = paths.REPO
PYTHON_ENV = "KEYSHOT_OPENENV_PYTHON"
FRAMEWORK = REPO / "tests" / "framework"


def client_python(kind: str) -> str:
    """The python of a client venv built beside the OpenEnv venv by tools/setup_openenv.sh: ``core``
    (openenv-core's client generation) or ``trl`` (OpenEnv's client over .venv's training stack); skips,
    naming the set-up, when it is not built."""
    path = Path(openenv_python()).parent.parent
    python = path.with_name(f"{path.name}-{kind}") / "bin" / "python"
    if not python.exists():
        pytest.skip(
            f"no {python.parent.parent.name}: build it with `make setup-openenv` (tools/setup_openenv.sh)"
        )
    return str(python)


def start_env(config: Path, *extra: str, stderr, python: str | None = None) -> subprocess.Popen:
    """``keyshot reward env --config CONFIG --port 0 EXTRA...`` in the OpenEnv venv
    (:func:`keyshot.env.openenv.launch.start_env`)."""
    return launch.start_env(python or openenv_python(), config, *extra, stderr=stderr)


def first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The process's first output line (a driver's JSON answer), or a failure when it ends or says nothing
    in ``timeout_s`` (:func:`keyshot.env.openenv.launch.first_line`)."""
    return launch.first_line(proc, timeout_s, what="the process")


def served_url(proc: subprocess.Popen, timeout_s: float = 180) -> str:
    """The URL ``keyshot reward env`` names in its start-up line
    (:func:`keyshot.env.openenv.launch.served_url`)."""
    return launch.served_url(proc, timeout_s)


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
