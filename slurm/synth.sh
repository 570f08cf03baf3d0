#!/bin/bash
# Distil the scorer dataset from the teachers (API calls only, no GPU; resumable: resubmit to continue).
# One job:
#   sbatch slurm/synth.sh configs/synth/paper.yaml
# Or a job array, one shard of the trajectories per task (each with 1/N of every budget), then the merge
# that joins the shards and builds the dataset:
#   JOB=$(sbatch --parsable --array=0-7 slurm/synth.sh configs/synth/paper.yaml)
#   sbatch --dependency=afterok:$JOB slurm/synth_merge.sh configs/synth/paper.yaml
# Re-submitting only redoes what is missing; keyshot synth merge names the shards left to re-run, e.g.
#   sbatch --array=3,7 --export=ALL,SHARDS=8 slurm/synth.sh configs/synth/paper.yaml
# Extra arguments go to keyshot synth run (key=value overrides, --retry-failed, ...).
#SBATCH --job-name=keyshot-synth
#SBATCH --nodes=1
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --output=%x-%A_%a.out
set -euo pipefail
CONFIG=${1:?usage: sbatch [--array=0-(N-1)] slurm/synth.sh configs/synth/X.yaml [keyshot synth run arguments ...]}
shift
SHARD=()
if [ -n "${SLURM_ARRAY_TASK_ID:-}" ]; then SHARD=(--shard slurm); fi
exec keyshot synth run --config "$CONFIG" "${SHARD[@]}" "$@"
