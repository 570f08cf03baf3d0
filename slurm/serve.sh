#!/bin/bash
# Serve a model with vLLM on one node's GPUs (OpenAI API; the endpoint is printed in the log):
#   sbatch slurm/serve.sh runs/webjudge7b-full/final                      # the scorer on 1 GPU
#   sbatch --gpus=4 slurm/serve.sh runs/webjudge7b-full/final             # 4 copies behind one endpoint (data parallel)
#   PARALLEL=tensor sbatch --gpus=4 slurm/serve.sh Qwen/Qwen2.5-VL-72B-Instruct configs/serve/teacher72b_tp4.yaml
# The GPU count comes from the allocation; PARALLEL=data (default: one model copy per GPU) or tensor (one
# copy split over all of them). Extra key=value arguments override the config. Check the command first:
#   keyshot serve --config configs/serve/webjudge7b_gpu.yaml model=CKPT data_parallel_size=4 --dry-run
#SBATCH --job-name=keyshot-serve
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --gpus=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail
MODEL=${1:?usage: sbatch [--gpus=N] slurm/serve.sh CHECKPOINT [CONFIG.yaml] [key=value ...]}
shift
CONFIG=configs/serve/webjudge7b_gpu.yaml
if [[ ${1:-} == *.yaml ]]; then CONFIG=$1; shift; fi
GPUS=${GPUS:-${SLURM_GPUS_ON_NODE:-1}}
case ${PARALLEL:-data} in
  data) SPLIT=data_parallel_size=$GPUS ;;
  tensor) SPLIT=tensor_parallel_size=$GPUS ;;
  *) echo "PARALLEL must be data or tensor, got '${PARALLEL}'" >&2; exit 2 ;;
esac
PORT=${PORT:-8000}
echo "endpoint for other nodes: http://$(hostname -f):$PORT/v1 ($GPUS GPUs, $SPLIT)"
exec keyshot serve --config "$CONFIG" model="$MODEL" host=0.0.0.0 port="$PORT" "$SPLIT" "$@"
