"""Soak of the live environment floor (issues 41, 45): hundreds of MiniWoB episodes through the TRL
environment class (``keyshot.frameworks.trl.env.MiniWoBEnv``: a session leased from a ``BrowserPool`` at each reset,
given back at its reward; the reward ``with_miniwob_reward(environment_reward(...))``), as a trainer's
batches drive them: a pool of environments reset, acted in, rewarded together, reset again for the next
batch (resets and actions on threads, as an OpenEnv server's sessions come). A mixed agent plays (half
the environments the scripted agent, half random clicks, each on every task), and pages and browsers
are killed at random while the batches run (``kill -9`` of a page's renderer, of a Chromium, or of a
browser's worker process; a page four times as often as each of the others).

Reported: the pages leased at once (against the budget) and the Chromium processes, the memory of this
process and everything it started (PSS: at start, after the first batch, peak, at the end; the end
within 10% of the first batch's is the target), episodes failed and why, the kills, the failed episodes
no kill touched (the target is 0: a killed browser's touched episodes are those in flight in it, a
killed renderer touches at most one), both rewards reaching the log (MiniWoB's and keyshot's; with the
fake judge, whose verdict does not read the page, that is plumbing, not agreement), and the processes
left after the run (orphans: the target is 0).

    nice .venv/bin/python -m bench.soak [--episodes 500] [--pages 32] [--pages-per-browser 8] \
        [--kill-every 20] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
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

from bench import record
from bench.record import Headline, Rows, ratio_table
from keyshot.env.miniwob.agents import ScriptedAgent, random_action
from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.setup import browser_setup
from keyshot.env.page import Page
from keyshot.frameworks.trl.env import MiniWoBEnv, with_miniwob_reward
from keyshot.frameworks.trl.reward import environment_reward
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import spawn_fake_openai

_CALL = re.compile(r"(\w+)\((.*)\)")


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
        """(PSS in MiB of this process tree, browser worker processes running: one per Chromium)."""
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
    """Kills (SIGKILL), every ``every_s`` seconds on average (exponential gaps, seeded), a page (one of a
    random Chromium's renderers), a Chromium, or a browser's worker process; remembers which environments
    each kill touched (those whose session was in the killed browser then; a renderer touches at most one,
    unnamed)."""

    def __init__(self, pool: BrowserPool, envs: list, every_s: float, seed: int):
        self.pool, self.envs, self.every_s, self.rng = pool, envs, every_s, random.Random(seed)
        self.kills: collections.Counter = collections.Counter()
        self.touched: set[int] = set()  # environments in a killed browser, this batch
        self.page_kills = 0  # renderers killed this batch
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.rng.expovariate(1 / self.every_s)):
            processes = [p for p in self.pool.processes() if p.alive and p.chromium_pid]
            if not processes:
                continue
            process = self.rng.choice(processes)
            kind = self.rng.choices(["page", "chromium", "worker"], weights=[4, 1, 1])[0]
            with contextlib.suppress(psutil.Error, ProcessLookupError), self._lock:
                if kind == "page":
                    chromium = psutil.Process(process.chromium_pid)
                    pages = [
                        c
                        for c in chromium.children(recursive=True)
                        if "--type=renderer" in " ".join(c.cmdline())
                    ]
                    if not pages:
                        continue
                    self.rng.choice(pages).kill()
                    self.page_kills += 1
                else:
                    in_it = {
                        i
                        for i, env in enumerate(self.envs)
                        if env._browser is not None and env._browser.process is process
                    }
                    os.kill(process.chromium_pid if kind == "chromium" else process.pids[0], signal.SIGKILL)
                    self.touched |= in_it
                self.kills[kind] += 1

    def batch_over(self) -> tuple[set[int], int]:
        """What this batch's kills touched (environments, renderers killed), reset for the next batch."""
        with self._lock:
            touched, pages = self.touched, self.page_kills
            self.touched, self.page_kills = set(), 0
        return touched, pages

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def episode(env, row: dict, agent, steps: int) -> None:
    """The environment reset on ``row``, then up to ``steps`` actions of ``agent`` through its tools (as the
    policy calls them)."""
    text = env.reset(**row)
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
        (r"did not open: ([^:;(]+)", "the page did not open: {}"),
        (r"the browser failed at step \d+: ([^:;(]+)", "the browser failed mid-episode: {}"),
    ):
        if found := re.search(pattern, error):
            return kind.format(found.group(1).strip())
    return re.sub(r"episode \S+: ", "", error)[:100]


def soak(args: argparse.Namespace, config: Path, watch: Watch) -> dict:
    tasks = args.tasks.split(",")
    budget = BrowserBudget(args.pages, pages_per_browser=args.pages_per_browser)
    start_mib, _ = watch.sample()
    watch.start()
    pool = BrowserPool(budget, tasks[0], setup=browser_setup(), max_steps=args.max_steps)
    factory = functools.partial(MiniWoBEnv, pool=pool, max_steps=args.max_steps)
    envs = [factory() for _ in range(args.pages)]
    reward = with_miniwob_reward(environment_reward(config))
    killer = Killer(pool, envs, args.kill_every, args.seed)
    rng = random.Random(args.seed)
    failures: collections.Counter = collections.Counter()
    counts = collections.Counter()
    first_batch_mib = None
    batch_s: list[float] = []
    t0 = time.perf_counter()
    try:
        pool.warm(args.pages)
        seed = 0
        while counts["episodes"] < args.episodes:
            started = time.perf_counter()
            rows = [
                {"miniwob_task": tasks[(seed + i) % len(tasks)], "seed": seed + i, "prompt": []}
                for i in range(len(envs))
            ]
            seed += len(envs)
            agents = [
                ScriptedAgent() if scripted(i) else _random_agent(rng.random()) for i in range(len(envs))
            ]
            with ThreadPoolExecutor(len(envs)) as threads:
                list(threads.map(episode, envs, rows, agents, [args.max_steps] * len(envs)))
            extras: dict[str, list] = {}
            rewards = asyncio.run(
                reward(
                    environments=envs,
                    completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
                    log_extra=extras.__setitem__,
                )
            )
            batch_s.append(time.perf_counter() - started)
            touched, page_kills = killer.batch_over()
            failed = {i for i, r in enumerate(rewards) if r is None}
            counts["failed_untouched"] += max(0, len(failed - touched) - page_kills)
            counts["touched"] += len(touched) + page_kills
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
                first_batch_mib, _ = watch.sample()
                killer.start()  # pages and browsers die from the second batch on
            print(
                f"[soak] {counts['episodes']} episodes, {sum(failures.values())} failed, "
                f"{sum(killer.kills.values())} kills, {len(pool.processes())} Chromium, batch {batch_s[-1]:.0f} s",
                flush=True,
            )
        killer.stop()
        killer.batch_over()
        end_mib, _ = watch.sample()
    finally:
        killer.stop()
        pool.close()
    total_s = time.perf_counter() - t0
    watch.stop()
    return {
        "episodes": counts["episodes"],
        "batches": len(batch_s),
        "pages": args.pages,
        "pages_per_browser": args.pages_per_browser,
        "seconds": round(total_s, 1),
        "batch_s_p50": round(sorted(batch_s)[len(batch_s) // 2], 2),
        "browsers_alive_max": watch.max_workers,
        "most_leased": pool.max_leased,
        "chromium_launched": pool.launched,
        "chromium_replaced": pool.replaced,
        "kills": dict(killer.kills),
        "failed": sum(failures.values()),
        "failed_untouched": counts["failed_untouched"],
        "touched": counts["touched"],
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


def rows_of(report: dict) -> Rows:
    r, m, k = report, report["memory_mib"], report["kills"]
    why = "; ".join(f"{n} '{reason}'" for reason, n in r["failed_why"].items())
    row = (
        f"{r['episodes']} episodes through keyshot.frameworks.trl.env's MiniWoBEnv ({r['pages']} pages a batch on Chromium "
        f"of {r['pages_per_browser']} pages, a mixed agent), a kill -9 every {r['settings']['kill_every_s']:g} s on "
        "average (a page's renderer 4× as often as a Chromium or a worker): memory at the end vs after the first "
        "batch",
        f"{r['end_vs_first_batch']:.2f}×",
        f"PSS of the process and all it started {m['start']:,} MiB at start, {m['after_first_batch']:,} after the "
        f"first batch, peak {m['peak']:,}, end {m['end']:,}; {r['most_leased']} pages leased at most, at most "
        f"{r['browsers_alive_max']} Chromium alive; {sum(k.values())} kills ({k.get('page', 0)} pages, "
        f"{k.get('chromium', 0)} Chromium, {k.get('worker', 0)} workers), {r['failed']} episodes failed, each None "
        f"with its reason, {r['failed_untouched']} outside a kill's reach ({r['touched']} touched): {why}; "
        f"{r['chromium_replaced']} Chromium replaced, {r['chromium_launched']} launched; orphans after the run "
        f"{len(r['orphans'])}; {r['seconds']:,.0f} s (batch p50 {r['batch_s_p50']:.0f} s); both rewards logged for "
        f"{r['both_rewards_logged']} episodes; MiniWoB success scripted {r['miniwob_success']['scripted']}, random "
        f"{r['miniwob_success']['random']}",
    )
    headline = Headline(
        f"Live soak, {r['episodes']} episodes under kill -9: memory at the end / after the first batch; failed "
        "episodes no kill reached; processes left",
        f"{r['end_vs_first_batch']:.2f}×; {r['failed_untouched']}; {len(r['orphans'])}",
    )
    return Rows((ratio_table([row]),), (headline,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=500)
    ap.add_argument("--pages", type=int, default=32, help="environments per batch (and the budget)")
    ap.add_argument("--pages-per-browser", type=int, default=8, help="pages a Chromium holds")
    ap.add_argument("--tasks", default="click-button,enter-text")
    ap.add_argument("--max-steps", type=int, default=3)
    ap.add_argument("--kill-every", type=float, default=20.0, help="seconds between kills, on average")
    ap.add_argument("--seed", type=int, default=0)
    record.json_option(ap)
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
    report["settings"] = {"kill_every_s": args.kill_every, "tasks": args.tasks, "max_steps": args.max_steps}
    print(json.dumps(report, indent=2))
    ok = not report["orphans"] and report["end_vs_first_batch"] <= 1.10 and report["failed_untouched"] == 0
    return record.finish(args.json, report, rows_of, __spec__.name, argv, 0 if ok else 1)


if __name__ == "__main__":
    import logging

    logging.getLogger("keyshot").setLevel(logging.ERROR)  # the fake scorer's "no checkpoint" warning
    sys.exit(main())
