#!/bin/bash
# Judge trajectories on a Ray cluster started over this job's allocation (keyshot judge --engine ray):
#   sbatch --nodes=4 slurm/judge_ray.sh data/om2w configs/judge/webjudge7b.yaml runs/om2w [keyshot judge args]
#   SERVE_SCORER=osunlp/WebJudge-7B sbatch --nodes=4 --gpus-per-node=1 slurm/judge_ray.sh ...   (a scorer per node)
# The first node runs the Ray head and keyshot judge (the driver, which writes OUT); every node runs a Ray
# node (`ray start --block` in a job step), with ports of this job's own (RAY_PORT, default from the job id,
# and the nine after it; workers in the 100 from RAY_WORKER_PORT) and Ray's token authentication (a new
# token per job, or RAY_AUTH_TOKEN). OUT and the inputs must be on a filesystem every node sees (the call
# cache, OUT/calls.sqlite, is shared by every actor). Re-submitting the same command after any stop judges
# only what is missing. The Ray nodes end with the job. Extra arguments go to keyshot judge (key=value
# overrides, --ray-per-actor K, ...).
# The scorer: the config's endpoint(s) (a `keyshot serve` every node can reach, or a pool in
# scorer.endpoints), or with SERVE_SCORER=CHECKPOINT a vLLM server on every node of the allocation
# (`keyshot serve` in a job step, one task per node: SERVE_CONFIG, default configs/serve/webjudge7b_gpu.yaml,
# on port SCORER_PORT, default RAY_PORT + 9; SERVE_ARGS: more key=value settings for it), the run's scorer
# the pool of them (--scorer-url each, the config's scorer endpoint settings kept): every actor calls the
# least-loaded live one, and one that dies is taken out. The servers end with the job.
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
# RAY_NODE_IP: every node's address where the allocation is one machine (a test cluster). Ray puts the
# machine's outward address in place of 127.0.0.1, so name another loopback address there (127.0.0.2).
HEAD_IP=${RAY_NODE_IP:-$(getent ahostsv4 "$HEAD" | awk 'NR == 1 {print $1}')}
NODE_IP=(${RAY_NODE_IP:+--node-ip-address="$RAY_NODE_IP"})
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
from keyshot.infer.engines.ray_cluster import node_ip_of
ray.init(address=sys.argv[1], _node_ip_address=node_ip_of(sys.argv[1]), logging_level="ERROR", log_to_driver=False)
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
    ray start --address="$HEAD_IP:$PORT" "${NODE_IP[@]}" "${NODE_ARGS[@]}" &
  STEPS+=($!)
  wait_nodes "${#NODES[@]}"
fi
SCORER=()
if [ -n "${SERVE_SCORER:-}" ]; then
  SCORER_PORT=${SCORER_PORT:-$((PORT + 9))}
  read -r -a SERVE_SETTINGS <<<"${SERVE_ARGS:-}"
  srun --nodes="${#NODES[@]}" --ntasks="${#NODES[@]}" --ntasks-per-node=1 --overlap \
    keyshot serve --config "${SERVE_CONFIG:-configs/serve/webjudge7b_gpu.yaml}" model="$SERVE_SCORER" \
    host=0.0.0.0 port="$SCORER_PORT" "${SERVE_SETTINGS[@]}" &
  SERVERS=$!
  STEPS+=("$SERVERS")
  for node in "${NODES[@]}"; do
    ip=${RAY_NODE_IP:-$(getent ahostsv4 "$node" | awk 'NR == 1 {print $1}')}
    SCORER+=(--scorer-url "http://$ip:$SCORER_PORT/v1")
  done
  # every server answers /v1/models before the judge starts (a hub id's first start downloads it)
  python - "$SERVERS" "${SCORER[@]}" <<'PY'
import os, sys, time, urllib.request
step, urls = int(sys.argv[1]), sys.argv[3::2]
deadline = time.monotonic() + float(os.environ.get("SCORER_START_S", "1800"))
for url in urls:
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=5).read()
            print(f"judge_ray.sh: scorer up at {url}", flush=True)
            break
        except OSError:
            pass
        try:
            ended = open(f"/proc/{step}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            ended = True
        if ended:
            sys.exit(f"judge_ray.sh: the scorer servers' job step ended before {url} answered (their log above)")
        if time.monotonic() > deadline:
            sys.exit(f"judge_ray.sh: {url} did not answer within SCORER_START_S")
        time.sleep(2)
PY
fi
keyshot judge "$INPUT" --config "$CONFIG" --out "$OUT" --no-progress --engine ray \
  --ray-address "$HEAD_IP:$PORT" "${SCORER[@]}" "$@"
