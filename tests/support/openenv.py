"""The drivers the OpenEnv tests run in the OpenEnv venv (tools/setup_openenv.sh): openenv is not
installed in .venv (its gradio pins an older pillow), so OpenEnv's own code runs there, in a subprocess."""

from __future__ import annotations

import json
import subprocess

from tests.support import paths
from tests.support.frameworks import python_or_skip


def run_driver(name: str, plan: dict, timeout_s: float = 300) -> object:
    """Run tests/framework/NAME with ``plan`` in the OpenEnv venv; its last output line, read as JSON."""
    done = subprocess.run(
        [python_or_skip("openenv"), str(paths.FRAMEWORK / name), json.dumps(plan)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=paths.REPO,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
