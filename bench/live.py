"""Live episodes (issue 34): N browsers side by side, each running a scripted agent through M MiniWoB
episodes in headless Chromium, every episode rewarded by keyshot as it ends.

Two ways of rewarding the same episodes (the same tasks, seeds and scripted actions, so the same pages):

* batched: each finished episode goes to the process-wide batcher (``score_shared_sync`` from a thread of
  its own, so the browser goes on with its next episode); episodes ending within the batch window share
  one round of calls;
* one at a time: one consumer rewards the finished episodes in turn, each alone (``RewardModel.score``
  of one episode), as a reward function awaiting each environment's reward would.

Measured: episodes per second (from the first reset until the last reward is in), the reward's latency
after an episode's last step (p50/p99), judge calls paid per episode, each browser's peak memory (the PSS
of its process tree: keyshot's worker, playwright's driver, its Chromium), and where the time goes (the
browser's reset and steps per episode against the reward's latency). Each browser is a session with a
Chromium of its own (``MiniWoBBrowser`` made directly); its first episode launches it, the next ones open
a fresh context in it. The judge and scorer are the fake server with
``--judge-latency`` / ``--scorer-latency``; its verdict does not read the page, so the count of episodes
where MiniWoB's reward and keyshot's both reached the record (``both_rewards_logged``) checks the plumbing,
not the judge's agreement with MiniWoB. Needs ``make setup-browser``.

    .venv/bin/python -m bench.live [--browsers 4,8] [--episodes 3] [--json runs/bench/live.json]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from bench import record
from bench.record import Rows, ratio_table
from keyshot.env.miniwob.agents import ScriptedAgent
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.setup import MiniWoBError, browser_setup
from keyshot.env.play import run_episode
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import spawn_fake_openai
from keyshot.reward import RewardModel
from keyshot.reward import shared as reward_shared
from keyshot.reward.logs import paid_calls

MODES = ("batched", "one_at_a_time")


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class MemoryWatch:
    """Samples each browser's process tree (PSS) every ``every_s`` seconds; keeps each tree's peak."""

    def __init__(self, browsers: list[MiniWoBBrowser], every_s: float = 1.0):
        self.browsers, self.every_s = browsers, every_s
        self.peaks = [0] * len(browsers)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _tree_pss(self, browser: MiniWoBBrowser) -> int:
        if browser.process is None:
            return 0
        total = 0
        try:
            root = psutil.Process(
                browser.process.pids[0]
            )  # its worker: playwright's driver and Chromium below
            for p in [root, *root.children(recursive=True)]:
                total += p.memory_full_info().pss
        except psutil.Error:  # a process ended between listing and reading
            pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            for i, b in enumerate(self.browsers):
                self.peaks[i] = max(self.peaks[i], self._tree_pss(b))

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run(mode: str, n: int, m: int, task: str, config: Path, work: Path) -> dict:
    """N browsers x M episodes, rewarded ``mode``; one dict of measurements."""
    reward_shared.reset_shared()
    browsers = [MiniWoBBrowser(task, max_steps=5) for _ in range(n)]
    records: list[dict] = []
    unopened: list[str] = []  # episodes whose page did not open
    lock = threading.Lock()
    finished: queue.Queue = queue.Queue()
    rewarders = ThreadPoolExecutor(max_workers=n * m) if mode == "batched" else None
    single = RewardModel.from_config(config) if mode == "one_at_a_time" else None

    def rewarded(record: dict, episode) -> None:
        if mode == "batched":
            [result] = reward_shared.score_shared_sync([episode], config=str(config))
        else:
            [result] = single.score_sync([episode])
        record.update(
            reward_done=time.perf_counter(),
            reward=result.reward,
            error=result.error,
            judge_calls=paid_calls(result, "judge"),
        )

    def consumer() -> None:
        while (item := finished.get()) is not None:
            rewarded(*item)

    def browse(index: int) -> None:
        for k in range(m):
            started = time.perf_counter()
            browsers[index].seed = index * m + k
            try:
                episode = run_episode(browsers[index], ScriptedAgent(), keep_dir=work / mode / str(n))
            except MiniWoBError as exc:  # the page did not open: counted, said, and the next episode goes on
                with lock:
                    unopened.append(str(exc))
                continue
            record = {
                "browser": index,
                "seed": browsers[index].seed,
                "steps": browsers[index].step,
                "miniwob_reward": browsers[index].reward,
                "browser_s": time.perf_counter() - started,
                "last_step": time.perf_counter(),
            }
            with lock:
                records.append(record)
            if rewarders is not None:
                rewarders.submit(rewarded, record, episode)
            else:
                finished.put((record, episode))

    t0 = time.perf_counter()
    consuming = threading.Thread(target=consumer) if single is not None else None
    if consuming:
        consuming.start()
    with MemoryWatch(browsers) as memory:
        threads = [threading.Thread(target=browse, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if rewarders is not None:
            rewarders.shutdown(wait=True)
        if consuming:
            finished.put(None)
            consuming.join()
    total_s = time.perf_counter() - t0
    for b in browsers:
        b.close()
    if single is not None:
        single.close()
    reward_shared.reset_shared()
    latencies = [r["reward_done"] - r["last_step"] for r in records]
    episodes = len(records)
    return {
        "mode": mode,
        "browsers": n,
        "episodes": episodes,
        "seconds": total_s,
        "episodes_per_s": episodes / total_s,
        "latency_p50_s": quantile(latencies, 0.5),
        "latency_p99_s": quantile(latencies, 0.99),
        "judge_calls_per_episode": sum(r["judge_calls"] for r in records) / episodes,
        "browser_s_per_episode": statistics.fmean(r["browser_s"] for r in records),
        "steps_per_episode": statistics.fmean(r["steps"] for r in records),
        "peak_mib_per_browser": statistics.fmean(memory.peaks) / 2**20,
        "peak_mib_max_browser": max(memory.peaks) / 2**20,
        "rewarded": sum(r["reward"] is not None for r in records),
        "pages_not_opened": unopened,
        "miniwob_success": sum(r["miniwob_reward"] == 1.0 for r in records),
        # both rewards reached the record: with the fake judge (success whenever a screenshot is kept) and
        # the scripted agent (always right), their agreement would be an artefact: plumbing, not agreement
        "both_rewards_logged": sum(
            r["reward"] is not None and r["miniwob_reward"] is not None for r in records
        ),
    }


def table(report: dict) -> str:
    lines = [
        "| browsers | reward | episodes | episodes/s | reward latency p50 / p99 | judge calls / episode | "
        "browser s / episode | peak MiB / browser |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["runs"]:
        lines.append(
            f"| {r['browsers']} | {r['mode'].replace('_', ' ')} | {r['episodes']} | {r['episodes_per_s']:.2f} | "
            f"{r['latency_p50_s']:.1f} / {r['latency_p99_s']:.1f} s | {r['judge_calls_per_episode']:.2f} | "
            f"{r['browser_s_per_episode']:.1f} | {r['peak_mib_per_browser']:.0f} |"
        )
    return "\n".join(lines)


def rows_of(report: dict) -> Rows:
    s = report["settings"]
    by = {(r["browsers"], r["mode"]): r for r in report["runs"]}
    rows = []
    for n in sorted({r["browsers"] for r in report["runs"]}):
        b, one = by[(n, "batched")], by[(n, "one_at_a_time")]
        rows.append(
            (
                f"{n} browsers × {s['episodes']} MiniWoB episodes in Chromium, each rewarded as it ends: "
                "batched vs one at a time, episodes/s",
                f"{b['episodes_per_s'] / one['episodes_per_s']:.2f}×",
                f"{b['episodes_per_s']:.2f} vs {one['episodes_per_s']:.2f} episodes/s; reward latency after the last "
                f"step p50/p99 {b['latency_p50_s']:.1f}/{b['latency_p99_s']:.1f} s vs {one['latency_p50_s']:.1f}/"
                f"{one['latency_p99_s']:.1f} s; {b['judge_calls_per_episode']:.2f} judge calls per episode; "
                f"browser {b['browser_s_per_episode']:.1f} s per episode ({b['steps_per_episode']:.1f} steps); "
                f"peak {b['peak_mib_per_browser']:.0f} MiB per browser (PSS of its process tree); plumbing, not "
                f"agreement: both rewards reached the record for {b['both_rewards_logged']}/{b['episodes']}; pages "
                f"not opened {b['pages_not_opened']}; fake judge {s['judge_latency']} s, scorer {s['scorer_latency']} s",
            )
        )
    return Rows((ratio_table(rows),))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--browsers", default="4,8", help="browser counts, comma-separated")
    ap.add_argument("--episodes", type=int, default=3, help="episodes per browser")
    ap.add_argument("--task", default="click-button")
    ap.add_argument("--judge-latency", type=float, default=1.5)
    ap.add_argument("--scorer-latency", type=float, default=0.1)
    record.json_option(ap)
    args = ap.parse_args(argv)
    setup = browser_setup()
    report: dict = {
        "machine": f"{os.cpu_count()} CPU cores",
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "chromium": str(setup.chromium),
        "runs": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="bench-live-") as tmp,
        spawn_fake_openai("judge", latency_s=args.scorer_latency) as (scorer_url, _),
        spawn_fake_openai("judge", latency_s=args.judge_latency) as (judge_url, _),
    ):
        config = fake_judge_config(
            Path(tmp) / "reward.yaml",
            judge_url,
            {"endpoint": {"base_url": scorer_url, "model": "webjudge-7b", "api_key_env": None}},
            concurrency=256,
            judge={"max_concurrency": 64, "backoff_base_s": 0.01, "max_retries": 3, "timeout_s": 60},
        )
        for n in (int(x) for x in args.browsers.split(",")):
            for mode in MODES:
                print(f"[live] {n} browsers x {args.episodes} episodes, reward {mode}", flush=True)
                result = run(mode, n, args.episodes, args.task, config, Path(tmp))
                print(json.dumps(result), flush=True)
                report["runs"].append(result)
    report["table"] = table(report)
    print(report["table"])
    record.finish(args.json, report, rows_of, __spec__.name, argv)
    return report


if __name__ == "__main__":
    import logging

    logging.getLogger("keyshot").setLevel(logging.ERROR)  # the fake scorer's "no checkpoint" warning
    sys.exit(0 if main() else 1)
