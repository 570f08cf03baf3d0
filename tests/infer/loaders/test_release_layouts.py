"""Published layouts judged as they are downloaded: the Online-Mind2Web release (one folder per agent,
the agent taken from the folder's name), then metrics joined with human labels by task id and agent."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths

REPO = paths.REPO
V1 = paths.FIXTURES / "trajectories" / "online_mind2web_v1"
REFERENCE = str(REPO / "configs/judge/reference_gpt4o.yaml")


def release_layout(root: Path) -> tuple[Path, list[str]]:
    """root/SeeAct/<task>/..., root/Browser_Use/<task>/... sharing task ids, and human_label.json."""
    tasks = sorted(p.name for p in V1.iterdir() if p.is_dir())
    for agent in ("SeeAct", "Browser_Use"):
        for task in tasks:
            shutil.copytree(V1 / task, root / "online_mind2web" / agent / task)
    labels = [
        {"task_id": t, "confirmed_task": "…", "SeeAct_human_label": "1", "Browser_Use_human_label": "0"}
        for t in tasks
    ]
    (root / "human_label.json").write_text(json.dumps(labels))
    return root / "online_mind2web", tasks


def judge_reference(inputs: list[Path], out: Path, *extra: str) -> None:
    """``keyshot judge INPUTS`` in the reference configuration into ``out``, a fake judge answering."""
    with FakeOpenAI(make_judge()) as judge:
        argv = ["judge", *map(str, inputs), "--config", REFERENCE, "--no-progress", f"out={out}", *extra]
        assert keyshot([*argv, f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]) == 0


def metrics_with_labels(judged: Path, labels: Path, out: Path) -> int:
    """``keyshot metrics`` of the verdicts judged into ``judged``, joined with the human labels ``labels``."""
    return keyshot(
        ["metrics", str(judged / "verdicts.jsonl"), "--human-labels", str(labels), "--out", str(out)]
    )


def test_release_layout_is_judged_per_agent_and_joins_human_labels(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    data, tasks = release_layout(tmp_path)
    out = tmp_path / "judged"
    judge_reference([data], out)
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert sorted((v.agent, v.task_id) for v in verdicts) == sorted(
        (a, t) for a in ("SeeAct", "Browser_Use") for t in tasks
    )  # the same task run by two agents is two trajectories
    metrics = tmp_path / "metrics"
    assert metrics_with_labels(out, tmp_path / "human_label.json", metrics) == 0
    report = json.loads((metrics / "metrics.json").read_text())
    assert json.dumps(report).count("SeeAct") and json.dumps(report).count("Browser_Use")
    assert f"{2 * len(tasks)} of {2 * len(tasks)} verdicts matched a human label" in caplog.text


def test_a_join_that_matches_nothing_is_an_error_naming_both_sides(tmp_path, capsys):
    data, tasks = release_layout(tmp_path)
    out = tmp_path / "judged"
    judge_reference([data / "SeeAct"], out)
    assert all(v.agent is None for v in read_verdicts(out / "verdicts.jsonl"))  # one agent's folder: no name
    capsys.readouterr()
    code = metrics_with_labels(out, tmp_path / "human_label.json", tmp_path / "m")
    err = capsys.readouterr().err
    assert code == 2 and f"only 0 of {len(tasks)} verdicts matched a human label" in err
    assert tasks[0] in err and "--agent NAME" in err
    # naming the agent fixes it
    out2 = tmp_path / "judged2"
    judge_reference([data / "SeeAct"], out2, "agent=SeeAct")
    assert metrics_with_labels(out2, tmp_path / "human_label.json", tmp_path / "m2") == 0


def test_nothing_readable_is_an_error_that_says_what_was_seen(tmp_path, capsys):
    (tmp_path / "deep" / "benchmark" / "agent" / "task").mkdir(parents=True)
    (tmp_path / "deep" / "benchmark" / "agent" / "task" / "notes.txt").write_text("hello")
    out = tmp_path / "out"
    assert (
        keyshot(["judge", str(tmp_path / "deep"), "--config", REFERENCE, "--no-progress", f"out={out}"]) == 2
    )
    err = capsys.readouterr().err
    assert "no readable trajectory in" in err and "looked for Online-Mind2Web task folders" in err
    assert not out.exists()  # no empty --out left behind


AGENTLAB = paths.FIXTURES / "trajectories" / "agentlab"


def test_agentlab_runs_of_one_task_are_kept_apart_and_true_duplicates_reported(tmp_path):
    runs = tmp_path / "study"
    original = next(p for p in sorted(AGENTLAB.iterdir()) if p.is_dir())
    shutil.copytree(original, runs / original.name)
    stamp = original.name[:19]
    rerun = original.name.replace(stamp, "2030-01-01_00-00-00")  # the same task, agent and seed, run again
    shutil.copytree(original, runs / rerun)
    out = tmp_path / "judged"
    judge_reference([runs, runs / rerun], out)
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert len(verdicts) == 2 and {v.run for v in verdicts} == {stamp, "2030-01-01_00-00-00"}
    assert len({(v.task_id, v.agent) for v in verdicts}) == 1  # one task, one agent, two runs
    summary = json.loads((out / "summary.json").read_text())
    assert (
        len(summary["run"]["duplicates"]) == 1
        and "the same trajectory reached twice" in summary["run"]["duplicates"][0]
    )
    assert "## Duplicates (judged once)" in (out / "summary.md").read_text()
    # the runs' own rewards are the ground truth for metrics
    assert all(v.reward is not None for v in verdicts)
    assert keyshot(["metrics", str(out / "verdicts.jsonl"), "--out", str(tmp_path / "m")]) == 0
    report = json.loads((tmp_path / "m" / "metrics.json").read_text())
    overall = next(r for r in report["classification"] if r["scope"] == "overall")
    assert overall["n"] == 2


def test_outputs_are_shareable_and_help_is_plain_text(tmp_path, capsys):
    import os
    import stat

    data, _ = release_layout(tmp_path)
    out = tmp_path / "judged"
    old = os.umask(0o022)
    try:
        judge_reference([data], out, "--report")
    finally:
        os.umask(old)
    for name in ("verdicts.jsonl", "summary.json", "summary.md", "run.json", "report/index.html"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o644, name  # the umask's mode, not 0600
    capsys.readouterr()
    for command in (["judge"], ["report"], ["serve"], ["metrics"], ["synth", "run"]):
        try:
            code = keyshot([*command, "--help"])
        except SystemExit as exc:  # argparse exits after printing help
            code = exc.code
        text = capsys.readouterr().out
        assert code == 0, (command, code)
        assert text and "``" not in text and ":class:" not in text, command


def test_dry_run_checks_everything_and_calls_no_model(tmp_path, capsys):
    data, tasks = release_layout(tmp_path)
    with FakeOpenAI(make_judge(), model="gpt-4o") as judge:
        argv = [
            "judge",
            str(data),
            "--config",
            REFERENCE,
            "--no-progress",
            f"out={tmp_path / 'o'}",
            "--dry-run",
        ]
        argv += [f"judge.base_url={judge.base_url}", "judge.api_key_env=null", "judge.model=gpt-4o"]
        assert keyshot(argv) == 0
        assert judge.stats.requests == 0
    out = capsys.readouterr().out
    assert f"dry run: {2 * len(tasks)} trajectories found (Browser_Use, SeeAct)" in out
    assert "nothing was called" in out and not (tmp_path / "o").exists()
    missing = tmp_path / "no-such-checkpoint"
    assert keyshot([*argv, "--serve-scorer", str(missing)]) == 2
    assert f"{missing}: not a model checkpoint" in capsys.readouterr().err


def test_deeper_release_trees_are_found_with_their_agents(tmp_path):
    """AgentRewardBench's release (benchmark/agent/run, AgentLab runs) and the Online-Mind2Web release one
    level down (data/online_mind2web/<agent>/<task>) in one input; a stray empty folder is reported."""
    root = tmp_path / "downloads"
    run = next(p for p in sorted(AGENTLAB.iterdir()) if p.is_dir())
    shutil.copytree(run, root / "agentrewardbench" / "workarena" / "DemoAgent-gpt-4o" / run.name)
    (root / "agentrewardbench" / "webarena" / "empty").mkdir(parents=True)
    _, tasks = release_layout(root / "om2w")
    out = tmp_path / "judged"
    judge_reference([root], out)
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert sorted((v.agent, v.benchmark == "workarena") for v in verdicts) == sorted(
        [("DemoAgent-gpt-4o", True)] + [(a, False) for a in ("SeeAct", "Browser_Use") for _ in tasks]
    )
    summary = json.loads((out / "summary.json").read_text())
    skipped = json.dumps(summary["run"])
    assert "webarena" in skipped and "not a trajectory folder" in skipped
