#!/bin/bash
# Multi-node scorer training: one srun task per node, each runs `accelerate launch` for that node's GPUs.
#   sbatch --nodes 2 slurm/train.sh configs/train/webjudge7b_full.yaml world_size=8 [key=value ...]
# On one CPU node (how tests/e2e/test_slurm_cluster.py runs it on a real one-node cluster):
#   sbatch --nodes 1 --gpus-per-node=0 --cpus-per-task=2 --export=ALL,ACCELERATE_CONFIG=configs/accelerate/cpu1.yaml,GPUS_PER_NODE=1 \
#     slurm/train.sh configs/train/tiny_cpu.yaml model.name_or_path=runs/tiny-model data.path=runs/tiny-dataset
# The node rank is escaped (\$SLURM_NODEID inside the double-quoted bash -c) so that each node's shell
# expands its own; unescaped, the submitting shell would expand it once and every node would be rank 0.
# Preemption-safe: SLURM sends USR1 to every process of the step 5 minutes before the time limit or a
# preemption; the launcher ignores it (trap '' USR1), the training processes save a checkpoint at the
# next step and exit 75 with a marker file; this script then requeues the job, which resumes.
#SBATCH --job-name=keyshot-train
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=4
#SBATCH --cpus-per-task=32
#SBATCH --time=48:00:00
#SBATCH --signal=USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -eu  # no pipefail: `head -n1` closing the pipe early must not fail the job (SIGPIPE, status 141)
CONFIG=${1:?usage: sbatch slurm/train.sh CONFIG.yaml [key=value ...]}
shift
GPUS_PER_NODE=${GPUS_PER_NODE:-4}
# the accelerate config of the launch (a CPU-only test cluster: configs/accelerate/cpu1.yaml, GPUS_PER_NODE=1)
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate/multinode_zero3.yaml}
MAIN_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
# rank 0 writes this file when it stopped for a signal (train/preemption.py); on a shared file system
export KEYSHOT_PREEMPTED_FILE=${KEYSHOT_PREEMPTED_FILE:-$PWD/.keyshot-preempted-${SLURM_JOB_ID:-local}}
rm -f "$KEYSHOT_PREEMPTED_FILE"
# the config, the dataset and the model path, checked once before any launcher starts (one line if wrong)
# (PYTHON: the interpreter of the environment accelerate belongs to, if `python` is another one)
${PYTHON:-python} -m keyshot.train.sft --config "$CONFIG" "$@" --check || exit 2
set +e
srun --ntasks-per-node=1 bash -c "trap '' USR1; exec accelerate launch --config_file $ACCELERATE_CONFIG --num_machines $SLURM_NNODES --num_processes $((SLURM_NNODES * GPUS_PER_NODE)) --machine_rank \$SLURM_NODEID --main_process_ip $MAIN_HOST --main_process_port ${MAIN_PORT:-29500} -m keyshot.train.sft --config $CONFIG $*"
status=$?
set -e
if [ -f "$KEYSHOT_PREEMPTED_FILE" ]; then
  echo "preempted ($(cat "$KEYSHOT_PREEMPTED_FILE")): requeueing job ${SLURM_JOB_ID:-?}; it resumes from the checkpoint"
  rm -f "$KEYSHOT_PREEMPTED_FILE"
  scontrol requeue "${SLURM_JOB_ID:?}"
  exit 0
fi
exit $status
