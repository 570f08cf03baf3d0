#!/bin/bash
# Judge trajectories as a SLURM job array, one shard per array task, then merge them in a dependent job:
#   JOB=$(sbatch --parsable --array=0-7 slurm/judge.sh data/om2w configs/judge/webjudge7b.yaml runs/om2w)
#   sbatch --dependency=afterok:$JOB slurm/merge.sh runs/om2w [--human-labels data/om2w/human_label.json]
# Task I runs `keyshot judge INPUT --config CONFIG --out OUT --shard slurm`: shard I of N, N the array's size
# (or SHARDS=N when re-submitting part of it). Re-submitting the same array redoes only what is missing: a finished
# shard finds its verdicts and exits at once; keyshot merge names the shards left to re-run, e.g.
#   sbatch --array=3,7 --export=ALL,SHARDS=8 slurm/judge.sh data/om2w configs/judge/webjudge7b.yaml runs/om2w
# The scorer: the config's endpoint(s) (a shared `keyshot serve`, or a pool in scorer.endpoints), or with
# SERVE_SCORER=CHECKPOINT each task serves its own on the node's GPU (started, waited on until healthy
# and stopped at exit by keyshot judge --serve-scorer): add --gpus=1 to the sbatch line then.
# Extra arguments go to keyshot judge (key=value overrides, --agent NAME, ...).
#SBATCH --job-name=keyshot-judge
#SBATCH --ntasks=1
#SBATCH --cpus-per-task=4
#SBATCH --time=12:00:00
#SBATCH --output=%x-%A_%a.out
set -euo pipefail
INPUT=${1:?usage: sbatch --array=0-(N-1) slurm/judge.sh INPUT CONFIG.yaml OUT [keyshot judge arguments ...]}
CONFIG=${2:?usage: sbatch --array=0-(N-1) slurm/judge.sh INPUT CONFIG.yaml OUT [...]}
OUT=${3:?usage: sbatch --array=0-(N-1) slurm/judge.sh INPUT CONFIG.yaml OUT [...]}
shift 3
SERVE=()
if [ -n "${SERVE_SCORER:-}" ]; then SERVE=(--serve-scorer "$SERVE_SCORER"); fi
exec keyshot judge "$INPUT" --config "$CONFIG" --out "$OUT" --shard slurm --no-progress "${SERVE[@]}" "$@"
