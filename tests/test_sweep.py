"""``keyshot sweep`` over the bundled real records: every screenshot score reused (no scorer or key-point
call sent), one outcome call per trajectory per δ asked of a local OpenAI-compatible server, each outcome
request paid once."""

from __future__ import annotations

import argparse
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest

from keyshot.infer.judge.sweep import COMMAND, SweepError, delta_folder, parse_deltas
from keyshot.infer.loaders.judge_records import recorded_actions
from keyshot.infer.protocol.verdicts import read_verdicts, select_kept
from keyshot.infer.runs.run_record import read_protocol
from keyshot.infer.runs.verdict_sources import read_reference_records
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge

FIXTURES = Path(__file__).parent / "fixtures"
RECORDS = FIXTURES / "arb_records"
O4_MINI = RECORDS / "webjudge_o4_mini"


def keyshot(argv: list[str]) -> int:
    """``keyshot sweep ARGV`` through the command's own arguments and run."""
    assert argv[0] == "sweep"
    parser = argparse.ArgumentParser(prog="keyshot sweep")
    COMMAND.arguments(parser)
    return COMMAND.run(parser.parse_intermixed_args(argv[1:]))


class Recording:
    """The fake judge, counting the WebJudge step of every request it answers."""

    def __init__(self) -> None:
        self.judge = make_judge("task_hash")
        self.steps: Counter = Counter()

    def __call__(self, request: dict) -> str:
        self.steps[identify_step(request)] += 1
        return self.judge(request)


def _overrides(server: FakeOpenAI) -> list[str]:
    return [
        f"judge.base_url={server.base_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        "judge.backoff_base_s=0.01",
        "judge.timeout_s=10",
        "pipeline.outcome_logprobs=2",
    ]


def _kept_sets(deltas: list[int]) -> dict[str, set[tuple[int, ...]]]:
    """Per trajectory, the distinct kept sets over ``deltas``: the outcome requests that differ."""
    out: dict[str, set] = {}
    for v in read_reference_records(O4_MINI):
        out[v.task_id] = {tuple(select_kept(v.screenshots, d, mode="strict")) for d in deltas}
    return out


def test_sweep_of_released_records_reuses_every_score(tmp_path, capsys):
    records = read_reference_records(O4_MINI)
    assert len(records) == 3 and all(
        recorded_actions(json.loads(Path(v.source).read_text())) for v in records
    )
    scored = sum(s.score is not None for v in records for s in v.screenshots)
    recording = Recording()
    out = tmp_path / "sweep"
    with FakeOpenAI(recording) as server:
        rc = keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)])
        served = server.stats.completions_served
    assert rc == 0, capsys.readouterr()
    # only outcome calls reached the judge: no scorer call, no key points
    assert set(recording.steps) == {"outcome"}
    distinct = sum(len(s) for s in _kept_sets([2, 3, 4]).values())
    assert recording.steps["outcome"] == served == distinct == 4  # 9 asked, identical requests paid once
    result = json.loads((out / "sweep.json").read_text())
    totals = result["totals"]
    assert (totals["scorer_calls_sent"], totals["key_point_calls_sent"]) == (0, 0)
    assert totals["outcome_calls_sent"] == 4 and totals["outcome_calls_cached"] == 5
    for row, delta in zip(result["per_delta"], (2, 3, 4), strict=True):
        assert row["delta"] == delta and row["trajectories"] == 3
        assert row["outcome_calls"] == 3  # exactly one outcome call per trajectory per δ
        assert row["key_point_calls_reused"] == 3 and row["screenshot_scores_reused"] == scored
        assert row["calls_saved"] == 3 + scored + row["outcome_cached"]
        folder = delta_folder(out, delta)
        protocol = read_protocol(folder)
        assert protocol["threshold"] == delta and protocol["swept_from"] == str(O4_MINI)
        assert protocol["outcome_images"] == "none"  # released records hold no pixels of unkept shots
        verdicts = read_verdicts(folder / "verdicts.jsonl")
        assert len(verdicts) == 3
        for v in verdicts:
            assert len(v.outcome_calls) == 1 and v.usage["judge"].calls == 1
            assert v.usage["scorer"].calls == 0 and v.key_points
            assert v.kept == select_kept(v.screenshots, delta, mode="strict")
            assert v.config["threshold"] == delta and v.p_success is not None
            assert v.success is not None
    printed = capsys.readouterr().out
    assert "Sent: 4 outcome calls, 0 scorer calls, 0 key-point calls" in printed

    # a second run asks nothing: every δ folder is finished
    with FakeOpenAI(recording) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
        assert server.stats.requests == 0
    again = json.loads((out / "sweep.json").read_text())
    assert [r["already"] for r in again["per_delta"]] == [3, 3, 3]


def test_sweep_refuses_records_of_several_judges(tmp_path):
    with FakeOpenAI(make_judge()) as server:
        with pytest.raises(SweepError, match="7 records of 3 trajectories, by 3 judges"):
            keyshot(
                ["sweep", str(RECORDS), "--out", str(tmp_path / "s"), "--no-progress", *_overrides(server)]
            )
        assert server.stats.requests == 0


def test_a_record_without_action_history_is_counted(tmp_path):
    folder = tmp_path / "records"
    shutil.copytree(RECORDS / "webjudge_7B", folder)
    one = next(folder.rglob("webarena.427.json"))
    record = json.loads(one.read_text())
    record["input_text"] = "no history here"
    one.write_text(json.dumps(record))
    with FakeOpenAI(make_judge()) as server:
        rc = keyshot(
            [
                "sweep",
                str(folder),
                "--out",
                str(tmp_path / "s"),
                "--deltas",
                "3",
                "--no-progress",
                *_overrides(server),
            ]
        )
    assert rc == 0
    result = json.loads((tmp_path / "s" / "sweep.json").read_text())
    assert result["not_swept"] == {"trajectory not readable": 1}
    assert result["per_delta"][0]["trajectories"] == 1


def test_deltas_are_checked():
    assert parse_deltas("2,3,4") == [2, 3, 4]
    for bad in ("0,3", "3,3", "two", ""):
        with pytest.raises(SweepError, match="--deltas"):
            parse_deltas(bad)
