"""Soak of the live environment (issue 41): hundreds of MiniWoB episodes through the TRL example's
environment class (``examples/reward/trl_browsergym_grpo.py``: ``MiniWoBEnv`` over a ``BrowserPool``, its
reward ``with_miniwob_reward(environment_reward(...))``), as GRPOTrainer drives them: a pool of
environments reset one after another, acted in, rewarded together, reset again for the next batch. A
mixed agent plays (half the environments the scripted agent, half random clicks, each on every task),
and browsers are killed at random (``kill -9`` of a worker or of one of its Chromium instances) while the
batches run.

Reported: browsers alive (the most worker processes at once, against the budget), the memory of this
process and everything it started (PSS: at start, after the first batch, peak, at the end; the end
within 10% of the first batch's is the target), episodes failed and why, the kills, both rewards reaching
the log (MiniWoB's and keyshot's; with the fake judge, whose verdict does not read the page, that is
plumbing, not agreement), and the processes left after the run (orphans: the target is 0).

    nice .venv/bin/python bench/soak_live.py [--episodes 500] [--browsers 8] [--kill-every 15] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

from keyshot.env.miniwob.agents import ScriptedAgent, random_action
from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.setup import browser_setup
from keyshot.env.page import Page
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import spawn_fake_openai
from keyshot.reward.trl import environment_reward

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "reward" / "trl_browsergym_grpo.py"
_CALL = re.compile(r"(\w+)\((.*)\)")


def load_example():
    spec = importlib.util.spec_from_file_location("trl_browsergym_grpo", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Watch:
    """Samples, every ``every_s`` seconds, the PSS of this process and all its descendants and how many
    browser workers run; remembers every descendant seen (pid and start time) for the orphan count."""

    def __init__(self, every_s: float = 2.0):
        self.every_s = every_s
        self.me = psutil.Process()
        self.seen: dict[int, float] = {}
        self.peak_mib = 0.0
        self.max_workers = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> tuple[float, int]:
        """(PSS in MiB of this process tree, browser workers running)."""
        total, workers = 0, 0
        for p in [self.me, *self.me.children(recursive=True)]:
            try:
                total += p.memory_full_info().pss
                if p.pid != self.me.pid:
                    self.seen.setdefault(p.pid, p.create_time())
                    workers += "worker.py" in " ".join(p.cmdline())
            except psutil.Error:  # ended between the listing and the reading
                pass
        mib = total / 2**20
        self.peak_mib = max(self.peak_mib, mib)
        self.max_workers = max(self.max_workers, workers)
        return mib, workers

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def orphans(self, within_s: float = 20.0) -> list[dict]:
        """Processes started during the run that still run ``within_s`` after it (pid reuse excluded)."""
        left = []
        for pid, started in self.seen.items():
            try:
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(left, timeout=within_s)
        described = []
        for p in alive:
            with contextlib.suppress(psutil.Error):
                described.append({"pid": p.pid, "name": p.name(), "cmdline": " ".join(p.cmdline())[:200]})
        return described


class Killer:
    """Kills (SIGKILL) a random browser's worker or one of its Chromium instances every ``every_s``
    seconds on average (exponential gaps, seeded)."""

    def __init__(self, pool: BrowserPool, every_s: float, seed: int):
        self.pool, self.every_s, self.rng = pool, every_s, random.Random(seed)
        self.kills: collections.Counter = collections.Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1 / self.every_s)):
            browsers = [b for b in self.pool.browsers() if b.process is not None and b.pids]
            if not browsers:
                continue
            browser = self.rng.choice(browsers)
            kind, pid = self.rng.choice(
                [("worker", browser.process.pid), ("page chromium", browser.pids[0])]
                + [("chat chromium", p) for p in browser.pids[1:]]
            )
            try:
                os.kill(pid, signal.SIGKILL)
                self.kills[kind] += 1
            except ProcessLookupError:
                pass

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def play(env, text: str, agent, steps: int) -> None:
    """Up to ``steps`` actions of ``agent`` through the environment's tools (as the policy calls them)."""
    for _ in range(steps):
        if env.done:
            return
        action = agent(Page(text, None, 0, False))
        if action is None:
            return
        name, args = _CALL.fullmatch(action).groups()
        values = [a.strip().strip("'\"") for a in args.split(",")] if args else []
        content = getattr(env, name)(*values)
        text = next(c["text"] for c in content if c["type"] == "text")


def reason_kind(error: str) -> str:
    """A failure's reason, without its ids and step numbers (to count reasons)."""
    for pattern, kind in (
        (r"did not open: ([^:;]+)", "the page did not open: {}"),
        (r"the browser failed at step \d+: ([^:;]+)", "the browser failed mid-episode: {}"),
    ):
        if found := re.search(pattern, error):
            return kind.format(found.group(1).strip())
    return re.sub(r"episode \S+: ", "", error)[:100]


def soak(args: argparse.Namespace, config: Path, watch: Watch) -> dict:
    example = load_example()
    example.WebEnv.max_steps = args.max_steps
    tasks = args.tasks.split(",")
    budget = BrowserBudget.for_machine(args.browsers)
    start_mib, _ = watch.sample()
    watch.start()
    pool = example.MiniWoBEnv.pool = BrowserPool(
        budget, tasks[0], setup=browser_setup(), max_steps=args.max_steps
    )
    envs = [example.MiniWoBEnv() for _ in range(args.browsers)]
    reward = example.with_miniwob_reward(environment_reward(config))
    killer = Killer(pool, args.kill_every, args.seed)
    rng = random.Random(args.seed)
    failures: collections.Counter = collections.Counter()
    counts = collections.Counter()
    first_batch_mib = None
    batch_s: list[float] = []
    t0 = time.perf_counter()
    try:
        pool.warm(args.browsers)
        seed = 0
        while counts["episodes"] < args.episodes:
            started = time.perf_counter()
            texts = []
            for env in envs:  # GRPOTrainer resets its environments one after another
                texts.append(env.reset(miniwob_task=tasks[seed % len(tasks)], seed=seed, prompt=[]))
                seed += 1
            agents = [
                ScriptedAgent() if scripted(i) else _random_agent(rng.random()) for i in range(len(envs))
            ]
            with ThreadPoolExecutor(len(envs)) as acting:
                list(acting.map(play, envs, texts, agents, [args.max_steps] * len(envs)))
            extras: dict[str, list] = {}
            rewards = asyncio.run(
                reward(
                    environments=envs,
                    completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
                    log_extra=extras.__setitem__,
                )
            )
            batch_s.append(time.perf_counter() - started)
            for i, (r, truth, error) in enumerate(
                zip(rewards, extras["miniwob_reward"], extras["keyshot_error"], strict=True)
            ):
                agent = "scripted" if scripted(i) else "random"
                counts["episodes"] += 1
                counts[f"episodes_{agent}"] += 1
                if r is None:
                    failures[reason_kind(error or "no reason")] += 1
                    continue
                counts["both_logged"] += truth is not None
                counts[f"miniwob_success_{agent}"] += truth == 1.0
                counts["fake_judge_agrees"] += (r == 1.0) == (truth == 1.0)
            if first_batch_mib is None:
                pool.wait_open(args.browsers, timeout_s=300)
                first_batch_mib, _ = watch.sample()
                killer.start()  # browsers die from the second batch on
            if len(batch_s) % 10 == 0:
                print(
                    f"[soak] {counts['episodes']} episodes, {sum(failures.values())} failed, "
                    f"{sum(killer.kills.values())} kills, {pool.alive} browsers",
                    flush=True,
                )
        killer.stop()
        pool.wait_open(args.browsers, timeout_s=300)  # the last replacements open before the end's measure
        end_mib, _ = watch.sample()
    finally:
        killer.stop()
        pool.close()
    total_s = time.perf_counter() - t0
    watch.stop()
    return {
        "episodes": counts["episodes"],
        "batches": len(batch_s),
        "browsers": args.browsers,
        "seconds": round(total_s, 1),
        "batch_s_p50": round(sorted(batch_s)[len(batch_s) // 2], 2),
        "workers_alive_max": watch.max_workers,
        "pool_most_open": pool.max_alive,
        "browsers_opened": pool.opened,
        "browsers_replaced": pool.replaced,
        "failed_opens": pool.failed_opens,
        "kills": dict(killer.kills),
        "failed": sum(failures.values()),
        "failed_why": dict(failures.most_common()),
        "memory_mib": {
            "start": round(start_mib),
            "after_first_batch": round(first_batch_mib),
            "peak": round(watch.peak_mib),
            "end": round(end_mib),
        },
        "end_vs_first_batch": round(end_mib / first_batch_mib, 3),
        "both_rewards_logged": counts["both_logged"],
        "miniwob_success": {
            "scripted": f"{counts['miniwob_success_scripted']}/{counts['episodes_scripted']}",
            "random": f"{counts['miniwob_success_random']}/{counts['episodes_random']}",
        },
        "fake_judge_equals_miniwob": counts["fake_judge_agrees"],
    }


def scripted(index: int) -> bool:
    """Environments 0, 1, 4, 5, ... play the scripted agent, 2, 3, 6, 7, ... random clicks: each agent
    plays every task (the tasks alternate from one environment to the next)."""
    return index // 2 % 2 == 0


def _random_agent(seed: float):
    rng = random.Random(seed)
    return lambda page: random_action(page, rng)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=500)
    ap.add_argument("--browsers", type=int, default=8, help="environments per batch (and the budget)")
    ap.add_argument("--tasks", default="click-button,enter-text")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--kill-every", type=float, default=15.0, help="seconds between kills, on average")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    watch = Watch()
    with (
        tempfile.TemporaryDirectory(prefix="soak-live-") as tmp,
        spawn_fake_openai("judge", latency_s=0.05) as (url, _),
    ):
        config = fake_judge_config(
            Path(tmp) / "reward.yaml",
            url,
            {"endpoint": {"base_url": url, "model": "webjudge-7b", "api_key_env": None}},
            concurrency=64,
            judge={"max_concurrency": 16, "backoff_base_s": 0.01, "max_retries": 2, "timeout_s": 30},
        )
        report = soak(args, config, watch)
    report["orphans"] = watch.orphans()  # after the fake judge's server ended too
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    ok = not report["orphans"] and report["end_vs_first_batch"] <= 1.10
    return 0 if ok else 1


if __name__ == "__main__":
    import logging

    logging.getLogger("keyshot").setLevel(logging.ERROR)  # the fake scorer's "no checkpoint" warning
    sys.exit(main())
