"""Metrics: hand-computed cases, label "2" handling, Unsure dropped, no verdict = failure, readers,
real AgentRewardBench numbers, and the ``keyshot metrics`` command."""

from __future__ import annotations

import csv
import json

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.metrics.compute import (
    JudgedRecord,
    MetricsInputError,
    agreement_metrics,
    arb_records,
    classification_metrics,
    compute_metrics,
    load_human_labels,
    normalize_human_label,
    records_from_verdicts,
)
from keyshot.infer.protocol.verdicts import Verdict, VerdictFileError, read_verdicts
from keyshot.infer.runs.verdict_sources import load_verdicts
from tests.support import paths

ARB = paths.FIXTURES / "arb"


def R(agent, predicted, human, task="t", benchmark="b"):  # noqa: N802 (short row builder)
    return JudgedRecord(task, agent, benchmark, predicted, human)


RECORDS = [
    R("A", True, "success", "1"),
    R("A", False, "failure", "2"),
    R("A", None, "success", "3"),  # no verdict: a failure
    R("A", True, "failure", "4"),
    R("B", True, "success", "1"),
    R("B", True, "not_executable", "2"),
    R("B", False, "unsure", "3"),  # always dropped
]


def _by_group(rows):
    return {r.group: r for r in rows}


def test_agreement_hand_computed_with_label_2_as_failure():
    rows = _by_group(agreement_metrics(RECORDS))
    a, b, overall, macro = rows["A"], rows["B"], rows["Overall"], rows["Macro average"]
    assert (a.n, a.n_no_verdict, a.judge_sr, a.human_sr, a.agreement, a.sr_gap) == (4, 1, 0.5, 0.5, 0.5, 0.0)
    assert (b.n, b.judge_sr, b.human_sr, b.agreement, b.sr_gap) == (2, 1.0, 0.5, 0.5, 0.5)
    assert overall.n == 6
    assert overall.judge_sr == pytest.approx(4 / 6) and overall.human_sr == pytest.approx(3 / 6)
    assert overall.agreement == pytest.approx(3 / 6) and overall.sr_gap == pytest.approx(1 / 6)
    assert macro.agreement == pytest.approx(0.5) and macro.sr_gap == pytest.approx(0.25)


def test_label_2_policies():
    drop = _by_group(agreement_metrics(RECORDS, label_2="drop"))["B"]
    assert (drop.n, drop.judge_sr, drop.human_sr, drop.agreement) == (1, 1.0, 1.0, 1.0)
    success = _by_group(agreement_metrics(RECORDS, label_2="success"))["B"]
    assert (success.n, success.human_sr, success.agreement, success.sr_gap) == (2, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="label_2"):
        agreement_metrics(RECORDS, label_2="maybe")
    report = compute_metrics(RECORDS, label_2="drop")
    assert report.dropped == {"not_executable": 1, "unsure": 1} and report.n_used == 5


def test_precision_recall_f1_hand_computed():
    rows = classification_metrics(RECORDS)
    overall = _by_group(rows)["Overall"]
    assert (overall.tp, overall.fp, overall.fn, overall.tn) == (2, 2, 1, 1)
    assert overall.precision == pytest.approx(0.5) and overall.recall == pytest.approx(2 / 3)
    assert overall.f1 == pytest.approx(2 * 0.5 * (2 / 3) / (0.5 + 2 / 3))
    assert {(r.scope, r.group) for r in rows} == {
        ("agent", "A"),
        ("agent", "B"),
        ("benchmark", "b"),
        ("overall", "Overall"),
    }
    # no predicted success: precision undefined, not 0
    none = classification_metrics([R("A", None, "success"), R("A", False, "failure")])
    assert none[-1].precision is None and none[-1].recall == 0.0 and none[-1].f1 is None


def test_human_label_normalisation():
    assert [
        normalize_human_label(v)
        for v in ("1", 0, "2", "Successful", "Unsuccessful", "Unsure", True, None, "")
    ] == [
        "success",
        "failure",
        "not_executable",
        "success",
        "failure",
        "unsure",
        "success",
        None,
        None,
    ]
    with pytest.raises(ValueError, match="unknown human label"):
        normalize_human_label("7")


def test_metrics_read_verdicts_with_the_one_verdict_reader(tmp_path, caplog):
    """Last line wins per trajectory, a torn last line is skipped with a warning, a bad line in the
    middle, an empty file and a missing file are errors naming the file (and the line)."""
    path = tmp_path / "verdicts.jsonl"
    rows = [
        {"task_id": "a", "task": "A", "agent": "X", "benchmark": "om2w", "success": None},
        {"task_id": "b", "task": "B", "agent": "X", "benchmark": "om2w", "success": False},
        {
            "task_id": "a",
            "task": "A",
            "agent": "X",
            "benchmark": "om2w",
            "success": True,
        },  # resumed: last wins
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n" + '{"task_id": "c", "succ')
    out, kind = load_verdicts(path)
    assert kind == "keyshot" and [(v.task_id, v.success) for v in out] == [("a", True), ("b", False)]
    assert "incomplete last line" in caplog.text
    run = tmp_path / "run"
    run.mkdir()
    (run / "verdicts.jsonl").write_text(path.read_text())
    assert [v.task_id for v in load_verdicts(run)[0]] == ["a", "b"]  # a run folder reads the same
    middle = tmp_path / "middle.jsonl"
    middle.write_text(json.dumps(rows[0]) + "\n[1, 2]\n" + json.dumps(rows[1]) + "\n")
    with pytest.raises(VerdictFileError, match="middle.jsonl:2"):
        read_verdicts(middle)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(json.dumps(rows[0]).encode() + b"\n" + b'{"task_id": "caf\xe9"}\n')
    with pytest.raises(VerdictFileError, match=r"latin.jsonl:2: not UTF-8 text"):
        load_verdicts(latin)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(VerdictFileError, match="no verdicts"):
        load_verdicts(tmp_path / "empty.jsonl")
    with pytest.raises(VerdictFileError, match="missing.jsonl"):
        load_verdicts(tmp_path / "missing.jsonl")


def test_human_labels_join_by_task_and_loose_agent_name(tmp_path):
    labels_path = tmp_path / "human_label.json"
    labels_path.write_text(
        json.dumps(
            [
                {
                    "task_id": "t1",
                    "confirmed_task": "x",
                    "Browser_Use_human_label": "1",
                    "Agent-E_human_label": "2",
                },
                {
                    "task_id": "t2",
                    "confirmed_task": "y",
                    "Browser_Use_human_label": "0",
                    "Agent-E_human_label": "0",
                },
            ]
        )
    )
    labels = load_human_labels(labels_path)
    verdicts = [
        Verdict("t1", "", agent="Browser Use", success=True, human_label="0"),  # the file wins
        Verdict("t2", "", agent="browser-use", success=False),
        Verdict("t1", "", agent="Agent-E", success=False),
        Verdict("t9", "", agent="Agent-E", success=True, human_label="1"),  # not in the file
    ]
    recs = records_from_verdicts(verdicts, human_labels=labels)
    assert [(r.predicted, r.human) for r in recs] == [
        (True, "success"),
        (False, "failure"),
        (False, "not_executable"),
        (True, "success"),
    ]
    bad = tmp_path / "bad.json"
    bad.write_text('[{"task_id": "t1", "SeeAct_human_label": "9"}]')
    with pytest.raises(MetricsInputError, match="bad.json"):
        load_human_labels(bad)


def test_human_success_rates_match_the_paper_when_label_2_is_not_success():
    """Paper Table 2 human SRs come from counting "2" (not executable) as not success."""
    labels = load_human_labels(paths.FIXTURES / "online_mind2web" / "human_label.json")
    records = [
        JudgedRecord(task, agent, "online_mind2web", None, human) for (task, agent), human in labels.items()
    ]
    paper = {
        "operator": 61.3,
        "claude_computer_use_3.7": 56.3,
        "seeact": 30.7,
        "browser_use": 30.0,
        "claude_computer_use_3.5": 29.0,
        "agent_e": 28.0,
    }
    rows = _by_group(agreement_metrics(records))
    assert {a: round(100 * rows[a].human_sr, 1) for a in paper} == paper
    assert all(rows[a].n == 300 for a in paper)
    dropped = _by_group(agreement_metrics(records, label_2="drop"))
    assert dropped["operator"].n < 300 and dropped["operator"].human_sr > rows["operator"].human_sr


def _direct_arb(judge: str) -> tuple[int, int, int, int]:
    """P/R counts straight from the files: reference verdict rule, Unsure dropped."""
    tp = fp = fn = tn = 0
    with (ARB / "index.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["judge"] != judge or row["human_success"] == "Unsure":
                continue
            rec = json.loads(
                (ARB / judge / row["benchmark"] / row["agent"] / f"{row['task_id']}.json").read_text()
            )
            text = rec["response"]["choices"][0]["message"]["content"].lower()
            pred = "status:" in text and "success" in text.split("status:")[1]
            human = row["human_success"] == "Successful"
            tp += pred and human
            fp += pred and not human
            fn += human and not pred
            tn += not pred and not human
    return tp, fp, fn, tn


def test_released_webjudge_7b_dev_run_precision_recall():
    records = arb_records(ARB / "index.csv", judge="webjudge_7B")
    rows = _by_group(classification_metrics(records))
    tp, fp, fn, tn = _direct_arb("webjudge_7B")
    overall = rows["Overall"]
    assert (overall.tp, overall.fp, overall.fn, overall.tn) == (tp, fp, fn, tn)
    assert overall.precision == pytest.approx(tp / (tp + fp))
    assert overall.recall == pytest.approx(tp / (tp + fn))
    assert tp > 0 and fp > 0 and fn > 0  # a real run, not a degenerate one
    by_bench = sum(r.n for r in rows.values() if r.scope == "benchmark")
    assert by_bench == overall.n == tp + fp + fn + tn
    with pytest.raises(MetricsInputError, match="several judges"):
        arb_records(ARB / "index.csv")


def test_metrics_command_writes_all_outputs(tmp_path, capsys):
    # Verdicts of the released o4-mini run in keyshot's format, human labels joined from the index.
    ref = arb_records(ARB / "index.csv", judge="webjudge_o4_mini", parse_mode="strict")
    verdicts = tmp_path / "verdicts.jsonl"
    verdicts.write_text(
        "".join(
            json.dumps(
                {
                    "task_id": r.task_id,
                    "task": "",
                    "agent": r.agent,
                    "benchmark": r.benchmark,
                    "success": r.predicted,
                }
            )
            + "\n"
            for r in ref
        )
    )
    out = tmp_path / "metrics"
    rc = keyshot(["metrics", str(verdicts), "--arb-index", str(ARB / "index.csv"), "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"metrics.json", "metrics.md", "metrics.csv", "metrics.png"}
    assert (out / "metrics.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    saved = json.loads((out / "metrics.json").read_text())
    expected = _by_group(classification_metrics(ref))["Overall"]
    got = next(r for r in saved["classification"] if r["group"] == "Overall")
    assert (got["tp"], got["fp"], got["fn"], got["tn"]) == (
        expected.tp,
        expected.fp,
        expected.fn,
        expected.tn,
    )
    with (out / "metrics.csv").open() as fh:
        assert sum(1 for _ in csv.DictReader(fh)) == len(saved["agreement"]) + len(saved["classification"])
    assert "| overall | **Overall** |" in (out / "metrics.md").read_text()
    printed = capsys.readouterr().out
    assert "precision" in printed
    assert "p_success: no verdict carries p_success" in printed  # said, no calibration files

    assert keyshot(["metrics", str(tmp_path / "nope.jsonl"), "--out", str(out)]) == 2
    assert "nope.jsonl" in capsys.readouterr().err


def test_metrics_command_scores_released_records(tmp_path):
    assert (
        keyshot(
            [
                "metrics",
                "--arb-index",
                str(ARB / "index.csv"),
                "--arb-judge",
                "webjudge_gpt4o",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["n_records"] == sum(
        1
        for r in csv.DictReader((ARB / "index.csv").read_text().splitlines())
        if r["judge"] == "webjudge_gpt4o"
    )


def test_the_metrics_defaults_have_one_home():
    """``keyshot metrics``'s options and the library's keywords take their defaults from MetricsConfig; an
    option's default written again (and changed in one place only) fails here."""
    import argparse
    import dataclasses
    import inspect

    from keyshot.infer.metrics import calibration, compute, operating, sweep_compare
    from keyshot.infer.metrics.command import COMMAND, OPTION_OF
    from keyshot.infer.metrics.config import DEFAULTS, MetricsConfig

    parser = COMMAND.configure(argparse.ArgumentParser())
    parsed = parser.parse_args(["--out", "x"])
    for f in dataclasses.fields(MetricsConfig):
        assert getattr(parsed, OPTION_OF.get(f.name, f.name)) == getattr(DEFAULTS, f.name), f.name
    keyword_of = {"seed": "split_seed", "parse_mode": "arb_parse_mode"}
    checked = 0
    for module in (calibration, compute, operating, sweep_compare):
        for name, function in inspect.getmembers(module, inspect.isfunction):
            if function.__module__ != module.__name__:
                continue
            for p in inspect.signature(function).parameters.values():
                field = keyword_of.get(p.name, p.name)
                if hasattr(DEFAULTS, field) and p.default is not inspect.Parameter.empty:
                    assert p.default == getattr(DEFAULTS, field), f"{module.__name__}.{name}({p.name})"
                    checked += 1
    assert checked >= 10
    with pytest.raises(ValueError, match="label_2 must be one of"):
        MetricsConfig(label_2="maybe")


def test_completion_rate_is_webcanvas_micro_average_beside_the_success_rate(tmp_path):
    """Key points met over key points, pooled over the verdicts that say which were met (step rewards'
    key_point_steps, or key_point mode's calls), per agent and overall; the tables show it only then."""
    from keyshot.infer.metrics.files import metrics_csv, metrics_markdown
    from keyshot.infer.protocol.verdicts import OutcomeCall

    def verdict(task, agent, steps=None, calls=None, success=True):
        v = Verdict(
            task_id=task, task="t", agent=agent, success=success, status_valid=True, human_label="success"
        )
        v.key_point_steps = steps
        v.outcome_calls = calls or [OutcomeCall(success=success, valid=True)]
        return v

    met = [
        OutcomeCall(success=True, valid=True, key_point="a"),
        OutcomeCall(success=False, valid=True, key_point="b"),
    ]
    verdicts = [
        verdict("1", "A", steps=[0, 2, None]),  # 2 of 3
        verdict("2", "A", steps=[None]),  # 0 of 1
        verdict("3", "A"),  # cot without steps: not counted
        verdict("1", "B", calls=met, success=False),  # key_point mode: 1 of 2
    ]
    report = compute_metrics(records_from_verdicts(verdicts))
    rows = _by_group(report.agreement)
    assert rows["A"].completion_rate == pytest.approx(2 / 4) and rows["A"].n_completion == 2
    assert rows["B"].completion_rate == pytest.approx(1 / 2) and rows["B"].n_completion == 1
    assert rows["Overall"].completion_rate == pytest.approx(3 / 6) and rows["Overall"].judge_sr == 0.75
    markdown = metrics_markdown(report)
    assert "| CR | n CR |" in markdown and "| 50.0 | 3 |" in markdown
    assert "completion_rate,n_completion" in metrics_csv(report).splitlines()[0]
    plain = compute_metrics(records_from_verdicts([verdict("3", "A")]))
    assert plain.agreement[0].completion_rate is None and "CR" not in metrics_markdown(plain)
