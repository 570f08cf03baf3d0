"""Rewards per step (issue 64): what ``pipeline.step_rewards`` costs in judge calls, and what it gives a
GRPO trainer.

* calls: trajectories of 5 and of 40 screenshots, each of its own task (no key-point call shared), judged
  with step rewards off (the baseline, 2 judge calls in ``cot`` mode) and on: the step question is one call
  more whatever the length (target: at most 3), and none more in ``key_point`` mode.
* groups: TASKS x GROUP rollouts, as GRPO makes them, rewarded with ``reward.value`` binary and
  step_progress on the same rollouts (the fake judge needs 1-3 key screenshots for a success and places key
  point k at the k-th screenshot scored >= 3): the share of groups whose rewards are all equal (zero
  variance: zero advantage, no gradient).

Fake judge and scorer (keyshot.infer.testing.fake_openai) in this process.

    .venv/bin/python -m bench.steps [--quick] [--json runs/bench/steps.json]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench import record
from bench.record import Headline, Rows, ratio_table
from bench.reward import paid, rollouts, write_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.reward import RewardModel

MOST_CALLS = 3  # judge calls per trajectory with step rewards: the bound
#: the rewards compared on the same rollouts: (name, reward.value, reward.step_outcome_weight)
VALUES = (("binary", "binary", 0.0), ("step_progress", "step_progress", 0.0), ("mixed", "step_progress", 0.5))


def judged(work: Path, batch: list[dict], name: str, value: str = "binary", **overrides) -> list:
    """``batch`` rewarded by a fresh model (its own cache) on fresh fake servers."""
    with FakeOpenAI(make_judge("evidence")) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(work / f"{name}.yaml", judge.base_url, scorer.base_url, 8)
        rm = RewardModel.from_config(config, value=value, allow_root=str(work), **overrides)
        try:
            return rm.score_sync(batch)
        finally:
            rm.close()


def bench_calls(args, work: Path) -> dict:
    out: dict = {}
    for steps in args.steps:
        batch = rollouts(work / f"calls-{steps}", args.trajectories, 1, steps)
        row: dict = {"trajectories": len(batch)}
        for mode in ("cot", "key_point"):
            for on in (False, True):
                results = judged(
                    work,
                    batch,
                    f"calls-{steps}-{mode}-{on}",
                    pipeline__outcome_mode=mode,
                    pipeline__step_rewards=on,
                )
                key = f"{mode}_{'on' if on else 'off'}"
                row[key] = paid(results) / len(batch)
                row[f"{key}_failed"] = sum(r.error is not None for r in results)
                if on:
                    row[f"{key}_steps_read"] = sum(r.step_rewards is not None for r in results)
        out[str(steps)] = row
    return out


def bench_groups(args, work: Path, screenshots: int) -> dict:
    batch = rollouts(work / f"groups-{screenshots}", args.tasks, args.group, screenshots)
    out: dict = {"rollouts": len(batch), "group": args.group, "screenshots": screenshots}
    for name, value, weight in VALUES:
        results = judged(
            work,
            batch,
            f"groups-{screenshots}-{name}",
            value,
            pipeline__step_rewards=True,
            step_outcome_weight=weight,
        )
        rewards = [r.reward for r in results]
        groups = [rewards[g * args.group : (g + 1) * args.group] for g in range(args.tasks)]
        out[name] = {
            "zero_variance_groups": sum(len(set(g)) == 1 for g in groups) / len(groups),
            "failed": sum(r is None for r in rewards),
        }
    return out


def rows_of(report: dict) -> Rows:
    c = report["calls"]
    calls = [
        (
            f"judge calls per trajectory of {steps} screenshots, cot: step rewards on / off",
            f"{row['cot_on']:.2f} / {row['cot_off']:.2f}",
            f"{row['trajectories']} trajectories, steps read for {row['cot_on_steps_read']}; key_point mode on / off: "
            f"{row['key_point_on']:.2f} / {row['key_point_off']:.2f} (the steps come with the key points' calls); "
            f"target ≤ {MOST_CALLS}",
        )
        for steps, row in c.items()
    ]
    groups = [
        (
            f"GRPO groups of {g['group']} with zero reward variance, the same {g['rollouts']} rollouts of "
            f"{g['screenshots']} screenshots: step_progress / mixed with the verdict (w = 0.5) / binary",
            " / ".join(f"{g[k]['zero_variance_groups']:.0%}" for k in ("step_progress", "mixed", "binary")),
            "lower is better: rollouts whose verdicts are equal may differ in the key points they met",
        )
        for g in report["groups"]
    ]
    note = (
        "The fake judge places key point k at the k-th screenshot scored >= 3 (the synthetic pages' scores are "
        "uniform, so 3 in 5 are) and wants 1-3 such screenshots for a success: the longer the rollouts, the more "
        "of them meet every key point, and the fewer groups step progress tells apart. What a real judge gives is "
        "not measured here."
    )
    most = max(row["cot_on"] for row in c.values())
    headline = Headline(
        "Rewards per step: judge calls per trajectory at " + " and ".join(f"{s} steps" for s in c),
        " / ".join(f"{row['cot_on']:.2f}" for row in c.values()) + f" (≤ {MOST_CALLS}; {most:.2f} at most)",
    )
    return Rows((ratio_table([*calls, *groups]),), (headline,), (note,))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 40], help="screenshots per trajectory")
    ap.add_argument("--trajectories", type=int, default=8, help="trajectories per length")
    ap.add_argument("--tasks", type=int, default=8, help="tasks of the GRPO comparison")
    ap.add_argument("--group", type=int, default=8, help="rollouts per task there")
    ap.add_argument(
        "--screenshots", type=int, nargs="+", default=[3, 5], help="screenshots per rollout there"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run (tests)")
    record.json_option(ap)
    args = ap.parse_args(argv)
    if args.quick:
        args.trajectories, args.tasks, args.group = 2, 3, 4
    report: dict = {
        "machine": f"{os.cpu_count()} CPU cores",
        "settings": {k: v for k, v in vars(args).items() if k != "json"},
    }
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        work = Path(tmp)
        print(f"[steps] judge calls at {args.steps} screenshots", flush=True)
        report["calls"] = bench_calls(args, work)
        report["groups"] = []
        for screenshots in args.screenshots:
            print(
                f"[steps] {args.tasks}x{args.group} rollouts of {screenshots}: binary vs step_progress",
                flush=True,
            )
            report["groups"].append(bench_groups(args, work, screenshots))
    over = [s for s, row in report["calls"].items() if row["cot_on"] > MOST_CALLS]
    return record.finish(args.json, report, rows_of, __spec__.name, argv, 1 if over else 0)


if __name__ == "__main__":
    raise SystemExit(main())
