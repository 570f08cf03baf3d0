"""keyshot as an RL reward (issues 24 and 29): judge calls per rollout, throughput against one-at-a-time
judging, the service's own overhead, faults, and the memory of open episodes.

Against a fake judge answering in ``--judge-latency`` s and a fake scorer (its own process) answering in
``--scorer-latency`` s with at most ``--scorer-slots`` requests in flight (the scorer endpoint's
``max_concurrency``, as a GPU server's batch would be):

* rollouts (issue 24): TASKS x GROUP rollouts of SCREENSHOTS each, as GRPO makes them. ``keyshot reward
  serve`` (a real process) is sent one request per group, all at once; the baseline judges one rollout at
  a time with a fresh reward model (what a naive reward function does), measured on ``--naive`` rollouts
  and scaled to the whole batch. Judge calls per rollout (key points once per task), p50/p99 latency per
  request, and the service's overhead per request against the Python API in process (same batch, every
  call cached, so only the service's own work is left).
* faults: the same rollouts with half the judge's calls failing (500, timeouts, malformed bodies): each
  reward must equal the clean run's or be None with its reason; an all-failing judge must make /health
  say so and requests fail within a second.
* episodes (issue 29): E_TASKS x E_GROUP Episodes through the TRL environment reward and through
  OpenRLHF 0.11.2's own multi-turn executor in its venv (``make setup-openrlhf``; each final step awaiting
  the process-wide batcher; the row says "not run" without the venv), against awaiting each
  environment's reward in turn (what TRL does with ``get_reward``), measured on ``--naive`` episodes.
* memory: ``--memory-episodes`` open episodes of ``--memory-steps`` 1280x720 screenshots, peak RSS above
  the process's baseline (a subprocess of its own).
* verl: the same number of episodes, each kept as its own trajectory file, through verl 0.9.1's own reward
  loop in its venv (``make setup-verl``; tests/framework/verl_reward_loop.py: RewardLoopManager's Ray
  worker calls compute_score once per sample, concurrently, then ``assemble_rm_scores``), timed in
  ``compute_rm_score`` (the worker started, as in a trainer's step), against the same one-at-a-time
  baseline; the row says "not run" without the venv or with ``--quick``.

    .venv/bin/python -m bench.reward [--quick] [--json runs/bench/reward.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bench import record
from bench.record import REPO, Headline, Plot, Rows, ratio_table
from keyshot.frameworks.trl.reward import environment_reward
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge, spawn_fake_openai
from keyshot.infer.testing.frameworks import framework_python, missing
from keyshot.infer.testing.launch import OutputLines, start_reward_serve
from keyshot.infer.testing.worlds import synthetic_trajectories
from keyshot.reward import Episode, RewardModel
from keyshot.reward.service import RewardService, ServiceLimits

HALF_FAULTS = {"500": 0.25, "timeout": 0.1, "malformed": 0.15}


def write_config(path: Path, judge_url: str, scorer_url: str, slots: int, **judge: object) -> Path:
    return fake_judge_config(
        path,
        judge_url,
        {
            "endpoint": {
                "base_url": scorer_url,
                "model": "webjudge-7b",
                "api_key_env": None,
                "max_concurrency": slots,
            }
        },
        concurrency=1024,
        judge={"max_concurrency": 256, "backoff_base_s": 0.01, "max_retries": 3, "timeout_s": 30, **judge},
    )


def rollouts(root: Path, tasks: int, group: int, screenshots: int) -> list[dict]:
    """TASKS x GROUP rollouts (distinct screenshots), grouped by task as GRPO makes them."""
    jsonl = synthetic_trajectories(root, tasks * group, screenshots, size=(320, 200))
    return [
        {
            "id": f"t{i // group}-r{i % group}",
            "task": f"Find the page number {i // group} and open its settings",
            "screenshots": [str(s.path) for s in t.screenshots],
        }
        for i, t in enumerate(load_trajectories(jsonl))
    ]


def paid(results, role: str = "judge") -> int:
    return sum(r.paid_calls.get(role, 0) for r in results)


def post(url: str, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        payload = json.loads(response.read())
    return time.perf_counter() - t0, payload


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ---------------------------------------------------------------------------- issue 24
def bench_rollouts(args, work: Path, judge: FakeOpenAI, scorer_url: str) -> dict:
    batch = rollouts(work / "world", args.tasks, args.group, args.screenshots)
    groups = [batch[g * args.group : (g + 1) * args.group] for g in range(args.tasks)]
    config = write_config(work / "reward.yaml", judge.base_url, scorer_url, args.scorer_slots)
    config.write_text(config.read_text() + "reward:\n  on_failure: zero\n")  # the service needs a number

    service = start_reward_serve(config, work)
    base = service.url
    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(len(groups)) as pool:
            answers = list(pool.map(lambda g: post(f"{base}/v1/reward", {"rollouts": g}), groups))
        service_s = time.perf_counter() - t0
        served = [r for _, payload in answers for r in payload["results"]]
        latencies = [s for s, _ in answers]
        cached_service = [post(f"{base}/v1/reward", {"rollouts": groups[0]})[0] for _ in range(args.repeats)]
    finally:
        service.stop()

    rm = RewardModel.from_config(config, allow_root=str(work))

    async def in_process() -> tuple[list, list[float]]:
        """The batch (filling the cache), then the cached group again: one event loop, as a service has."""
        results = await rm.score(batch)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            await rm.score(groups[0])
            times.append(time.perf_counter() - t0)
        await rm.aclose()
        return results, times

    api_results, cached_api = asyncio.run(in_process())
    rm.close()

    naive_times = []
    for rollout in batch[:: max(1, len(batch) // args.naive)][: args.naive]:  # a fresh model each: no sharing
        one = RewardModel.from_config(config, allow_root=str(work))
        t0 = time.perf_counter()
        one.score_sync([rollout])
        naive_times.append(time.perf_counter() - t0)
        one.close()
    naive_s = statistics.mean(naive_times) * len(batch)
    judge_paid = sum(r["paid_calls"].get("judge", 0) for r in served)
    return {
        "rollouts": len(batch),
        "screenshots": args.screenshots,
        "failed": sum(r["error"] is not None for r in served),
        "judge_calls_per_rollout": judge_paid / len(batch),
        "judge_calls_per_rollout_api": paid(api_results) / len(batch),
        "service_s": service_s,
        "naive_s_scaled": naive_s,
        "naive_measured": len(naive_times),
        "throughput_ratio": naive_s / service_s,
        "latency_p50_s": quantile(latencies, 0.5),
        "latency_p99_s": quantile(latencies, 0.99),
        "overhead_ms": 1000 * (statistics.median(cached_service) - statistics.median(cached_api)),
        "cached_request_ms": {
            "service": 1000 * statistics.median(cached_service),
            "api": 1000 * statistics.median(cached_api),
        },
    }


def bench_faults(args, work: Path, scorer_url: str) -> dict:
    batch = rollouts(
        work / "faults-world", max(2, args.tasks // 4), args.group, max(3, args.screenshots // 4)
    )
    with FakeOpenAI(make_judge()) as judge:
        clean_rm = RewardModel.from_config(
            write_config(work / "clean.yaml", judge.base_url, scorer_url, args.scorer_slots),
            allow_root=str(work),
        )
        clean = {r.id: r.reward for r in clean_rm.score_sync(batch)}
        clean_rm.close()
    with FakeOpenAI(make_judge(), faults=HALF_FAULTS, timeout_sleep_s=1.0) as judge:
        config = write_config(
            work / "faulty.yaml", judge.base_url, scorer_url, args.scorer_slots, timeout_s=0.5
        )
        rm = RewardModel.from_config(config, allow_root=str(work))
        t0 = time.perf_counter()
        results = rm.score_sync(batch)
        faulty_s = time.perf_counter() - t0
        rm.close()
    wrong = [r.id for r in results if r.reward is not None and r.reward != clean[r.id]]
    unexplained = [r.id for r in results if r.reward is None and not r.error]

    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge:
        config = write_config(
            work / "down.yaml",
            judge.base_url,
            scorer_url,
            args.scorer_slots,
            breaker_failures=2,
            breaker_window_s=0,
        )
        service = RewardService(
            RewardModel.from_config(config, allow_root=str(work)), ServiceLimits(allow_root=str(work))
        )
        body = json.dumps({"rollouts": batch[: args.group]}).encode()
        requests_to_trip = 0
        status, health = 200, {}
        while status == 200 and requests_to_trip < 20:
            asyncio.run(service.admitted("/v1/reward", None, body, service.reward))
            requests_to_trip += 1
            status, health = service.health()
        t0 = time.perf_counter()
        _, payload, _ = asyncio.run(service.admitted("/v1/reward", None, body, service.reward))
        failed_request_s = time.perf_counter() - t0
        service.rm.close()
    return {
        "rollouts": len(batch),
        "judge_fault_rate": sum(HALF_FAULTS.values()),
        "wrong_rewards": len(wrong),
        "none_without_reason": len(unexplained),
        "scored_under_faults": sum(r.reward is not None for r in results),
        "seconds_under_faults": faulty_s,
        "down": {
            "requests_until_health_says_down": requests_to_trip,
            "health_status": health.get("status"),
            "failed_request_s": failed_request_s,
            "all_none_with_reason": all(r["reward"] is None and r["error"] for r in payload["results"]),
        },
    }


# ---------------------------------------------------------------------------- issue 29
class _Env:
    """What a TRL environment holds for the reward: its Episode."""

    def __init__(self, episode: Episode):
        self.episode = episode


def bench_values(args, work: Path, scorer_url: str) -> dict:
    """The same rollouts rewarded with each ``reward.value``: the fraction of GRPO groups whose rewards are
    all equal (zero variance, so zero advantage and no gradient). The judge here needs 1-3 key screenshots
    per verdict (per key point in key_point mode), so rollouts of one task differ in evidence; its
    P(success) is 0.8 on the status word it wrote, so p_success moves with the verdict only (a real
    judge's log-probabilities are graded)."""
    batch = rollouts(work / "world-values", args.value_tasks, args.value_group, args.value_screenshots)
    settings = {
        "binary": {},
        "p_success": {"pipeline__outcome_logprobs": 5},
        "progress": {"pipeline__outcome_mode": "key_point"},
    }
    out: dict = {"rollouts": len(batch), "group": args.value_group}
    for value, overrides in settings.items():
        with FakeOpenAI(make_judge("evidence")) as judge:
            config = write_config(
                work / f"values-{value}.yaml", judge.base_url, scorer_url, args.scorer_slots
            )
            rm = RewardModel.from_config(config, value=value, allow_root=str(work), **overrides)
            rewards = [r.reward for r in rm.score_sync(batch)]
            rm.close()
        groups = [rewards[g * args.value_group : (g + 1) * args.value_group] for g in range(args.value_tasks)]
        out[value] = {
            "zero_variance_groups": sum(len(set(g)) == 1 for g in groups) / len(groups),
            "failed": sum(r is None for r in rewards),
        }
    return out


def _episodes(batch: list[dict]) -> list[_Env]:
    envs = []
    for rollout in batch:
        episode = Episode(rollout["task"], task_id=rollout["id"].split("-")[0])
        for shot in rollout["screenshots"]:
            episode.add_step(shot, action="click")
        episode.finish("done")
        envs.append(_Env(episode))
    return envs


def _trl_call(reward, envs: list[_Env]) -> list:
    return asyncio.run(
        reward(
            environments=envs,
            prompts=[[{"role": "user", "content": e.episode.task}] for e in envs],
            completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
            completion_ids=[[1] for _ in envs],
            trainer_state=None,
        )
    )


def bench_openrlhf(work: Path, judge: FakeOpenAI, config: Path, batch: list[dict], serial_s: float) -> dict:
    """The episodes through OpenRLHF 0.11.2's own executor in its venv: its rollout actor runs every episode
    of the batch at once through the agent file's AgentExecutor (tests/framework/openrlhf_replay_agent.py;
    a text-only policy and a fixed-action engine stand-in, so the clock holds the reward's side), each final
    step awaiting the process-wide batcher. As in a trainer's process after its first batch, the process
    has run a warm-up batch (another task, not counted) and built the model before the clock starts; the
    measured batch gets a fresh model (no cache)."""
    python = framework_python("openrlhf")
    if missing("openrlhf"):
        print(f"[reward] OpenRLHF row skipped: {missing('openrlhf')}", flush=True)
        return {"openrlhf_s": None, "openrlhf_judge_calls_per_episode": None, "openrlhf_ratio": None}
    warmup = rollouts(work / "openrlhf-warmup", 1, 2, 3)
    framework = REPO / "tests" / "framework"
    proc = subprocess.Popen(
        [str(python), str(framework / "openrlhf_rollouts.py"), "--tiny", str(work / "tiny")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    answers = OutputLines(proc, "the OpenRLHF driver")

    def run(labels: list[dict]) -> dict:
        job = {
            "mode": "agent",
            "agent_file": str(framework / "openrlhf_replay_agent.py"),
            "config": str(config),
        }
        job.update(labels=[json.dumps(r) for r in labels], tmp=str(work), text_policy=True, warm=True)
        proc.stdin.write(json.dumps(job) + "\n")
        proc.stdin.flush()
        try:
            line = answers.wait_for("keyshot-openrlhf-result ", 3600)
        except RuntimeError as exc:
            raise SystemExit(f"the OpenRLHF run gave no answer: {exc}") from None
        answer = json.loads(line.split(" ", 1)[1])
        if "error" in answer:
            raise SystemExit(f"the OpenRLHF run failed: {answer['error']}")
        return answer

    try:
        run(warmup)
        before = judge.stats.completions_served
        measured = run(batch)
        calls = judge.stats.completions_served - before
    finally:
        proc.stdin.close()
        proc.wait(timeout=60)
    return {
        "openrlhf_s": measured["seconds"],
        "openrlhf_judge_calls_per_episode": calls / len(batch),
        "openrlhf_failed": sum(measured["info"]["keyshot_failed"]),
        "openrlhf_executor": measured["executor"],
        "openrlhf_ratio": serial_s / measured["seconds"],
    }


def bench_episodes(args, work: Path, judge: FakeOpenAI, scorer_url: str) -> dict:
    batch = rollouts(work / "episode-world", args.episode_tasks, args.episode_group, args.screenshots)
    config = write_config(
        work / "episodes.yaml", judge.base_url, scorer_url, args.scorer_slots, breaker_window_s=0
    )
    out: dict = {"episodes": len(batch), "screenshots": args.screenshots}

    before = judge.stats.completions_served
    rm = RewardModel.from_config(config, allow_root=str(work))
    t0 = time.perf_counter()
    trl_rewards = _trl_call(environment_reward(rm), _episodes(batch))
    out["trl_s"] = time.perf_counter() - t0
    out["trl_judge_calls_per_episode"] = (judge.stats.completions_served - before) / len(batch)
    out["trl_failed"] = sum(r is None for r in trl_rewards)
    rm.close()

    serial = []
    for rollout in batch[:: max(1, len(batch) // args.naive)][: args.naive]:
        one = RewardModel.from_config(
            config, allow_root=str(work)
        )  # get_reward: one environment, then the next
        t0 = time.perf_counter()
        _trl_call(environment_reward(one), _episodes([rollout]))
        serial.append(time.perf_counter() - t0)
        one.close()
    out["serial_s_scaled"] = statistics.mean(serial) * len(batch)
    out["serial_measured"] = len(serial)
    out["trl_ratio"] = out["serial_s_scaled"] / out["trl_s"]

    agent_config = work / "agents.yaml"  # OpenRLHF needs a number: a failed call is a counted 0
    agent_config.write_text(config.read_text() + "reward:\n  on_failure: zero\n")
    out.update(bench_openrlhf(work, judge, agent_config, batch, out["serial_s_scaled"]))
    return out


def bench_verl(args, work: Path, judge: FakeOpenAI, scorer_url: str, serial_s: float) -> dict:
    """E_TASKS x E_GROUP episodes, each kept as its own trajectory file (``extra_info["trajectory"]``),
    through verl's reward loop: the seconds of ``compute_rm_score`` (its worker started and one episode of
    another task scored first, as in a trainer's later step) and the judge calls it paid per episode."""
    python = framework_python("verl")
    if args.quick or missing("verl"):
        why = "--quick" if args.quick else missing("verl")
        print(f"[reward] verl row skipped: {why}", flush=True)
        return {"verl_s": None, "verl_judge_calls_per_episode": None, "verl_ratio": None}
    batch = rollouts(work / "verl-world", args.episode_tasks, args.episode_group, args.screenshots)
    samples = []
    # a trainer's earlier step (another task): the worker's reward model is built before the clock starts,
    # as the TRL and OpenRLHF runs' are
    warm = {**batch[0], "id": "t99-r0", "task": "Open the start page and read its title"}
    for rollout in [warm, *batch]:
        task = rollout["id"].split("-")[0]
        episode = Episode(rollout["task"], task_id=task, keep_dir=work / "verl-episodes")
        for shot in rollout["screenshots"]:
            episode.add_step(shot, action="click")
        episode.finish("done")
        samples.append({"index": int(task[1:]), "trajectory": str(episode.jsonl_path), "answer": "done"})
    config = write_config(
        work / "verl.yaml", judge.base_url, scorer_url, args.scorer_slots, breaker_window_s=0
    )
    config.write_text(config.read_text() + "reward:\n  on_failure: zero\n")  # verl needs a number
    spec = {
        "workdir": str(work / "verl"),
        "reward_file": str(REPO / "frameworks" / "verl" / "reward.py"),
        "cases": [
            {
                "name": "bench",
                "keyshot_config": str(config),
                "samples": samples[1:],
                "warmup": samples[:1],
                "router": None,
            }
        ],
    }
    (work / "verl").mkdir()
    (work / "verl" / "spec.json").write_text(json.dumps(spec))
    before = judge.stats.completions_served
    argv = [
        str(python),
        str(REPO / "tests" / "framework" / "verl_reward_loop.py"),
        str(work / "verl" / "spec.json"),
    ]
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    answer = [line for line in done.stdout.splitlines() if line.startswith("VERL_RESULT ")]
    if done.returncode != 0 or not answer:
        raise SystemExit(f"the verl run failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    run = json.loads(answer[-1].split(" ", 1)[1])["bench"]
    if "error" in run:
        raise SystemExit(f"the verl run failed: {run['error']}")
    return {
        "verl_episodes": len(batch),
        "verl_s": run["score_s"],
        "verl_judge_calls_per_episode": (judge.stats.completions_served - before - run["warmup_judge_calls"])
        / len(batch),
        "verl_failed": sum(run["extra"]["keyshot_failed"]),
        "verl_ratio": serial_s / run["score_s"],
    }


def memory_child(episodes: int, steps: int) -> None:
    """Open ``episodes`` Episodes of ``steps`` 1280x720 screenshots; print the RSS figures as JSON."""
    from PIL import Image, ImageDraw

    def rss_mib() -> float:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    peak = [0.0]
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], rss_mib())
            time.sleep(0.02)

    baseline = rss_mib()
    threading.Thread(target=sample, daemon=True).start()
    open_episodes = []
    for e in range(episodes):
        episode = Episode(f"task {e % 8}")
        for s in range(steps):
            image = Image.new("RGB", (1280, 720), (240, 240, 240))
            ImageDraw.Draw(image).rectangle((40 + s, 40 + e, 600, 400), fill=(e * 3 % 256, s * 5 % 256, 90))
            episode.add_step(image, action=f"click {s}")
        open_episodes.append(episode)
    stop.set()
    peak[0] = max(peak[0], rss_mib())
    print(
        json.dumps(
            {
                "episodes": episodes,
                "steps": steps,
                "baseline_mib": baseline,
                "peak_above_baseline_mib": peak[0] - baseline,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )
    for episode in open_episodes:
        episode.discard()


def bench_memory(args) -> dict:
    argv = [
        sys.executable,
        "-m",
        "bench.reward",
        "--memory-child",
        str(args.memory_episodes),
        str(args.memory_steps),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(report: dict) -> str:
    r, f, e, m = report["rollouts"], report["faults"], report["episodes"], report["memory"]
    vr = report["verl"]
    rows = [
        (
            "judge calls per rollout (service; 2.0 when every rollout asks)",
            f"{r['judge_calls_per_rollout']:.3f}",
            f"≤ 1.1 (floor 1 + 1/{report['settings']['group']})",
        ),
        (
            f"throughput: service vs one rollout at a time ({r['rollouts']} rollouts)",
            f"{r['throughput_ratio']:.1f}×",
            "≥ 8×",
        ),
        (
            "request latency p50 / p99 (one group per request)",
            f"{r['latency_p50_s']:.2f} / {r['latency_p99_s']:.2f} s",
            "",
        ),
        ("service overhead per request vs the API in process", f"{r['overhead_ms']:.1f} ms", "≤ 5 ms"),
        (
            f"wrong rewards under {f['judge_fault_rate']:.0%} judge faults ({f['rollouts']} rollouts)",
            str(f["wrong_rewards"]),
            "0",
        ),
        (
            "an all-failing judge: a request fails in",
            f"{f['down']['failed_request_s']:.3f} s (health: {f['down']['health_status']})",
            "< 1 s",
        ),
        (
            f"TRL environment reward: judge calls per episode ({e['episodes']} episodes)",
            f"{e['trl_judge_calls_per_episode']:.3f}",
            f"the floor 1 + 1/{report['settings']['episode_group']} (key points once per task)",
        ),
        ("TRL environment reward vs awaiting each environment in turn", f"{e['trl_ratio']:.1f}×", "≥ 8×"),
        (
            "OpenRLHF agents (OpenRLHF's own executor): judge calls per episode",
            "not run" if e["openrlhf_ratio"] is None else f"{e['openrlhf_judge_calls_per_episode']:.3f}",
            "the same floor",
        ),
        (
            "OpenRLHF agents vs awaiting each in turn",
            "not run" if e["openrlhf_ratio"] is None else f"{e['openrlhf_ratio']:.1f}×",
            "≥ 8×",
        ),
        *(
            (
                f"groups of {v['group']} with zero reward variance, reward.value {value} "
                f"({v['rollouts']} rollouts)",
                f"{v[value]['zero_variance_groups']:.0%}",
                "lower is better (binary makes whole groups equal)",
            )
            for v in [report["values"]]
            for value in ("binary", "p_success", "progress")
        ),
        (
            f"{m['episodes']} open episodes of {m['steps']} 1280x720 screenshots: peak RSS above baseline",
            f"{m['peak_above_baseline_mib']:.0f} MiB",
            "≤ 1024 MiB",
        ),
        (
            "verl reward loop (verl's own RewardLoopManager): judge calls per episode",
            "not run" if vr["verl_ratio"] is None else f"{vr['verl_judge_calls_per_episode']:.3f}",
            "the same floor",
        ),
        (
            "verl reward loop vs awaiting each in turn",
            "not run" if vr["verl_ratio"] is None else f"{vr['verl_ratio']:.1f}×",
            "≥ 8×",
        ),
    ]
    lines = ["| measure | figure | target |", "|---|---:|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    return "\n".join(lines)


def _framework(name: str, ratio: float | None, seconds: float | None, calls: float | None) -> str:
    return (
        f"{name} not run"
        if ratio is None
        else f"{name} {ratio:.1f}× ({seconds:.1f} s, {calls:.3f} calls per episode)"
    )


def rows_of(report: dict) -> Rows:
    r, e, f, v, m = (report[k] for k in ("rollouts", "episodes", "faults", "values", "memory"))
    s, vr = report["settings"], report["verl"]
    fake = (
        f"fake judge {s['judge_latency']} s, scorer {s['scorer_latency']} s × {s['scorer_slots']} in flight"
    )
    service = (
        f"`keyshot reward serve` vs one rollout at a time, {r['rollouts']} rollouts of {r['screenshots']} screenshots",
        f"{r['throughput_ratio']:.1f}×",
        f"{r['service_s']:.0f} s vs {r['naive_s_scaled']:.0f} s (one at a time: {r['naive_measured']} measured, "
        f"scaled); {r['judge_calls_per_rollout']:.2f} judge calls per rollout; p50/p99 {r['latency_p50_s']:.1f}/"
        f"{r['latency_p99_s']:.1f} s per group request; overhead vs the API {r['overhead_ms']:.1f} ms; {fake}",
    )
    frameworks = "; ".join(
        (
            _framework(
                "OpenRLHF's own multi-turn executor in its venv",
                e["openrlhf_ratio"],
                e["openrlhf_s"],
                e["openrlhf_judge_calls_per_episode"],
            ),
            _framework(
                "verl's own RewardLoopManager",
                vr["verl_ratio"],
                vr["verl_s"],
                vr["verl_judge_calls_per_episode"],
            ),
        )
    )
    episodes = (
        f"TRL environment reward vs each environment in turn, {e['episodes']} episodes",
        f"{e['trl_ratio']:.1f}×",
        f"{e['trl_s']:.1f} vs {e['serial_s_scaled']:.0f} s; {e['trl_judge_calls_per_episode']:.3f} judge calls per "
        f"episode (the floor for groups of {s['episode_group']}: {1 + 1 / s['episode_group']:.3f}); {frameworks}",
    )
    faults = (
        f"rewards under {f['judge_fault_rate']:.0%} judge faults that differ from the clean run's",
        str(f["wrong_rewards"]),
        f"{f['scored_under_faults']} of {f['rollouts']} scored, the rest None with a reason; an all-failing "
        f"judge: health {f['down']['health_status']}, a request fails in {f['down']['failed_request_s']:.3f} s; "
        f"{m['episodes']} open episodes × {m['steps']} 1280×720 shots: +{m['peak_above_baseline_mib']:.0f} MiB",
    )
    values = (
        f"GRPO groups of {v['group']} with zero reward variance, the same {v['rollouts']} rollouts: "
        "binary / p_success / progress",
        " / ".join(f"{v[k]['zero_variance_groups']:.0%}" for k in ("binary", "p_success", "progress")),
        "`reward: {value: progress}` with `outcome_mode: key_point` gives a gradient to groups whose binary "
        "rewards are all equal; the fake judge's P(success) is two-valued, so p_success moves with the verdict only",
    )
    headline = Headline(
        f"Rewarding {r['rollouts']} GRPO rollouts: `keyshot reward serve` / one rollout at a time",
        f"{r['throughput_ratio']:.1f}× ({r['service_s']:.0f} vs {r['naive_s_scaled']:.0f} s)",
        Plot(
            f"Rewarding {r['rollouts']} rollouts of {r['screenshots']} screenshots",
            "seconds (fewer is better)",
            (
                ("one rollout at a time", round(r["naive_s_scaled"])),
                ("keyshot reward serve", round(r["service_s"])),
            ),
        ),
    )
    return Rows((ratio_table([service, episodes, faults, values]),), (headline,))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--group", type=int, default=16)
    ap.add_argument("--screenshots", type=int, default=20)
    ap.add_argument("--episode-tasks", type=int, default=8)
    ap.add_argument("--episode-group", type=int, default=8)
    ap.add_argument("--judge-latency", type=float, default=1.5)
    ap.add_argument("--scorer-latency", type=float, default=0.1)
    ap.add_argument("--scorer-slots", type=int, default=8)
    ap.add_argument(
        "--naive", type=int, default=6, help="rollouts judged one at a time (scaled to the batch)"
    )
    ap.add_argument("--repeats", type=int, default=10, help="cached requests for the overhead figure")
    ap.add_argument("--value-tasks", type=int, default=8, help="tasks of the reward.value comparison")
    ap.add_argument("--value-group", type=int, default=8, help="rollouts per task there")
    ap.add_argument("--value-screenshots", type=int, default=3, help="screenshots per rollout there")
    ap.add_argument("--memory-episodes", type=int, default=64)
    ap.add_argument("--memory-steps", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run (tests)")
    record.json_option(ap)
    ap.add_argument("--memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_child:
        memory_child(*args.memory_child)
        return {}
    if args.quick:
        args.tasks, args.group, args.screenshots = 3, 4, 4
        args.episode_tasks, args.episode_group, args.naive, args.repeats = 2, 4, 2, 3
        args.memory_episodes, args.memory_steps, args.judge_latency = 8, 10, 0.5
        args.value_tasks, args.value_group, args.value_screenshots = 2, 4, 3
    report: dict = {
        "machine": f"{os.cpu_count()} CPU cores",
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "memory_child")},
    }
    with tempfile.TemporaryDirectory(prefix="bench-reward-") as tmp:
        work = Path(tmp)
        with (
            spawn_fake_openai("judge", latency_s=args.scorer_latency) as (scorer_url, _),
            FakeOpenAI(make_judge(), latency_s=args.judge_latency) as judge,
        ):
            print(
                f"[reward] {args.tasks}x{args.group} rollouts of {args.screenshots} screenshots", flush=True
            )
            report["rollouts"] = bench_rollouts(args, work, judge, scorer_url)
            print(f"[reward] {args.episode_tasks}x{args.episode_group} episodes", flush=True)
            report["episodes"] = bench_episodes(args, work, judge, scorer_url)
            print("[reward] verl's reward loop", flush=True)
            report["verl"] = bench_verl(args, work, judge, scorer_url, report["episodes"]["serial_s_scaled"])
            print("[reward] faults", flush=True)
            report["faults"] = bench_faults(args, work, scorer_url)
            print(f"[reward] reward.value: {args.value_tasks}x{args.value_group} rollouts", flush=True)
            report["values"] = bench_values(args, work, scorer_url)
    print(f"[reward] memory: {args.memory_episodes} episodes x {args.memory_steps} screenshots", flush=True)
    report["memory"] = bench_memory(args)
    report["table"] = table(report)
    print(report["table"])
    record.finish(args.json, report, rows_of, __spec__.name, argv)
    return report


if __name__ == "__main__":
    # quiet the fake scorer's "no checkpoint" warning, said per model (not in main(): tests call it)
    logging.getLogger("keyshot").setLevel(logging.ERROR)
    main()
