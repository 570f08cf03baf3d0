"""Scale-out figures (docs/scaling.md): shard processes, a scorer pool, and the merge at 100k verdicts.

* shards: ``keyshot judge --shard I/N`` with N = 1, 2, 4 processes side by side over the same input,
  against one fake OpenAI server whose every answer takes a fixed latency (the work is I/O bound, as
  against a remote judge API); wall time of the whole input, ratio to one process.
* pool: one run with the scorer on 1 endpoint vs a pool of 2 (each endpoint answers at most
  ``--endpoint-slots`` requests at once, as a GPU server's batch would); ratio of wall times.
* merge: ``keyshot merge`` over 8 shard folders holding ``--merge-lines`` verdict lines of a real
  Online-Mind2Web length (27 screenshots each); seconds, and the merge process's peak memory next to
  the size of the verdict files (flat: it streams).

    .venv/bin/python -m bench.scale [--trajectories 512] [--latency 0.15] [--merge-lines 100000] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from bench.record import REPO, Headline, Rows, ratio_table
from keyshot.infer.protocol.verdicts import OutcomeCall, RoleUsage, ScreenshotRecord, Verdict
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, judge_responder, spawn_fake_openai
from keyshot.infer.testing.worlds import synthetic_trajectories

SCREENSHOTS = 27  # Online-Mind2Web's mean trajectory length
FAST_JUDGE = {"max_concurrency": 64}


def _judge(inputs: list[str], cfg: Path, out: Path, shard: str | None = None) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "keyshot.infer.cli",
        "judge",
        *inputs,
        "--config",
        str(cfg),
        "--out",
        str(out),
        "--no-progress",
    ]
    if shard:
        argv += ["--shard", shard]
    return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        _, err = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"keyshot judge failed ({p.returncode}): {err[-2000:]}")


def bench_shards(tmp: Path, inputs: list[str], latency: float, concurrency: int) -> dict:
    times = {}
    with spawn_fake_openai("judge", latency_s=latency) as (url, _):
        scorer = {
            "endpoint": {"base_url": url, "model": "webjudge-7b", "api_key_env": None, "max_concurrency": 64}
        }
        cfg = fake_judge_config(tmp / "shards.yaml", url, scorer, concurrency=concurrency, judge=FAST_JUDGE)
        for n in (1, 2, 4):
            t0 = time.perf_counter()
            _wait([_judge(inputs, cfg, tmp / f"shards-{n}", f"{i}/{n}") for i in range(n)])
            times[n] = time.perf_counter() - t0
    # hash shards are not exactly equal: the largest one bounds the speed-up (N / its share of the work)
    owned = [
        json.loads((tmp / "shards-4" / f"shard-{i}-of-4" / "summary.json").read_text())["run"]["owned"]
        for i in range(4)
    ]
    return {
        "seconds": times,
        "speedup": {n: times[1] / t for n, t in times.items()},
        "owned_by_4_shards": owned,
        "bound_4": sum(owned) / max(owned),
        "latency_s": latency,
        "concurrency_per_process": concurrency,
    }


def bench_pool(tmp: Path, inputs: list[str], latency: float, slots: int) -> dict:
    times = {}
    with (
        FakeOpenAI(judge_responder, record_requests=False) as judge,
        FakeOpenAI(judge_responder, latency_s=latency, record_requests=False) as a,
        FakeOpenAI(judge_responder, latency_s=latency, record_requests=False) as b,
    ):
        for n, servers in ((1, [a]), (2, [a, b])):
            eps = [
                {
                    "base_url": s.base_url,
                    "model": "webjudge-7b",
                    "api_key_env": None,
                    "max_concurrency": slots,
                }
                for s in servers
            ]
            cfg = fake_judge_config(
                tmp / f"pool-{n}.yaml", judge.base_url, {"endpoints": eps}, concurrency=16, judge=FAST_JUDGE
            )
            t0 = time.perf_counter()
            _wait([_judge(inputs, cfg, tmp / f"pool-{n}")])
            times[n] = time.perf_counter() - t0
    return {
        "seconds": times,
        "speedup": times[1] / times[2],
        "latency_s": latency,
        "slots_per_endpoint": slots,
    }


def _verdict(i: int, rng: random.Random) -> Verdict:
    shots = [
        ScreenshotRecord(
            index=k,
            path=f"data/om2w/agent-{i % 6}/task-{i:06d}/trajectory/{k}_full_screenshot.png",
            score=rng.randint(1, 5),
            raw="### Reasoning: the screenshot shows the search results page with the filters the task "
            f"asks for; the key point about the price range is visible. ### Score: {rng.randint(1, 5)}",
            thought="the screenshot shows the search results page with the filters the task asks for",
            valid=True,
        )
        for k in range(SCREENSHOTS)
    ]
    usage = {
        "judge": RoleUsage(2, 0, 0, 4200, 310, 0.0136),
        "scorer": RoleUsage(SCREENSHOTS, 0, 0, 27 * 1650, 27 * 60, 0),
    }
    return Verdict(
        task_id=f"task-{i:06d}",
        task="Find a one-way flight from New York to London on the 3rd of next month under $600 and show its fare rules",
        agent=f"agent-{i % 6}",
        benchmark="online_mind2web",
        success=rng.random() < 0.4,
        status_valid=True,
        key_points="1. one-way\n2. New York to London\n3. the 3rd of next month\n4. under $600",
        outcome_text="Thoughts: the final screenshots show the fare rules of a matching flight. Status: success",
        outcome_calls=[OutcomeCall(text="Status: success", success=True, valid=True)],
        screenshots=shots,
        kept=[k for k in range(SCREENSHOTS) if shots[k].score and shots[k].score >= 3],
        usage=usage,
    )


def bench_merge(tmp: Path, lines: int, shards: int = 8) -> dict:
    from keyshot.infer.runs.run_record import RUN_FILE
    from keyshot.infer.runs.summary import summarize

    root = tmp / "merge"
    rng = random.Random(0)
    protocol = {"prompt_version": "bench", "prompt_variant": "online_mind2web"}
    folders = [root / f"shard-{i}-of-{shards}" for i in range(shards)]
    for s, folder in enumerate(folders):  # each shard as `keyshot judge --shard s/8` leaves it
        folder.mkdir(parents=True)
        (folder / RUN_FILE).write_text(json.dumps({"protocol": protocol}))
        owned = range(s, lines, shards)
        with open(folder / "verdicts.jsonl", "w", encoding="utf-8") as fh:

            def written(fh=fh, owned=owned):
                for i in owned:
                    v = _verdict(i, rng)
                    fh.write(v.to_json() + "\n")
                    yield v

            run = {"found": lines, "owned": len(owned), "judged": len(owned), "skipped": 0, "seconds": 1.0}
            summary = summarize(written(), run=run)
        (folder / "summary.json").write_text(json.dumps(summary))
    size = sum((f / "verdicts.jsonl").stat().st_size for f in folders)
    code = (
        "import resource, sys, time; from keyshot.infer.judge.verdict_merge import merge_shards; t0 = time.perf_counter(); "
        "s = merge_shards(sys.argv[1]); "
        "print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, s['trajectories'])"
    )
    base = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"
    idle = int(
        subprocess.run(
            [sys.executable, "-c", "import keyshot.infer.judge.verdict_merge; " + base],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(root)], cwd=REPO, capture_output=True, text=True, check=True
    )
    seconds, peak_kb, merged = out.stdout.split()
    # a trajectory of shard 0 judged again (a second line for it): that shard is re-read line by line
    with open(folders[0] / "verdicts.jsonl", "a", encoding="utf-8") as fh:
        fh.write(_verdict(0, rng).to_json() + "\n")
    again = subprocess.run(
        [sys.executable, "-c", code, str(root)], cwd=REPO, capture_output=True, text=True, check=True
    )
    reread_seconds, reread_kb, _ = again.stdout.split()
    return {
        "lines": lines,
        "merged": int(merged),
        "shards": shards,
        "seconds": float(seconds),
        "seconds_one_shard_reread": float(reread_seconds),
        "peak_rss_mb_one_shard_reread": int(reread_kb) / 1024,
        "verdict_bytes": size,
        "peak_rss_mb": int(peak_kb) / 1024,
        "idle_rss_mb": idle / 1024,
    }


def rows_of(data: dict) -> Rows:
    sh, pool, merge = data["shards"], data["pool"], data["merge"]
    compared = [
        (
            f"judge --shard I/{n}: {n} processes vs 1, wall time of the whole input",
            f"{sh['speedup'][str(n)]:.2f}×",
            f"{sh['seconds'][str(n)]:.1f} vs {sh['seconds']['1']:.1f} s; fake judge+scorer answering in "
            f"{sh['latency_s']} s, {sh['concurrency_per_process']} trajectories in flight per process, "
            f"{data['cpus']} CPUs"
            + (
                f"; the 4 hash shards hold {'/'.join(map(str, sh['owned_by_4_shards']))} trajectories, "
                f"so {sh['bound_4']:.2f}× is the most 4 can give"
                if n == 4
                else ""
            ),
        )
        for n in (2, 4)
    ]
    compared.append(
        (
            "scorer pool of 2 endpoints vs 1, wall time",
            f"{pool['speedup']:.2f}×",
            f"{pool['seconds']['2']:.1f} vs {pool['seconds']['1']:.1f} s; each endpoint answers "
            f"{pool['slots_per_endpoint']} requests at once in {pool['latency_s']} s",
        )
    )
    compared.append(
        (
            f"keyshot merge of {merge['lines']:,} verdicts (27 screenshots each) in {merge['shards']} shards",
            f"{merge['seconds']:.1f} s",
            f"{merge['verdict_bytes'] / 2**20:,.0f} MiB of verdicts; peak RSS {merge['peak_rss_mb']:.0f} MiB "
            f"(the bare process {merge['idle_rss_mb']:.0f} MiB); with one shard re-read line by line "
            f"{merge['seconds_one_shard_reread']:.1f} s, {merge['peak_rss_mb_one_shard_reread']:.0f} MiB",
        )
    )
    headline = Headline(
        "Judging one input in 4 shard processes (`keyshot judge --shard I/4`) / in 1, wall time",
        f"{sh['speedup']['4']:.2f}× (the hash shards allow {sh['bound_4']:.2f}×)",
    )
    return Rows((ratio_table(compared),), (headline,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=512)
    ap.add_argument("--screenshots", type=int, default=2)
    ap.add_argument("--latency", type=float, default=0.15, help="seconds per fake answer")
    ap.add_argument("--concurrency", type=int, default=2, help="trajectories in flight per shard process")
    ap.add_argument(
        "--endpoint-slots", type=int, default=2, help="requests one scorer endpoint takes at once"
    )
    ap.add_argument("--merge-lines", type=int, default=100_000)
    record.json_option(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="keyshot-scale-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = [
            str(
                synthetic_trajectories(tmp / "in", args.trajectories, args.screenshots, seed=3, size=(96, 64))
            )
        ]
        result = {
            "settings": vars(args) | {"json": None},
            "shards": bench_shards(tmp, inputs, args.latency, args.concurrency),
            "pool": bench_pool(tmp, inputs, args.latency, args.endpoint_slots),
            "merge": bench_merge(tmp, args.merge_lines),
            "cpus": os.cpu_count(),
        }
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    raise SystemExit(main())
