"""Judging on Ray Data (docs/scaling.md): ``keyshot judge --engine ray`` on a local cluster of two nodes
against one process, and against Ray Data's own ``HttpRequestProcessorConfig`` on the same requests.

Every endpoint is one fake OpenAI server (a process of its own) whose every answer takes ``--latency``
seconds (0.5: a remote judge API's pace). The cluster is two nodes on this machine (``ray start --head``,
then ``ray start --address``; one CPU each, token authentication on), started once; its start-up and a run's
time to its first trajectory are rows of their own. A run's judging time is the span of its verdicts'
timings (first trajectory started to last one done), the same measure for both engines.

* one process: ``keyshot judge`` with ``--concurrency`` trajectories in flight and each endpoint's
  ``max_concurrency`` (the one-process cap);
* ``--engine ray``, the same total cap (trajectories shared out over the two actors, each endpoint's
  requests held over the cluster by its gate);
* ``--engine ray``, each node the one-process cap (``--ray-per-actor``, each actor its own endpoint caps);
* Ray Data's ``HttpRequestProcessorConfig`` at its defaults (``batch_size`` 64, one actor), sending the
  requests the one-process run sent (recorded by an in-process fake first), ``--http-requests`` of them;
  its time is from the first row prepared to the last answer back.

    .venv/bin/python -m bench.ray_engine [--trajectories 34] [--screenshots 9] [--latency 0.5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from bench.record import REPO, Headline, Rows, ratio_table
from keyshot.infer.engines.ray_cluster import LocalCluster, use_token
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, spawn_fake_openai
from keyshot.infer.testing.worlds import synthetic_trajectories


def _config(tmp: Path, url: str, args) -> Path:
    scorer = {
        "endpoint": {
            "base_url": url,
            "model": "webjudge-7b",
            "api_key_env": None,
            "max_concurrency": args.scorer_slots,
        }
    }
    judge = {"max_concurrency": args.judge_slots}
    return fake_judge_config(tmp / "judge.yaml", url, scorer, concurrency=args.concurrency, judge=judge)


def _judge(inputs: str, cfg: Path, out: Path, extra: list[str], env: dict | None = None) -> dict:
    """One ``keyshot judge`` process; its judging span, time to its first trajectory and request count."""
    argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", inputs, "--config", str(cfg)]
    argv += ["--out", str(out), "--no-progress", *extra]
    launched = time.time()
    proc = subprocess.run(
        argv, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"keyshot judge {' '.join(extra)} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    verdicts = read_verdicts(out / "verdicts.jsonl")
    starts = [v.timing["started"] for v in verdicts]
    ends = [v.timing["started"] + v.timing["total_s"] for v in verdicts]
    summary = json.loads((out / "summary.json").read_text())["run"]
    requests = sum(u["requests"] for u in summary["ledger"].values())
    span = max(ends) - min(starts)
    return {
        "seconds": span,
        "to_first_trajectory_s": min(starts) - launched,
        "wall_s": time.time() - launched,
        "requests": requests,
        "requests_per_s": requests / span,
        "finished": sum(v.finished for v in verdicts),
        "engine": summary.get("engine"),
    }


def recorded_requests(inputs: str, tmp: Path, args) -> list[dict]:
    """The requests a one-process run sends (an in-process fake answering at once records them)."""
    (tmp / "record").mkdir()
    with FakeOpenAI() as server:
        cfg = _config(tmp / "record", server.base_url, args)
        _judge(inputs, cfg, tmp / "record" / "out", [])
        return list(server.requests)


def ray_http_processor(cluster, url: str, requests: list[dict]) -> dict:
    """Ray Data's HttpRequestProcessorConfig at its defaults over ``requests``."""
    import ray
    from ray.data.llm import HttpRequestProcessorConfig, build_processor

    use_token(cluster.env)
    ray.init(address=cluster.address, logging_level="WARNING", log_to_driver=False)
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        config = HttpRequestProcessorConfig(url=f"{url}/chat/completions")
        processor = build_processor(
            config,
            preprocess=lambda row: {"payload": json.loads(row["body"]), "prepared": time.time()},
            postprocess=lambda row: {
                "prepared": row["prepared"],
                "answered": time.time(),
                "ok": bool(row["http_response"].get("choices")),
            },
        )
        ds = ray.data.from_items([{"body": json.dumps(r)} for r in requests])
        t0 = time.perf_counter()
        rows = processor(ds).take_all()
        wall = time.perf_counter() - t0
    finally:
        ray.shutdown()
    span = max(r["answered"] for r in rows) - min(r["prepared"] for r in rows)
    return {
        "requests": len(rows),
        "answered": sum(r["ok"] for r in rows),
        "seconds": span,
        "wall_s": wall,
        "requests_per_s": len(rows) / span,
        "defaults": {"batch_size": config.batch_size, "concurrency": config.concurrency},
    }


def rows_of(data: dict) -> Rows:
    one, same, each, http = data["one"], data["ray_same_cap"], data["ray_node_cap"], data["ray_http"]
    s = data["settings"]
    load = (
        f"{s['trajectories']} trajectories of {s['screenshots']} screenshots ({one['requests']} requests), "
        f"answers in {s['latency']} s"
    )
    cap = f"{s['concurrency']} trajectories, judge {s['judge_slots']} and scorer {s['scorer_slots']} requests"
    compared = [
        (
            "--engine ray (2 nodes) / one process, the same total in-flight cap",
            f"{one['seconds'] / same['seconds']:.2f}×",
            f"{same['seconds']:.1f} vs {one['seconds']:.1f} s judging; {load}; in flight at most {cap} "
            f"in all over {same['engine']['actors']} actors (the trajectories shared out, each endpoint's "
            f"requests lent by the cluster's gate)",
        ),
        (
            "--engine ray (2 nodes), each node the one-process cap / one process",
            f"{one['seconds'] / each['seconds']:.2f}×",
            f"{each['seconds']:.1f} vs {one['seconds']:.1f} s judging; each actor at most {cap}",
        ),
        (
            "--engine ray / Ray Data's HttpRequestProcessorConfig at its defaults, requests per second",
            f"{each['requests_per_s'] / http['requests_per_s']:.2f}×",
            f"{each['requests_per_s']:.1f} vs {http['requests_per_s']:.1f} requests/s; Ray's processor "
            f"(batch_size {http['defaults']['batch_size']}, concurrency {http['defaults']['concurrency']}) "
            f"sent {http['requests']} of the one-process run's requests ({http['answered']} answered) in "
            f"{http['seconds']:.1f} s; same-cap --engine ray: {same['requests_per_s']:.1f}/s",
        ),
        (
            "Ray start-up (its own row): two local nodes up; a run's launch to its first trajectory",
            f"{data['cluster_start_s']:.1f} s",
            f"--engine ray {same['to_first_trajectory_s']:.1f} s (connect {same['engine']['start_s']:.1f} s, "
            f"then the actors) vs one process {one['to_first_trajectory_s']:.1f} s; not in the judging times "
            f"above",
        ),
    ]
    headline = Headline(
        "keyshot judge --engine ray / Ray Data's own HttpRequestProcessorConfig, requests/s (2 local nodes)",
        f"{each['requests_per_s'] / http['requests_per_s']:.1f}×",
    )
    note = (
        f"{data['cpus']} CPUs; every run's verdicts: one process {one['finished']}, ray {same['finished']} "
        f"and {each['finished']} finished of {s['trajectories']}."
    )
    return Rows((ratio_table(compared),), (headline,), (note,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=34)
    ap.add_argument("--screenshots", type=int, default=9)
    ap.add_argument("--latency", type=float, default=0.5, help="seconds per fake answer")
    ap.add_argument("--concurrency", type=int, default=4, help="trajectories in flight (one process)")
    ap.add_argument("--judge-slots", type=int, default=4, help="judge requests in flight (one process)")
    ap.add_argument("--scorer-slots", type=int, default=16, help="scorer requests in flight (one process)")
    ap.add_argument(
        "--http-requests", type=int, default=120, help="requests Ray's HTTP processor sends (0: all)"
    )
    record.json_option(ap)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="keyshot-ray-") as tmp_name:
        tmp = Path(tmp_name)
        inputs = str(
            synthetic_trajectories(tmp / "in", args.trajectories, args.screenshots, seed=3, size=(96, 64))
        )
        requests = recorded_requests(inputs, tmp, args)
        with spawn_fake_openai("judge", latency_s=args.latency) as (url, _):
            cfg = _config(tmp, url, args)
            one = _judge(inputs, cfg, tmp / "one", [])
            with LocalCluster(nodes=2, cpus=1) as cluster:
                on = ["--engine", "ray", "--ray-address", cluster.address]
                same = _judge(inputs, cfg, tmp / "same", on, cluster.env)
                each = _judge(
                    inputs, cfg, tmp / "each", [*on, "--ray-per-actor", str(args.concurrency)], cluster.env
                )
                http = ray_http_processor(cluster, url, requests[: args.http_requests or None])
                start_s = cluster.started_s
        result = {
            "settings": vars(args) | {"json": None},
            "one": one,
            "ray_same_cap": same,
            "ray_node_cap": each,
            "ray_http": http,
            "cluster_start_s": start_s,
            "cpus": os.cpu_count(),
        }
    return record.finish(args.json, result, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    raise SystemExit(main())
