"""Fault-injection harness: what faults cost ``keyshot judge`` and ``keyshot synth`` (docs/reliability.md).

Every scenario runs the real command (a subprocess) over the same synthetic world against local fake
OpenAI servers that inject faults, then once more against healthy servers (the user's "re-run the same
command"), and compares with a clean run measured in the same process:

* lost: inputs with no record at all after the faulty run;
* duplicated: inputs with more than one finished record;
* wrong: finished records that differ from the clean run (a kept wrong verdict or label);
* incomplete: records marked incomplete (no verdict, retried by the re-run);
* after re-run: records still differing from the clean run;
* repaid: answers the servers gave beyond what the clean run needed (an answered call paid twice);
* time: the faulty run's wall time over the clean run's.

    .venv/bin/python -m bench.faults [--trajectories 30] [--screenshots 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench import record
from bench.record import REPO, Headline, Rows, ratio_table
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge, make_teacher
from keyshot.infer.testing.watch import kill_when, line_count
from keyshot.infer.testing.worlds import synthetic_trajectories

FAST_RETRY = ["backoff_base_s=0.02", "backoff_max_s=0.2", "timeout_s=1.0"]


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass
class Outcome:
    scenario: str
    tool: str
    exit_codes: list[int]
    lost: int
    duplicated: int
    wrong: int
    incomplete: int
    wrong_after_rerun: int
    lost_after_rerun: int
    repaid: int
    time_ratio: float
    requests: int
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------- judge
def judge_command(world: Path, out: Path, judge_url: str, scorer_url: str) -> list[str]:
    argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", str(world), "--no-progress"]
    argv += ["--config", str(REPO / "configs/judge/webjudge7b.yaml"), f"out={out}", "scorer.logprobs=null"]
    argv += [
        f"judge.base_url={judge_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        "concurrency=4",
    ]
    argv += [f"scorer.endpoint.base_url={scorer_url}", "scorer.endpoint.model=fake-scorer"]
    argv += [f"judge.{o}" for o in FAST_RETRY] + [f"scorer.endpoint.{o}" for o in FAST_RETRY]
    return argv


def verdict_table(out: Path) -> tuple[dict[str, tuple], int]:
    """task id → outcome of its latest finished verdict; and how many tasks have >1 finished line."""
    finished: dict[str, list[tuple]] = {}
    seen = set()
    for v in read_verdicts(out / "verdicts.jsonl"):
        seen.add(v.task_id)
        if v.finished:
            finished.setdefault(v.task_id, []).append(
                (v.success, tuple(v.kept), tuple(s.score for s in v.screenshots))
            )
    return {k: vals[-1] for k, vals in finished.items()} | {k: None for k in seen - set(finished)}, sum(
        len(v) > 1 for v in finished.values()
    )


def run_judge_scenario(
    name: str,
    world: Path,
    work: Path,
    clean: dict,
    faults: dict,
    *,
    kills: int = 0,
    timeout_sleep_s: float = 5.0,
) -> Outcome:
    out = work / slug(name)
    codes = []
    with (
        FakeOpenAI(
            make_judge(),
            faults=FaultPlan(dict(faults), seed=7) if faults else None,
            timeout_sleep_s=timeout_sleep_s,
        ) as judge,
        FakeOpenAI(
            make_judge(),
            faults=FaultPlan(dict(faults), seed=8) if faults else None,
            timeout_sleep_s=timeout_sleep_s,
        ) as scorer,
    ):
        started = time.perf_counter()
        verdicts = out / "verdicts.jsonl"
        for _ in range(kills):
            proc = subprocess.Popen(
                judge_command(world, out, judge.base_url, scorer.base_url),
                cwd=REPO,
                stderr=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
            target = line_count(verdicts) + 3
            kill_when(
                proc, lambda n=target: line_count(verdicts) >= n, f"{target} verdicts were written", 600
            )
            codes.append(proc.returncode)
        proc = subprocess.run(
            judge_command(world, out, judge.base_url, scorer.base_url),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        codes.append(proc.returncode)
        elapsed = time.perf_counter() - started
        served = judge.settled_stats().completions_served + scorer.settled_stats().completions_served
        requests = judge.stats.requests + scorer.stats.requests
    table, duplicated = verdict_table(out)
    lost = clean["n"] - len(table)
    incomplete = sum(v is None for v in table.values())
    wrong = sum(v is not None and v != clean["table"][k] for k, v in table.items())
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        proc = subprocess.run(
            judge_command(world, out, judge.base_url, scorer.base_url),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        codes.append(proc.returncode)
        served += judge.settled_stats().completions_served + scorer.settled_stats().completions_served
    after, _ = verdict_table(out)
    return Outcome(
        scenario=name,
        tool="judge",
        exit_codes=codes,
        lost=lost,
        duplicated=duplicated,
        wrong=wrong,
        incomplete=incomplete,
        wrong_after_rerun=sum(after.get(k) != v for k, v in clean["table"].items()),
        lost_after_rerun=clean["n"] - len(after),
        repaid=served - clean["served"],
        time_ratio=elapsed / clean["seconds"],
        requests=requests,
    )


def clean_judge(world: Path, work: Path) -> dict:
    out = work / "clean"
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        started = time.perf_counter()
        proc = subprocess.run(
            judge_command(world, out, judge.base_url, scorer.base_url),
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
        served = judge.settled_stats().completions_served + scorer.settled_stats().completions_served
    if proc.returncode != 0:
        raise SystemExit(f"clean judge run failed: {proc.stderr[-2000:]}")
    table, _ = verdict_table(out)
    return {"table": table, "n": len(table), "served": served, "seconds": seconds}


def dead_endpoint_judge(world: Path, work: Path) -> Outcome:
    """An endpoint that fails every request, with keyshot's shipped retry settings."""
    out = work / "dead"
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        argv = [
            a
            for a in judge_command(world, out, judge.base_url, scorer.base_url)
            if not a.startswith("judge.backoff") and a != "judge.timeout_s=1.0"
        ]
        started = time.perf_counter()
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        requests = judge.stats.requests
    line = [ln for ln in proc.stderr.splitlines() if "is down" in ln][-1:]
    return Outcome(
        "endpoint fails every request (shipped retry settings)",
        "judge",
        [proc.returncode],
        0,
        0,
        0,
        0,
        0,
        0,
        0,
        elapsed,
        requests,
        notes=[f"stopped after {requests} requests in {elapsed:.1f} s", *line],
    )


# ---------------------------------------------------------------------------- synth
def synth_config(path: Path, run: Path, world: Path, url: str, judge_url: str) -> Path:
    import yaml

    def endpoint(name: str, base: str) -> dict:
        return {
            "name": name,
            "base_url": base,
            "model": f"fake-{name}",
            "api_key_env": None,
            "max_retries": 2,
            "max_concurrency": 4,
            "backoff_base_s": 0.02,
            "backoff_max_s": 0.2,
            "timeout_s": 1.0,
        }

    data = {
        "run_dir": str(run),
        "teachers": {
            "key_points_judge": {"endpoint": endpoint("judge", judge_url), "image_tokens": "qwen"},
            "teachers": [
                {"endpoint": endpoint("teacher", url), "image_tokens": "qwen", "est_output_tokens": 50}
            ],
        },
        "sources": [{"path": str(world), "agent": "synthetic-agent"}],
        "build": {"splits": {"agents": {"train": ["synthetic-agent"]}}},
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def label_table(run: Path) -> dict[tuple, int | None]:
    contents = read_store(run / LABELS_FILE)
    return {(uid, step): (lb.score if lb.valid else None) for (uid, step, _), lb in contents.labels.items()}


def run_synth(
    name: str, world: Path, work: Path, faults: dict, *, kills: int = 0, clean: dict | None = None
) -> tuple[dict, Outcome | None]:
    run = work / f"synth-{name}"
    codes = []
    with (
        FakeOpenAI(
            make_teacher("brightness"),
            faults=FaultPlan(dict(faults), seed=3) if faults else None,
            timeout_sleep_s=5.0,
        ) as teacher,
        FakeOpenAI(make_judge()) as judge,
    ):
        cfg = synth_config(work / f"synth-{slug(name)}.yaml", run, world, teacher.base_url, judge.base_url)
        argv = [sys.executable, "-m", "keyshot.infer.cli", "synth", "run", "--config", str(cfg), "--no-build"]
        started = time.perf_counter()
        labels = run / LABELS_FILE
        for _ in range(kills):
            proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            target = line_count(labels) + 15
            kill_when(
                proc, lambda n=target: line_count(labels) >= n, f"{target} label lines were written", 600
            )
            codes.append(proc.returncode)
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True)
        codes.append(proc.returncode)
        seconds = time.perf_counter() - started
        served = teacher.settled_stats().completions_served + judge.settled_stats().completions_served
        requests = teacher.stats.requests
    table = label_table(run)
    if clean is None:
        return {"table": table, "served": served, "seconds": seconds, "n": len(table)}, None
    wrong = sum(v is not None and v != clean["table"].get(k) for k, v in table.items())
    incomplete = sum(v is None for v in table.values())
    with FakeOpenAI(make_teacher("brightness")) as teacher, FakeOpenAI(make_judge()) as judge:
        cfg = synth_config(work / f"synth-{slug(name)}.yaml", run, world, teacher.base_url, judge.base_url)
        proc = subprocess.run(
            [sys.executable, "-m", "keyshot.infer.cli", "synth", "run", "--config", str(cfg), "--no-build"],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        codes.append(proc.returncode)
        served += teacher.settled_stats().completions_served + judge.settled_stats().completions_served
    after = label_table(run)
    return {}, Outcome(
        scenario=name,
        tool="synth",
        exit_codes=codes,
        lost=clean["n"] - len(table),
        duplicated=0,  # the label store keeps one record per (trajectory, step, teacher) by construction
        wrong=wrong,
        incomplete=incomplete,
        wrong_after_rerun=sum(after.get(k) != v for k, v in clean["table"].items()),
        lost_after_rerun=clean["n"] - len(after),
        repaid=served - clean["served"],
        time_ratio=seconds / clean["seconds"],
        requests=requests,
    )


# ---------------------------------------------------------------------------- report
def table(outcomes: list[Outcome]) -> str:
    lines = [
        "| tool | scenario | exit codes (faulty runs, re-run) | lost | duplicated | wrong kept | incomplete "
        "| wrong after re-run | repaid calls | time vs clean |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for o in outcomes:
        lines.append(
            f"| {o.tool} | {o.scenario} | {' '.join(map(str, o.exit_codes))} | {o.lost} | {o.duplicated} | {o.wrong} "
            f"| {o.incomplete} | {o.wrong_after_rerun + o.lost_after_rerun} | {o.repaid} | {o.time_ratio:.2f}× |"
        )
    for o in outcomes:
        for note in o.notes:
            lines.append(f"\n{o.tool}, {o.scenario}: {note}")
    return "\n".join(lines)


SCENARIOS = {
    "20% faults (500/429/disconnect)": {"500": 0.08, "429": 0.06, "disconnect": 0.06},
    "50% faults (500/429/disconnect)": {"500": 0.2, "429": 0.15, "disconnect": 0.15},
    "20% malformed or truncated bodies": {"malformed": 0.2},
    "10% hangs past the timeout": {"timeout": 0.1},
}


def rows_of(data: dict) -> Rows:
    rows, bad = [], 0
    for o in data["outcomes"]:
        wrong = o["lost"] + o["duplicated"] + o["wrong"] + o["wrong_after_rerun"] + o["lost_after_rerun"]
        bad += wrong
        rows.append(
            (
                f"{o['tool']}: {o['scenario']}: wall time vs a clean run",
                f"{o['time_ratio']:.2f}×",
                f"lost/duplicated/wrong {wrong}, incomplete {o['incomplete']}, repaid calls {o['repaid']}, "
                f"exit codes {' '.join(map(str, o['exit_codes']))}",
            )
        )
    headline = Headline(
        f"Records lost, duplicated or wrong in {len(data['outcomes'])} fault scenarios of `keyshot judge` and "
        "`keyshot synth` (500/429/disconnects, malformed bodies, hangs, kill -9, a dead endpoint)",
        str(bad),
    )
    return Rows((ratio_table(rows),), (headline,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trajectories", type=int, default=30)
    ap.add_argument("--screenshots", type=int, default=4)
    record.json_option(ap)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="keyshot-faults-") as tmp:
        work = Path(tmp)
        world = synthetic_trajectories(work / "world", args.trajectories, args.screenshots, seed=11)
        clean = clean_judge(world, work)
        print(
            f"[faults] clean judge run: {clean['n']} trajectories, {clean['served']} answers, {clean['seconds']:.1f} s",
            flush=True,
        )
        for name, faults in SCENARIOS.items():
            outcomes.append(run_judge_scenario(name, world, work, clean, faults))
            print(f"[faults] judge, {name}: {outcomes[-1]}", flush=True)
        outcomes.append(run_judge_scenario("kill -9 three times mid-run", world, work, clean, {}, kills=3))
        outcomes.append(dead_endpoint_judge(world, work))
        print("[faults] judge scenarios done", flush=True)
        clean_synth, _ = run_synth("clean", world, work, {})
        for name in ("50% faults (500/429/disconnect)", "20% malformed or truncated bodies"):
            outcomes.append(run_synth(name, world, work, SCENARIOS[name], clean=clean_synth)[1])
        outcomes.append(
            run_synth("kill -9 three times mid-run", world, work, {}, kills=3, clean=clean_synth)[1]
        )
    report = table(outcomes)
    print(report)
    bad = [
        o for o in outcomes if o.lost or o.duplicated or o.wrong or o.wrong_after_rerun or o.lost_after_rerun
    ]
    data = {"outcomes": [asdict(o) for o in outcomes], "settings": vars(args) | {"json": str(args.json)}}
    return record.finish(args.json, data, rows_of, __spec__.name, argv, 1 if bad else 0)


if __name__ == "__main__":
    sys.exit(main())
