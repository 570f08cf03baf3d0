"""``keyshot sweep`` over the bundled real records: every screenshot score reused (no scorer or key-point
call sent), one outcome call per trajectory per δ asked of a local OpenAI-compatible server, each outcome
request paid once."""

from __future__ import annotations

import json
import re
import shutil
import time
from collections import Counter
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.errors import EXIT_BUDGET, EXIT_INCOMPLETE, EXIT_PREFLIGHT
from keyshot.infer.judge.sweep_plan import plan_sweep
from keyshot.infer.judge.sweep_source import SweepError
from keyshot.infer.judge.threshold_sweep import delta_folder, parse_deltas
from keyshot.infer.loaders.judge_records import recorded_actions
from keyshot.infer.protocol.verdicts import read_verdicts, select_kept
from keyshot.infer.runs.run_record import mark_stand_in, read_protocol, stand_in_of
from keyshot.infer.runs.verdict_sources import read_reference_records
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, identify_step, make_judge
from tests.support import paths

FIXTURES = paths.FIXTURES
RECORDS = FIXTURES / "arb_records"
O4_MINI = RECORDS / "webjudge_o4_mini"


def metrics(argv: list[str]) -> int:
    return keyshot(["metrics", *argv])


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


def _scorer_overrides(server: FakeOpenAI) -> list[str]:
    return [
        f"scorer.endpoint.base_url={server.base_url}",
        "scorer.endpoint.model=fake-scorer",
        "scorer.endpoint.api_key_env=null",
    ]


def _judged_run(tmp_path: Path, server: FakeOpenAI, counts: list[int], *extra: str) -> list[str]:
    """Synthetic trajectories judged into tmp_path/run by ``server`` as judge and scorer; the overrides."""
    from keyshot.infer.common.config import load_config
    from keyshot.infer.judge.config import JudgeRunConfig
    from keyshot.infer.judge.run import run_judge
    from keyshot.infer.testing.worlds import synthetic_trajectories

    source = synthetic_trajectories(tmp_path / "traj", len(counts), counts, seed=2, size=(320, 200))
    overrides = [*_overrides(server), *_scorer_overrides(server), *extra]
    config = load_config(JudgeRunConfig, None, [*overrides, f"out={tmp_path / 'run'}"])
    run_judge([str(source)], config, progress=False)
    return overrides


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
    assert (totals["scorer_calls_sent"], totals["key_point_calls_sent"]) == (0, 0)  # from the verdicts
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
    # the plan, read from the records alone, said so before any call
    plan = plan_sweep(O4_MINI, [2, 3, 4])
    assert (
        [r["outcome_requests"] for r in plan] == [r["outcome_sent"] for r in result["per_delta"]] == [3, 1, 0]
    )
    assert [r["kept"] for r in plan] == [r["kept"] for r in result["per_delta"]] == [4, 2, 2]

    # a second run asks nothing: every δ folder is finished
    with FakeOpenAI(recording) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
        assert server.stats.requests == 0
    again = json.loads((out / "sweep.json").read_text())
    assert [r["already"] for r in again["per_delta"]] == [3, 3, 3]


def test_sweep_refuses_records_of_several_judges(tmp_path, capsys):
    with FakeOpenAI(make_judge()) as server:
        rc = keyshot(
            ["sweep", str(RECORDS), "--out", str(tmp_path / "s"), "--no-progress", *_overrides(server)]
        )
        assert server.stats.requests == 0
    assert rc == SweepError.exit_code != 0
    assert "7 records of 3 trajectories, by 3 judges" in capsys.readouterr().err


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


def test_metrics_put_the_deltas_side_by_side(tmp_path, capsys):
    out = tmp_path / "sweep"
    with FakeOpenAI(make_judge("task_hash")) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
    index = RECORDS / "index.csv"
    assert metrics([str(out), "--arb-index", str(index), "--out", str(tmp_path / "m")]) == 0
    data = json.loads((tmp_path / "m" / "delta_comparison.json").read_text())
    assert data["deltas"] == [2, 3, 4]
    overall = {r["delta"]: r for r in data["rows"] if r["scope"] == "overall"}
    for delta in (2, 3, 4):
        verdicts = read_verdicts(delta_folder(out, delta) / "verdicts.jsonl")
        row = overall[delta]
        assert row["verdicts"] == 3 and row["n"] == 2  # one trajectory's label is Unsure
        assert row["kept"] == sum(len(select_kept(v.screenshots, delta, mode="strict")) for v in verdicts)
        assert row["outcome_prompt_tokens"] == sum(v.usage["judge"].prompt_tokens for v in verdicts) > 0
        assert data["dropped"][str(delta)] == {"unsure": 1}
    assert [overall[d]["kept"] for d in (2, 3, 4)] == [4, 2, 2]
    agents = {r["group"] for r in data["rows"] if r["scope"] == "agent"}
    assert len(agents) == 2
    assert (tmp_path / "m" / "delta_comparison.png").read_bytes()[:4] == b"\x89PNG"
    printed = capsys.readouterr().out
    assert "Highest overall agreement" in printed

    # one δ folder alone: its metrics and p_success's calibration, every input counted
    assert metrics([str(delta_folder(out, 3)), "--arb-index", str(index), "--out", str(tmp_path / "m3")]) == 0
    cal = json.loads((tmp_path / "m3" / "calibration.json").read_text())
    assert cal["n_records"] == 3 and cal["n_used"] == 2 and cal["counts"] == {"label Unsure": 1}
    # the released index labels trajectories this δ folder does not hold: counted, not dropped silently
    labels = tmp_path / "labels.csv"
    labels.write_text(
        "task_id,label,agent\n"
        + "".join(
            f"{t},{y},GenericAgent-gpt-4o-2024-11-20\n"
            for t, y in (("webarena.344", 1), ("webarena.427", 0), ("not-judged", 0))
        )
    )
    assert (
        metrics([str(delta_folder(out, 3)), "--human-labels", str(labels), "--out", str(tmp_path / "m4")])
        == 0
    )
    cal = json.loads((tmp_path / "m4" / "calibration.json").read_text())
    # the third trajectory has no label in the file: its record's reward (cum_reward) is its truth
    assert cal["counts"] == {"label for a trajectory not judged": 1} and cal["n_used"] == 3
    assert (tmp_path / "m3" / "reliability.png").is_file() and (tmp_path / "m3" / "pr_curve.png").is_file()


def test_p_success_threshold_decides_and_is_recorded(tmp_path, capsys):
    """pipeline.p_success_threshold (the operating point keyshot metrics chooses): the fake judge's status
    word has probability 0.8, so at 0.9 no verdict is a success, and the protocol records the threshold."""
    out = tmp_path / "sweep"
    with FakeOpenAI(make_judge("always_success")) as server:
        args = [
            "sweep",
            str(O4_MINI),
            "--out",
            str(out),
            "--deltas",
            "3",
            "--no-progress",
            *_overrides(server),
        ]
        assert keyshot([*args, "pipeline.p_success_threshold=0.9"]) == 0
        assert keyshot([*args[:3], str(tmp_path / "plain"), *args[4:]]) == 0
    chosen = read_verdicts(delta_folder(out, 3) / "verdicts.jsonl")
    plain = read_verdicts(delta_folder(tmp_path / "plain", 3) / "verdicts.jsonl")
    assert [v.success for v in plain] == [True] * 3 and [round(v.p_success, 6) for v in plain] == [0.8] * 3
    assert [v.success for v in chosen] == [False] * 3
    assert read_protocol(delta_folder(out, 3))["p_success_threshold"] == 0.9
    assert "p_success_threshold" not in read_protocol(delta_folder(tmp_path / "plain", 3))
    assert keyshot([*args, "pipeline.p_success_threshold=0.9", "pipeline.outcome_logprobs=null"]) != 0
    assert "p_success_threshold needs the outcome call's log-probabilities" in capsys.readouterr().err


def test_report_shows_reliability_and_deltas_beside_the_histogram(tmp_path):
    from keyshot.infer.report import build_report

    out = tmp_path / "sweep"
    with FakeOpenAI(make_judge("task_hash")) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
    folder = delta_folder(out, 3)
    mark_stand_in(folder, "STAND-IN VERDICTS: noise")  # what a sweep of a stand-in run records
    index = build_report(folder, tmp_path / "report", progress=False).read_text()
    plots = re.findall(r'<img src="plots/([a-z]+\.png)"', index)
    assert plots[:3] == ["scores.png", "reliability.png", "deltas.png"]
    assert '<div class="banner">STAND-IN VERDICTS: noise</div>' in index
    for name in plots:
        assert (tmp_path / "report" / "plots" / name).read_bytes()[:4] == b"\x89PNG"
    # a run of no sweep, without p_success, shows the histogram alone
    index = build_report(RECORDS / "webjudge_7B", tmp_path / "plain", progress=False).read_text()
    assert re.findall(r'<img src="plots/([a-z]+\.png)"', index)[:2] == ["scores.png", "agents.png"]


def test_sweep_of_a_keyshot_run_shows_the_kept_screenshots_and_calls_no_scorer(tmp_path):
    """A keyshot run judged with a scorer: the sweep reads its trajectories again (several in one JSONL
    file), shows the judge the kept screenshots as the run did, and asks the scorer nothing."""
    from keyshot.infer.common.config import load_config
    from keyshot.infer.judge.command import run_judge
    from keyshot.infer.judge.config import JudgeRunConfig
    from keyshot.infer.testing.fake_openai import user_parts
    from keyshot.infer.testing.worlds import synthetic_trajectories

    source = synthetic_trajectories(tmp_path / "traj", 4, [3, 5, 2, 6], seed=2, size=(320, 200))
    images_seen: list[int] = []
    judge, scorer = Recording(), Recording()

    def outcome_images(request: dict) -> str:
        if identify_step(request) == "outcome":
            images_seen.append(len(user_parts(request)[1]))
        return judge(request)

    with FakeOpenAI(outcome_images) as judge_srv, FakeOpenAI(scorer) as scorer_srv:
        overrides = [*_overrides(judge_srv), *_scorer_overrides(scorer_srv), f"out={tmp_path / 'run'}"]
        run_judge([str(source)], load_config(JudgeRunConfig, None, overrides), progress=False)
        judged_scores = scorer.steps["key_screenshot"]
        assert judged_scores == 16
        judge.steps.clear()
        images_seen.clear()
        mark_stand_in(tmp_path / "run", "STAND-IN VERDICTS: noise")  # a sweep of a stand-in run says so
        assert (
            keyshot(
                [
                    "sweep",
                    str(tmp_path / "run"),
                    "--out",
                    str(tmp_path / "sweep"),
                    "--no-progress",
                    *overrides,
                ]
            )
            == 0
        )
    assert scorer.steps["key_screenshot"] == judged_scores  # not one more scorer call
    assert set(judge.steps) == {"outcome"}
    result = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert result["not_swept"] == {} and result["sweepable"] == 4
    assert (
        result["stand_in"] == stand_in_of(delta_folder(tmp_path / "sweep", 2)) == "STAND-IN VERDICTS: noise"
    )
    assert result["totals"]["scorer_calls_sent"] == 0
    # δ=3 is the judged run's own: its outcome requests come from the run's cache
    assert [r["outcome_sent"] for r in result["per_delta"]][1] == 0
    kept_sent = []
    for delta in (2, 3, 4):
        protocol = read_protocol(delta_folder(tmp_path / "sweep", delta))
        assert protocol["outcome_images"] == "scorer" and protocol["threshold"] == delta
        for v in read_verdicts(delta_folder(tmp_path / "sweep", delta) / "verdicts.jsonl"):
            assert v.kept == select_kept(v.screenshots, delta, mode="strict")
            kept_sent.append(len(v.kept))
    # every request sent showed the judge one of its δ's kept sets of screenshots, images included
    assert images_seen and Counter(images_seen) <= Counter(kept_sent) and max(images_seen) > 0
    assert sum(judge.steps.values()) == result["totals"]["outcome_calls_sent"] == len(images_seen)


def test_recorded_action_history_gives_the_prompt_back_exactly():
    from keyshot.infer.protocol.messages import format_actions
    from keyshot.infer.protocol.prompts import load_prompt_set

    prompts = load_prompt_set("online_mind2web")
    for path in sorted(RECORDS.rglob("*.json")):
        record = json.loads(path.read_text())
        text = record["input_text"]
        start = text.index("Action History:\n") + len("Action History:\n")
        end = text.find("\n\nThe potentially important snapshots", start)
        assert (
            format_actions(recorded_actions(record), None, prompts) == text[start : end if end >= 0 else None]
        )
    # reasoning holding a numbered list of its own: one item, the text unchanged
    history = (
        '1. send_msg_to_user("a"). Reasoning: prices:\n1. $19.95\n2. $72.99\n\nso\n2. None. Reasoning: None'
    )
    record = {"input_text": f"User Task: t\n\nKey Points: k\n\nAction History:\n{history}"}
    assert format_actions(recorded_actions(record), None, prompts) == history
    assert recorded_actions({"input_text": "no history"}) is None


def test_a_spent_budget_stops_the_sweep_and_says_so(tmp_path, capsys):
    """The judge's budget runs out at the first δ: the sweep stops there, records why in sweep.json, and
    exits with the budget's code (the run loop records the stop; the sweep reads it from the judge)."""
    out = tmp_path / "sweep"
    prices = [
        "judge.budget_usd=0.0000001",
        "judge.price_input_per_mtok=1000",
        "judge.price_output_per_mtok=1000",
    ]
    with FakeOpenAI(make_judge("task_hash")) as server:
        rc = keyshot(
            ["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server), *prices]
        )
    printed = capsys.readouterr().out
    assert rc == EXIT_BUDGET
    last = printed.strip().splitlines()[
        -3:
    ]  # the stop, said once with the one thing to do, and what was written
    assert last[0].startswith("Stopped: δ=2:") and last[0].endswith(
        "; re-run the same keyshot sweep to go on"
    )
    assert last[-1].startswith("wrote ") and "compare them" not in printed and printed.count("re-run") == 1
    first = json.loads((out / "sweep.json").read_text())["per_delta"][0]
    assert "budget" in first["stopped"] and "no further call is sent" in first["stopped"]


def test_a_dead_judge_stops_the_sweep_at_preflight_and_failed_calls_leave_it_incomplete(tmp_path, capsys):
    """A judge that is down stops the sweep within seconds with the preflight's line and exit code, as
    keyshot judge does, before anything is written; a judge that answers the preflight but fails every
    outcome call leaves no verdict that is a result: the sweep exits 3 (incomplete) saying so, once, and a
    run against a judge that answers finishes them."""
    out = tmp_path / "sweep"
    settings = ["judge.model=fake-judge", "judge.api_key_env=null", "judge.backoff_base_s=0.01"]
    settings += ["judge.timeout_s=10", "judge.max_retries=0", "pipeline.outcome_logprobs=2"]
    dead = ["judge.base_url=http://127.0.0.1:9/v1", *settings]
    started = time.monotonic()
    assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *dead]) == EXIT_PREFLIGHT
    assert time.monotonic() - started < 10 and not out.exists()
    assert "cannot connect" in capsys.readouterr().err
    with FakeOpenAI(make_judge("task_hash"), faults=FaultPlan({"500": 1.0})) as failing:
        argv = [
            "sweep",
            str(O4_MINI),
            "--out",
            str(out),
            "--no-progress",
            f"judge.base_url={failing.base_url}",
        ]
        assert keyshot([*argv, *settings]) == EXIT_INCOMPLETE
    printed = capsys.readouterr().out
    assert "incomplete (the outcome call failed: 9): run keyshot sweep again" in printed
    assert "compare them" not in printed  # one thing to do
    failed = [r["failed"] for r in json.loads((out / "sweep.json").read_text())["per_delta"]]
    assert failed == [{"the outcome call failed": 3}] * 3
    with FakeOpenAI(make_judge("task_hash")) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
        assert server.stats.requests > 0


def test_an_unreadable_kept_screenshot_fails_its_verdict_and_the_sweep_goes_on(tmp_path, capsys):
    """A kept screenshot that cannot be read any more (its file broken after the judged run) fails that one
    verdict with its reason, as keyshot judge records such a failure on its verdict: the other verdicts are
    swept, sweep.json counts it by reason and the sweep exits 3 (it aborted with no sweep.json)."""
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        overrides = _judged_run(tmp_path, server, [3, 5, 2, 6])
        judged = read_verdicts(tmp_path / "run" / "verdicts.jsonl")
        broken = next(v for v in judged if select_kept(v.screenshots, 2, mode="strict"))
        shot = broken.screenshots[select_kept(broken.screenshots, 2, mode="strict")[0]]
        (tmp_path / "traj" / "screenshots" / shot.path).write_bytes(
            b"\x89PNG\r\n\x1a\n not an image any more"
        )
        out = tmp_path / "sweep"
        argv = [
            "sweep",
            str(tmp_path / "run"),
            "--out",
            str(out),
            "--deltas",
            "2",
            "--no-progress",
            *overrides,
        ]
        assert keyshot(argv) == EXIT_INCOMPLETE
    printed = capsys.readouterr().out
    assert "1 swept verdict(s) incomplete (a kept screenshot is not readable: 1)" in printed
    row = json.loads((out / "sweep.json").read_text())["per_delta"][0]
    assert row["trajectories"] == 4 and row["incomplete"] == 1
    assert row["failed"] == {"a kept screenshot is not readable": 1}
    swept = {v.task_id: v for v in read_verdicts(delta_folder(out, 2) / "verdicts.jsonl")}
    assert swept[broken.task_id].success is None and shot.path in swept[broken.task_id].error
    assert all(v.finished and v.success is not None for k, v in swept.items() if k != broken.task_id)


def test_the_sweep_says_before_any_call_what_it_will_pay_and_why(tmp_path, capsys):
    """Before sending anything the sweep says how many outcome calls it pays at most, per δ and why: one per
    trajectory, less the requests an earlier δ asks too (the same kept screenshots); in key-point mode one per
    key point. What it then sends is what it said (an empty cache)."""
    out = tmp_path / "released"
    with FakeOpenAI(make_judge("task_hash")) as server:
        assert keyshot(["sweep", str(O4_MINI), "--out", str(out), "--no-progress", *_overrides(server)]) == 0
    printed = capsys.readouterr().out
    lines = printed[: printed.index("Sweep of")].splitlines()
    assert lines == [
        "Before any call: at most 4 outcome calls to pay (one outcome call per trajectory).",
        "δ=2: at most 3 paid of 3 calls for 3 trajectories to ask.",
        "δ=3: at most 1 paid of 3 calls for 3 trajectories to ask; 2 repeat an earlier δ's requests (the same "
        "kept screenshots: the cache answers them).",
        "δ=4: at most 0 paid of 3 calls for 3 trajectories to ask; 3 repeat an earlier δ's requests (the same "
        "kept screenshots: the cache answers them).",
    ]
    assert json.loads((out / "sweep.json").read_text())["totals"]["outcome_calls_sent"] == 4

    from keyshot.infer.protocol.parsing import split_key_points

    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        overrides = _judged_run(tmp_path, server, [3, 5, 4], "pipeline.outcome_mode=key_point")
        argv = ["sweep", str(tmp_path / "run"), "--out", str(tmp_path / "kp"), "--no-progress", *overrides]
        assert keyshot([*argv, f"cache={tmp_path / 'empty.sqlite'}"]) == 0
    printed = capsys.readouterr().out
    points = sum(
        len(split_key_points(v.key_points)) for v in read_verdicts(tmp_path / "run" / "verdicts.jsonl")
    )
    assert points > 3
    sent = json.loads((tmp_path / "kp" / "sweep.json").read_text())["totals"]["outcome_calls_sent"]
    assert (
        f"Before any call: at most {sent} outcome calls to pay (one outcome call per key point)." in printed
    )
    assert f"δ=2: at most {points} paid of {points} calls for 3 trajectories to ask" in printed
    assert "The judged run's own requests" in printed and "not in this sweep's cache" in printed


def test_the_plan_leaves_out_the_judged_verdicts_the_sweep_leaves_out(tmp_path, capsys):
    """A judged verdict its run left incomplete (a call that failed for good) is not asked by the sweep, and
    the plan does not count it either: both read one rule (the plan counted it before)."""
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        overrides = _judged_run(tmp_path, server, [3, 5, 2, 6])
        verdicts = tmp_path / "run" / "verdicts.jsonl"
        lines = verdicts.read_text().splitlines()
        failed = {**json.loads(lines[0]), "error": "outcome: the call failed", "incomplete": ["outcome"]}
        verdicts.write_text("\n".join([json.dumps(failed), *lines[1:]]) + "\n")
        out = tmp_path / "sweep"
        argv = ["sweep", str(tmp_path / "run"), "--out", str(out), "--deltas", "2", "--no-progress"]
        assert keyshot([*argv, *overrides]) == 0, capsys.readouterr().err
    result = json.loads((out / "sweep.json").read_text())
    assert result["sweepable"] == 3 and sum(result["not_swept"].values()) == 1
    plan = plan_sweep(tmp_path / "run", [2])
    assert plan[0]["trajectories"] == result["per_delta"][0]["trajectories"] == 3
