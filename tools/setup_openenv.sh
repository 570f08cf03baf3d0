#!/usr/bin/env bash
# Build the venv in which keyshot's OpenEnv environment runs on OpenEnv's own server and is driven by its own
# client (keyshot reward env, tests/test_openenv*.py, docs/reward.md's OpenEnv section).
# usage: [SETUP_LOG=runs/setup.log] tools/setup_openenv.sh [VENV=.venv-openenv]
# OpenEnv has a venv of its own: its release pulls gradio, which pins pillow below the version .venv's
# training stack runs. What is installed: OpenEnv (the `openenv` extra's pin in pyproject.toml), keyshot's
# core dependencies and its `browser` extra (the live MiniWoB pages; Chromium is Debian's, from make
# setup-browser), all resolved together, then keyshot itself (editable, so `keyshot reward env` and the
# entry points of this checkout are seen). No torch: the reward calls its judge and scorer over HTTP.
# One line per stage with its time (tools/stage.sh); the installers' output goes to SETUP_LOG. Running it
# again on a built venv only re-checks the pins (pip finds every requirement satisfied).
set -euo pipefail
V=${1:-.venv-openenv}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
stage() { "$HERE/stage.sh" "${SETUP_LOG:-runs/setup.log}" "$@"; }
PIP=("$V/bin/python" -m pip install -q)
mapfile -t OPENENV < <(python3.11 "$HERE/pyproject_deps.py" openenv)
mapfile -t KEYSHOT_DEPS < <(python3.11 "$HERE/pyproject_deps.py")
mapfile -t BROWSER < <(python3.11 "$HERE/pyproject_deps.py" browser)
if [ ! -x "$V/bin/python" ]; then
    stage "create $V" python3.11 -m venv "$V"
fi
stage "upgrade pip" "$V/bin/python" -m pip install -q -U pip
stage "install OpenEnv, keyshot's core deps, the browser extra" "${PIP[@]}" "${OPENENV[@]}" "${KEYSHOT_DEPS[@]}" "${BROWSER[@]}"
stage "link keyshot into $V" "${PIP[@]}" --no-deps -e "$ROOT"
stage "check: OpenEnv's server, client and rubric with keyshot's" "$V/bin/python" -c "
import importlib.metadata as md
from openenv.core.env_server import create_app
from openenv.core.generic_client import GenericEnvClient
import keyshot.env.openenv.server, keyshot.reward.openenv
print('openenv', md.version('openenv'), 'pillow', md.version('pillow'))"
