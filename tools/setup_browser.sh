#!/usr/bin/env bash
# Live episodes (keyshot.env.miniwob): Debian's Chromium, and the `browser` extra (playwright,
# BrowserGym's MiniWoB, the miniwob package's pages, pinned in pyproject.toml) and AgentLab in an existing
# keyshot venv.
# No browser is downloaded: playwright is pointed at the system Chromium. Safe to run again.
# usage: [SETUP_LOG=runs/setup.log] tools/setup_browser.sh [VENV=.venv]
# One line per stage with its time (tools/stage.sh); the installers' output goes to SETUP_LOG.
set -euo pipefail
V=${1:-.venv}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
stage() { "$HERE/stage.sh" "${SETUP_LOG:-runs/setup.log}" "$@"; }
if [ ! -x "$V/bin/python" ]; then
    echo "setup-browser: no venv at $V: run make setup first" >&2
    exit 2
fi

# stage.sh runs its command in a process of its own: the install is a command line, not a shell function
INSTALL_CHROMIUM='DEBIAN_FRONTEND=noninteractive apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium'
if command -v chromium >/dev/null 2>&1 || [ -n "${KEYSHOT_CHROMIUM:-}" ]; then
    printf '%-58s %s\n' "chromium (Debian package)" "found: ${KEYSHOT_CHROMIUM:-$(command -v chromium)}"
elif [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
    stage "chromium (Debian package): apt-get install chromium" bash -c "$INSTALL_CHROMIUM"
else
    echo "setup-browser: Chromium is missing: install Debian's package (sudo apt-get install chromium), or set KEYSHOT_CHROMIUM to a Chromium executable" >&2
    exit 1
fi
# the extra's pins, read from pyproject.toml (keyshot's own install is left as it is)
mapfile -t PINS < <("$V/bin/python" "$HERE/pyproject_deps.py" browser)
stage "browser extra (pins of pyproject.toml)" "$V/bin/pip" install -q -c "$ROOT/.ci/constraints-cpu.txt" "${PINS[@]}"
# AgentLab's experiment loop and result loading (its studies in tests/infer/loaders/test_agentlab_study.py): its release
# requires ray, torch, gradio and litellm, which neither its loop nor its result loading imports; what they
# do import comes with the extra above (and pandas with keyshot's own datasets)
stage "AgentLab 0.4.2 (without its dependencies)" "$V/bin/pip" install -q --no-deps agentlab==0.4.2
stage "check: a scripted MiniWoB episode in Chromium" "$V/bin/python" -m keyshot.env.miniwob click-button
