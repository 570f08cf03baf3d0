#!/usr/bin/env bash
# Build the venv in which keyshot's OpenEnv environment runs on OpenEnv's own server and is driven by its own
# client (keyshot reward env, tests/env/test_openenv_server.py, tests/reward/test_openenv_rubric.py, docs/reward.md's OpenEnv section).
# usage: [SETUP_LOG=runs/setup.log] tools/setup_openenv.sh [VENV=.venv-openenv]
# OpenEnv has a venv of its own: its release pulls gradio, which pins pillow below the version .venv's
# training stack runs. What is installed: OpenEnv (the `openenv` extra's pin in pyproject.toml), keyshot's
# core dependencies and its `browser` extra (the live MiniWoB pages; Chromium is Debian's, from make
# setup-browser), all resolved together, then keyshot itself (editable, so `keyshot reward env` and the
# entry points of this checkout are seen), and OpenEnv's BrowserGym package (browsergym_env: the models
# `keyshot reward env` serves, and the client TRL's example imports) without its dependencies (its
# browsergym-core and playwright pins are the browser extra's business). No torch: the reward calls its
# judge and scorer over HTTP.
# Then two small client venvs, each a site-packages of its own over a built venv's (a .pth line), holding
# only what that venv lacks (seconds, not a new stack):
#   $V-core: OpenEnv's older client generation, openenv-core (OPENENV_CORE, what the BrowserGym Space's
#            package pulls in), over $V: tests/env/test_openenv_server.py drives keyshot reward env with it;
#   $V-trl:  OpenEnv and browsergym_env over .venv's training stack (torch, transformers, TRL): TRL's own
#            BrowserGym example runs there unchanged (tests/env/test_trl_browsergym_example.py, bench/openenv_trl.py);
#            skipped until .venv is built (make setup).
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
OPENENV_CORE=${OPENENV_CORE:-openenv-core==0.3.0}
# OpenEnv's BrowserGym package is not on PyPI: a checkout of it (shared/data beside the repository holds
# one), else the Space's repository
BROWSERGYM_ENV=${BROWSERGYM_ENV:-$ROOT/../shared/data/openenv_browsergym_env}
[ -d "$BROWSERGYM_ENV" ] || BROWSERGYM_ENV="openenv-browsergym-env @ git+https://huggingface.co/spaces/openenv/browsergym_env"
# `overlay NEW BASE`: a venv over BASE's site-packages (a .pth line that adds it, its .pth files too)
overlay() {
    python3.11 -m venv "$1"
    "$2/bin/python" -c "import sysconfig; print('import site; site.addsitedir(%r)' % sysconfig.get_paths()['purelib'])" \
        >"$("$1/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")/_over_venv.pth"
}
if [ ! -x "$V/bin/python" ]; then
    stage "create $V" python3.11 -m venv "$V"
fi
stage "upgrade pip" "$V/bin/python" -m pip install -q -U pip
stage "install OpenEnv, keyshot's core deps, the browser extra" "${PIP[@]}" "${OPENENV[@]}" "${KEYSHOT_DEPS[@]}" "${BROWSER[@]}"
stage "link keyshot into $V" "${PIP[@]}" --no-deps -e "$ROOT"
stage "OpenEnv's BrowserGym models and client (browsergym_env, no deps)" "${PIP[@]}" --no-deps "$BROWSERGYM_ENV"
stage "check: OpenEnv's server, client and rubric with keyshot's" "$V/bin/python" -c "
import importlib.metadata as md
from openenv.core.env_server import create_app
from openenv.core.generic_client import GenericEnvClient
import keyshot.frameworks.openenv.server, keyshot.frameworks.openenv.rubric
print('openenv', md.version('openenv'), 'pillow', md.version('pillow'))"
[ -x "$V-core/bin/python" ] || overlay "$V-core" "$V"
stage "$OPENENV_CORE into $V-core (no deps: $V has them)" "$V-core/bin/python" -m pip install -q --no-deps "$OPENENV_CORE"
stage "check: openenv-core's BrowserGym client" "$V-core/bin/python" -c "
import importlib.metadata as md
from browsergym_env import BrowserGymEnv
print('openenv-core', md.version('openenv-core'))"
if [ -x .venv/bin/python ]; then
    [ -x "$V-trl/bin/python" ] || overlay "$V-trl" .venv
    mapfile -t OPENENV_NO_GRADIO < <("$V/bin/python" -c "
from importlib.metadata import requires
print(*(r for r in requires('openenv') if 'extra ==' not in r and not r.startswith('gradio')), sep='\n')")
    stage "OpenEnv's dependencies into $V-trl (what .venv lacks; no gradio)" "$V-trl/bin/python" -m pip install -q \
        "${OPENENV_NO_GRADIO[@]}"
    stage "OpenEnv and browsergym_env into $V-trl (no deps)" "$V-trl/bin/python" -m pip install -q --no-deps \
        "${OPENENV[@]}" "$BROWSERGYM_ENV"
    stage "check: TRL beside OpenEnv's BrowserGym client" "$V-trl/bin/python" -c "
from browsergym_env import BrowserGymEnv
import trl
print('trl', trl.__version__)"
else
    echo "setup-openenv: no .venv yet (make setup): $V-trl (TRL's BrowserGym example) not built" >&2
fi
