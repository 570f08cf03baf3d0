#!/bin/bash
# Merge the shards of a judge array into OUT/verdicts.jsonl + summary (+ metrics), after the array:
#   sbatch --dependency=afterok:$JOB slurm/merge.sh runs/om2w [--human-labels data/om2w/human_label.json]
# If a shard failed, afterok is never satisfied and this job is cancelled (--kill-on-invalid-dep);
# re-submit the failed shards (keyshot merge OUT names them), then this script.
#SBATCH --job-name=keyshot-merge
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=1
#SBATCH --time=01:00:00
#SBATCH --kill-on-invalid-dep=yes
#SBATCH --output=%x-%j.out
set -euo pipefail
exec keyshot merge "${1:?usage: sbatch --dependency=afterok:JOB slurm/merge.sh OUT [--human-labels F]}" "${@:2}"
