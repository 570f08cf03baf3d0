#!/bin/bash
# Join the shards of a synthesis array and build the dataset (RUN is the config's run_dir):
#   sbatch --dependency=afterok:$JOB slurm/synth_merge.sh configs/synth/paper.yaml [key=value ...]
# If a shard failed, afterok is never satisfied and this job is cancelled (--kill-on-invalid-dep).
#SBATCH --job-name=keyshot-synth-merge
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --time=04:00:00
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --output=%x-%j.out
set -euo pipefail
CONFIG=${1:?usage: sbatch --dependency=afterok:JOB slurm/synth_merge.sh configs/synth/X.yaml [key=value ...]}
shift
exec keyshot synth merge --config "$CONFIG" "$@"
