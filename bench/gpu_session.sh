#!/usr/bin/env bash
# One packed run on a lent GPU machine (docs/contributing.md, "GPU"): the CUDA tests, then the kit with every
# row issue 57 asks for (bench/gpu.py's defaults: the shipped LoRA config; LoRA with lora.fused checkpointing
# every layer, then every second; lora.fused without checkpointing at the token caps 8,192 and 16,384 with
# 4,096-token rows, peak memory included; the full fine-tune with its optimizer amortised as the recipe's; the
# tower at batch 1 and 8 without host syncs and in CUDA graphs; the in-process scorer at batch 1 and 8).
#
#   KEYSHOT_COMMIT=<hash> bash bench/gpu_session.sh OUT_DIR [kit options...]   # the tests (150 s at most), the kit (400 s)
#   GPU_TESTS=0 bash bench/gpu_session.sh OUT_DIR [...]       # the kit alone (a rerun after a change to it)
#
# The machine has torch, transformers, peft and accelerate but not keyshot's other needs (openai,
# httpx2, datasets, ...) and no registry: carry them as wheels in .whl/ (bench/RESULTS-gpu.md says how).
# keyshot is not installed there: its floors are linked under keyshot/ so that `keyshot.infer`,
# `keyshot.train`, ... import from the checkout, as the editable install does here. Every step has its own
# time limit (together under the 600 s a call may run) and writes into OUT_DIR as it goes, so a run cut
# short keeps its figures.
set -uo pipefail
out=${1:?usage: bench/gpu_session.sh OUT_DIR [kit options...]}
shift
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
if ! python3 -c 'import keyshot.infer' 2>/dev/null; then
  for floor in infer reward env train data_synth; do
    [ -e "keyshot/$floor" ] || ln -s "../$floor" "keyshot/$floor"
  done
fi
{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c 'import torch, transformers, peft, accelerate; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "peft", peft.__version__, "accelerate", accelerate.__version__)'
  python3 -c 'import importlib.util as u; print("liger-kernel", "installed" if u.find_spec("liger_kernel") else "NOT installed (the liger rows and tests run without it)")'
  python3 -c 'import keyshot.infer.judge.local_scorer, keyshot.train.recipe; print("keyshot imports")'
  echo "commit ${KEYSHOT_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo 'unknown: set KEYSHOT_COMMIT')}"
} 2>&1 | tee "$out/env.txt"

if [ "${GPU_TESTS:-1}" = 1 ]; then
  started=$(date +%s)
  # every module with CUDA tests (the recipe and scorer on CUDA, the speed switches, the tower without host
  # syncs and in CUDA graphs, the fused adapters with every switch)
  mapfile -t gpu_modules < <(grep -rl "pytest.mark.gpu" tests --include="test_*.py")
  timeout "${GPU_TEST_TIMEOUT:-150}" python3 -m pytest -q -m gpu "${gpu_modules[@]}" -p no:cacheprovider 2>&1 \
    | tee "$out/tests.txt"
  echo "tests: rc ${PIPESTATUS[0]} in $(( $(date +%s) - started )) s" | tee -a "$out/tests.txt"
fi

started=$(date +%s)
timeout "${GPU_KIT_TIMEOUT:-400}" python3 -m bench.gpu --no-vllm --out "$out/kit.md" --json "$out/gpu.json" \
  --warmup 2 --steps 6 --repeats 2 "$@" >"$out/kit.log" 2>&1
echo "kit: rc $? in $(( $(date +%s) - started )) s" | tee -a "$out/kit.log"
tail -n 60 "$out/kit.log"
