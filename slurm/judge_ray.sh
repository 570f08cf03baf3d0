#!/bin/bash
# Judge trajectories on a Ray cluster started over this job's allocation (keyshot judge --engine ray):
#   sbatch --nodes=4 slurm/judge_ray.sh data/om2w configs/judge/webjudge7b.yaml runs/om2w [keyshot judge args]
# The first node runs the Ray head and keyshot judge (the driver, which writes OUT); every node runs a Ray
# node (`ray start --block` in a job step), with ports of this job's own (RAY_PORT, default from the job id,
# and the nine after it; workers in the 100 from RAY_WORKER_PORT) and Ray's token authentication (a new
# token per job, or RAY_AUTH_TOKEN). OUT and the inputs must be on a filesystem every node sees (the call
# cache, OUT/calls.sqlite, is shared by every actor). Re-submitting the same command after any stop judges
# only what is missing. The Ray nodes end with the job. Extra arguments go to keyshot judge (key=value
# overrides, --ray-per-actor K, ...).
# The scorer: the config's endpoint(s) (a `keyshot serve` every node can reach, or a pool in
# scorer.endpoints), or with SERVE_SCORER=CHECKPOINT keyshot judge serves it on the first node's GPU
# (--serve-scorer; reachable from that node's actors only: for more nodes, serve it with slurm/serve.sh
# and list the servers in scorer.endpoints).
#SBATCH --job-name=keyshot-judge-ray
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=4
#SBATCH --time=12:00:00
#SBATCH --output=%x-%j.out
set -euo pipefail
INPUT=${1:?usage: sbatch --nodes=N slurm/judge_ray.sh INPUT CONFIG.yaml OUT [keyshot judge arguments ...]}
CONFIG=${2:?usage: sbatch --nodes=N slurm/judge_ray.sh INPUT CONFIG.yaml OUT [...]}
OUT=${3:?usage: sbatch --nodes=N slurm/judge_ray.sh INPUT CONFIG.yaml OUT [...]}
shift 3
mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
HEAD=${NODES[0]}
HEAD_IP=$(getent ahostsv4 "$HEAD" | awk 'NR == 1 {print $1}')
PORT=${RAY_PORT:-$((20000 + (SLURM_JOB_ID % 2000) * 10))}
WORKER_PORT=${RAY_WORKER_PORT:-$((40000 + (SLURM_JOB_ID % 200) * 100))}
CPUS=${SLURM_CPUS_PER_TASK:-1}
RAY_TMP=${RAY_TMP:-/tmp/ksray-$SLURM_JOB_ID}
export RAY_AUTH_MODE=token RAY_USAGE_STATS_ENABLED=0
export RAY_AUTH_TOKEN=${RAY_AUTH_TOKEN:-$(python -c 'import secrets; print(secrets.token_hex(32))')}
NODE_ARGS=(--block --num-cpus="$CPUS" --temp-dir="$RAY_TMP" --disable-usage-stats
  --node-manager-port=$((PORT + 1)) --object-manager-port=$((PORT + 2))
  --dashboard-agent-listen-port=$((PORT + 3)) --dashboard-agent-grpc-port=$((PORT + 4))
  --runtime-env-agent-port=$((PORT + 5)) --metrics-export-port=$((PORT + 6))
  --min-worker-port="$WORKER_PORT" --max-worker-port=$((WORKER_PORT + 99)))
STEPS=()
stop_ray() {
  for pid in "${STEPS[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait "${STEPS[@]}" 2>/dev/null || true
  rm -rf "$RAY_TMP"  # the first node's; the others' go with the nodes' /tmp
}
trap stop_ray EXIT
srun --nodes=1 --ntasks=1 -w "$HEAD" --overlap ray start --head --node-ip-address="$HEAD_IP" --port="$PORT" \
  --ray-client-server-port=$((PORT + 7)) --dashboard-port=$((PORT + 8)) --include-dashboard=false \
  "${NODE_ARGS[@]}" &
STEPS+=($!)
ray_nodes() {
  python - "$HEAD_IP:$PORT" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(sum(1 for n in ray.nodes() if n["Alive"]))
PY
}
wait_nodes() {
  for _ in $(seq 120); do
    [ "$(ray_nodes | tail -1)" -ge "$1" ] && return 0
    sleep 2
  done
  echo "judge_ray.sh: $1 Ray node(s) not up within 240 s" >&2
  return 1
}
wait_nodes 1
if [ "${#NODES[@]}" -gt 1 ]; then
  srun --nodes=$((${#NODES[@]} - 1)) --ntasks=$((${#NODES[@]} - 1)) --exclude="$HEAD" --overlap \
    ray start --address="$HEAD_IP:$PORT" "${NODE_ARGS[@]}" &
  STEPS+=($!)
  wait_nodes "${#NODES[@]}"
fi
SERVE=()
if [ -n "${SERVE_SCORER:-}" ]; then SERVE=(--serve-scorer "$SERVE_SCORER"); fi
keyshot judge "$INPUT" --config "$CONFIG" --out "$OUT" --no-progress --engine ray \
  --ray-address "$HEAD_IP:$PORT" "${SERVE[@]}" "$@"
