#!/usr/bin/env bash
# Build the venv in which keyshot's verl tests run verl 0.9.1's own released code (tests/reward/test_verl.py).
# usage: [TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu] [SETUP_LOG=runs/setup.log] tools/setup_verl.sh [VENV=.venv-verl]
# verl's wheel is installed without its dependencies: its extras pin CUDA torch, vLLM and flash-attn, and its
# core pins transformers<5.11 (the training stack in .venv has a newer one). What is installed instead is
# exactly what the reward path imports (config composition with Hydra, DataProto and tensordict, Ray's
# reward-loop workers, the tokenizer) on CPU torch, and keyshot itself (editable, its core dependencies).
# One line per stage with its time (tools/stage.sh); the installers' output goes to SETUP_LOG. Running it
# again on a built venv only re-checks the pins (pip finds every requirement satisfied).
set -euo pipefail
V=${1:-.venv-verl}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
stage() { "$HERE/stage.sh" "${SETUP_LOG:-runs/setup.log}" "$@"; }
# the CPU torch build, pinned in .ci/constraints-cpu.txt alone ("+cpu": a machine without it fails fast
# instead of downloading a CUDA one; TORCH_INDEX_URL)
TORCH=$(python3.11 "$HERE/pyproject_deps.py" --cpu-pins torch)
PIP=("$V/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"})
# What verl's reward loop, its trainer module (validation metrics) and its reward router import, pinned as
# verl 0.9.1's own requirements pin them (tensordict, transformers, ray); found by importing them.
VERL_DEPS=(
    "hydra-core>=1.3" "omegaconf>=2.3" "tensordict>=0.8.0,<=0.10.0,!=0.9.0" "transformers>=5.5.3,<5.11,!=5.6.0"
    "ray>=2.41.0" "aiohttp" "numpy>=2.0.0" "pandas" "pyarrow>=19.0.0" "codetiming" "dill" "packaging>=20.0"
    "torchdata" "datasets" "peft" "cachetools" "fastapi" "uvicorn"
)
# keyshot's core dependencies (pyproject.toml [project].dependencies) and pytest for the tests' helpers.
mapfile -t KEYSHOT_DEPS < <(python3.11 "$HERE/pyproject_deps.py")
if [ ! -x "$V/bin/python" ]; then
    stage "create $V" python3.11 -m venv "$V"
fi
stage "upgrade pip" "$V/bin/python" -m pip install -q -U pip
stage "install CPU torch ($TORCH)" "${PIP[@]}" "$TORCH"
stage "install verl 0.9.1 (the wheel, no dependencies)" "${PIP[@]}" --no-deps "verl==0.9.1"
stage "install the reward loop's dependencies" "${PIP[@]}" "$TORCH" "${VERL_DEPS[@]}"
stage "install keyshot (editable, core dependencies)" "${PIP[@]}" "$TORCH" "${KEYSHOT_DEPS[@]}"
stage "link keyshot into $V" "${PIP[@]}" --no-deps -e "$ROOT"
stage "check: import verl's reward loop and keyshot" "$V/bin/python" -c "
import torch, transformers, verl, keyshot.frameworks.verl.reward
from verl.experimental.reward_loop import RewardLoopManager
from verl.trainer.ppo.reward import get_custom_reward_fn
print('verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
