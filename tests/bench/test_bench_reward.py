"""bench/reward.py runs (--quick) and its figures point the right way: key points shared across a
group, batching faster than one rollout at a time, no wrong reward under faults, a dead judge said fast;
its rows (the service against one rollout at a time, plotted) are written beside its JSON."""

from __future__ import annotations

import pytest

from bench.record import read

pytest.importorskip("fastapi")


def test_reward_bench_quick(tmp_path):
    from bench.reward import main

    report = main(["--quick", "--json", str(tmp_path / "reward.json")])
    rollouts, episodes, faults = report["rollouts"], report["episodes"], report["faults"]
    group = report["settings"]["group"]
    assert rollouts["failed"] == 0
    assert rollouts["judge_calls_per_rollout"] == pytest.approx(1 + 1 / group)  # key points once per task
    assert rollouts["throughput_ratio"] > 2
    assert episodes["trl_failed"] == 0 and episodes["trl_ratio"] > 1.5 and episodes["openrlhf_ratio"] > 1.5
    assert episodes["trl_judge_calls_per_episode"] < 2 and episodes["openrlhf_judge_calls_per_episode"] < 2
    assert faults["wrong_rewards"] == 0 and faults["none_without_reason"] == 0
    assert faults["down"]["health_status"] == "down" and faults["down"]["failed_request_s"] < 1
    assert faults["down"]["all_none_with_reason"]
    assert report["memory"]["peak_above_baseline_mib"] < 1024
    assert (tmp_path / "reward.json").exists() and "| measure |" in report["table"]
    run = read(tmp_path / "reward.rows.json")
    (headline,) = run.rows.headlines
    assert headline.figure.startswith(f"{rollouts['throughput_ratio']:.1f}×")
    assert [v for _, v in headline.plot.bars] == [
        round(rollouts["naive_s_scaled"]),
        round(rollouts["service_s"]),
    ]
    assert run.command.startswith("python -m bench.reward --quick --json ")
    assert [row[1] for row in run.rows.tables[0].rows][:2] == [
        f"{rollouts['throughput_ratio']:.1f}×",
        f"{episodes['trl_ratio']:.1f}×",
    ]
