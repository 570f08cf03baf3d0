"""AgentLab 0.4.2 studies read as AgentLab reads them: its agent names, a relaunched run counted once (the
run it superseded listed with the reason), an image goal read from goal_object.pkl.gz, the study's own
files left out quietly, and ``--agentlab-summary`` putting the verdicts where AgentLab's result table
reads them.

The fast tests read ``tests/fixtures/agentlab_study``: three runs and the study files of a study written by
AgentLab's own loop (tests/support/agentlab_study.py). The slow ones write a whole study (8 runs of two
agents on live MiniWoB pages, one relaunched) with that driver, judge it and read it back with AgentLab's
``load_result_df``; they skip where AgentLab or the browser set-up (make setup-browser) is missing.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories, load_trajectory
from keyshot.infer.loaders.agentlab import agent_name_of
from keyshot.infer.loaders.agentlab_records import GOAL_OBJECT_FILE, load_record
from keyshot.infer.loaders.trajectory import SkippedEntry, TrajectoryError
from keyshot.infer.protocol.verdicts import latest_verdicts, read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge
from tests.support import paths

REPO = paths.REPO
FIXTURE = paths.FIXTURES / "agentlab_study"
CONFIG = str(REPO / "configs/judge/reference_gpt4o.yaml")
ORACLE, RANDOM = "OracleAgent-gpt-4o-mini", "RandomAgent-openai_gpt-4o-mini"
IMAGE_RUN = "2026-11-26_01-39-32_OracleAgent-gpt-4o-mini_on_miniwob.click-button-image-goal_3"
RELAUNCHED = "2026-11-26_01-40-53_RandomAgent-openai_gpt-4o-mini_on_miniwob.click-button_1"
SUPERSEDED = "_2026-11-26_01-39-32_RandomAgent-openai_gpt-4o-mini_on_miniwob.click-button_1"
WARNING_GOAL = "WARNING: This goal cannot be converted"
KEYS = ["keyshot_success", "keyshot_p_success", "keyshot_protocol"]


@pytest.fixture()
def study(tmp_path) -> Path:
    """A copy of the fixture study (its runs are changed by some tests)."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "study"))


def _judge(study: Path, out: Path, judge: FakeOpenAI, *more: str) -> int:
    argv = ["judge", str(study), "--config", CONFIG, "--no-progress", f"out={out}", *more]
    return keyshot([*argv, f"judge.base_url={judge.base_url}", "judge.api_key_env=null"])


def _summary(run: Path) -> dict:
    return json.loads((run / "summary_info.json").read_text())


# ---------------------------------------------------------------------------- read as AgentLab reads it
def test_agents_are_named_as_agentlab_names_them():
    assert agent_name_of("OracleAgent-gpt-4o-mini", "gpt-4o-mini") == ORACLE
    assert agent_name_of("RandomAgent-openai_gpt-4o-mini", "openai/gpt-4o-mini") == RANDOM
    assert (
        agent_name_of("GenericAgent-gpt-4o_vision", "gpt-4o") == "GenericAgent-gpt-4o_vision"
    )  # tmlr configs
    assert agent_name_of("Agent-qwen2.5_7b", "qwen2.5:7b") == "Agent-qwen2.5_7b"  # the folder's ':' made '_'
    # AgentRewardBench's released runs name the AgentArgs class: <class>-<model>
    assert agent_name_of("DemoAgentArgs", "gpt-4o") == "DemoAgent-gpt-4o"
    assert (
        agent_name_of("GenericAgentArgs", "meta-llama/Llama-3.3-70B")
        == "GenericAgent-meta-llama_Llama-3.3-70B"
    )
    assert agent_name_of("BasicAgent", "gpt-4o") == "BasicAgent-gpt-4o"  # a name without its model
    assert agent_name_of("DemoAgentArgs", None) == "DemoAgentArgs"
    loaded = {t.source.name: t for t in load_trajectories(FIXTURE, on_error="skip")}
    assert loaded[IMAGE_RUN].agent == ORACLE and loaded[RELAUNCHED].agent == RANDOM
    assert loaded[IMAGE_RUN].extra["model_name"] == "gpt-4o-mini"  # what the name was checked against


def test_a_run_superseded_by_a_relaunch_is_listed_not_judged(study, caplog):
    errors: list[TrajectoryError] = []
    loaded = list(load_trajectories(study, on_error="skip", errors=errors))
    assert sorted(t.source.name for t in loaded) == [IMAGE_RUN, RELAUNCHED]  # 2 runs, not 3
    assert {t.agent for t in loaded} == {ORACLE, RANDOM}  # no phantom agent named after the model
    [skipped] = errors
    assert isinstance(skipped, SkippedEntry) and skipped.path == study / SUPERSEDED
    assert "superseded by a relaunch" in str(skipped) and f"its relaunch {RELAUNCHED} is judged" in str(
        skipped
    )

    shutil.rmtree(study / RELAUNCHED)  # the relaunch gone: still AgentLab's rule, said so
    errors.clear()
    assert [t.source.name for t in load_trajectories(study, on_error="skip", errors=errors)] == [IMAGE_RUN]
    assert "its relaunch is not in this folder" in str(errors[0])

    alone = load_trajectory(study / SUPERSEDED)  # passed by itself: judged, under its own agent
    assert alone.agent == RANDOM and alone.task_id == "miniwob.click-button_1"
    assert alone.run == "2026-11-26_01-39-32" and "transient failure" in alone.extra["err_msg"]

    nested = study.parent / "results"  # AgentLab's results folder: studies one level down
    nested.mkdir()
    study.rename(nested / "2026-11-26_01-39-30_agentlab-study")
    errors.clear()
    assert len(list(load_trajectories(nested, on_error="skip", errors=errors))) == 1
    assert "superseded by a relaunch" in str(errors[0])


def test_an_image_goal_is_read_from_goal_object(study):
    run = study / IMAGE_RUN
    step = load_record(run / "step_0.pkl.gz").fields()["obs"]
    assert step["goal"].startswith('Click on the "submit" button.\n' + WARNING_GOAL)  # BrowserGym's sentence
    assert step["goal_object"] is None  # AgentLab's loop moved it to goal_object.pkl.gz
    trajectory = load_trajectory(run)
    assert trajectory.task == 'Click on the "submit" button.' and trajectory.extra["goal_images"] == 1

    parts = load_record(run / GOAL_OBJECT_FILE)
    assert [p["type"] for p in parts] == ["text", "image_url"]
    with gzip.open(run / GOAL_OBJECT_FILE, "wb") as fh:  # a goal of a picture only: no task in words
        pickle.dump(tuple(p for p in parts if p["type"] == "image_url"), fh)
    with pytest.raises(TrajectoryError, match=rf"{GOAL_OBJECT_FILE}: the goal is 1 image\(s\) and no text"):
        load_trajectory(run)
    (run / GOAL_OBJECT_FILE).unlink()  # the goal lost: BrowserGym's warning is never taken for it
    with pytest.raises(TrajectoryError, match=rf"{GOAL_OBJECT_FILE}: missing: .* copy the run folder whole"):
        load_trajectory(run)
    other = study / RELAUNCHED
    (other / GOAL_OBJECT_FILE).unlink()  # a goal of text only: obs["goal"] says it (before AgentLab moved it)
    assert load_trajectory(other).task == 'Click on the "cancel" button.'


def test_study_files_are_part_of_the_study_not_inputs(study, capsys, caplog):
    for name in (
        "study.pkl.gz",
        "study.json",
        "summary_df.csv",
        "error_report_trial_1_of_3.md",
        "launch.log",
    ):
        (study / name).write_bytes(b"x")
    (study / "notes.txt").write_text("a stray file is still named")
    caplog.set_level(logging.INFO)
    with FakeOpenAI(make_judge()) as judge:
        assert _judge(study, study.parent / "judged", judge, "--dry-run") == 0
    printed = capsys.readouterr().out
    assert (
        "dry run: 2 trajectories found (OracleAgent-gpt-4o-mini, RandomAgent-openai_gpt-4o-mini)" in printed
    )
    assert "not judged: 2 not a trajectory" in printed  # the superseded run and notes.txt, each named
    assert f"  not a trajectory: {study / SUPERSEDED}: superseded by a relaunch" in printed
    assert f"  not a trajectory: {study / 'notes.txt'}: not a trajectory file" in printed
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warned == []  # the two are said once, in the lines above; the study's own files not at all
    [quiet] = [r.getMessage() for r in caplog.records if "AgentLab's study files" in r.getMessage()]
    assert "_last_modification_times.json" in quiet and "study.pkl.gz" in quiet and "launch.log" in quiet


# ---------------------------------------------------------------------------- --agentlab-summary
def test_agentlab_summary_writes_the_verdicts_into_summary_info(study, capsys):
    before = {run: _summary(study / run) for run in (IMAGE_RUN, RELAUNCHED)}
    superseded = (study / SUPERSEDED / "summary_info.json").read_bytes()
    out = study.parent / "judged"
    with FakeOpenAI(make_judge("task_hash")) as judge:
        assert _judge(study, out, judge, "--agentlab-summary", "pipeline.outcome_logprobs=5") == 0
    assert "wrote keyshot's verdict into 2 summary_info.json files" in capsys.readouterr().out
    protocol = json.loads((out / "run.json").read_text())["protocol"]
    verdicts = {Path(v.source).name: v for v in read_verdicts(out / "verdicts.jsonl")}
    for run, old in before.items():
        new = _summary(study / run)
        assert list(new) == list(old) + KEYS and {k: new[k] for k in old} == old  # AgentLab's keys untouched
        verdict = verdicts[run]
        assert new["keyshot_success"] is verdict.success and verdict.success is not None
        assert new["keyshot_p_success"] == verdict.p_success and 0.0 < new["keyshot_p_success"] < 1.0
        assert new["keyshot_protocol"] == protocol
    assert (study / SUPERSEDED / "summary_info.json").read_bytes() == superseded  # not judged: untouched
    assert not [p for p in study.rglob("*.tmp")]  # written through a temporary file, renamed into place

    # a later run that reaches no verdict takes the keys out: the table never shows a verdict keyshot lacks
    failing = FaultPlan({"500": 1.0}, seed=0)
    with FakeOpenAI(make_judge(), faults=failing) as judge:
        more = ("--agentlab-summary", "judge.max_retries=0", "judge.backoff_base_s=0.01")
        assert _judge(study, study.parent / "failed", judge, *more) == 3
    printed = capsys.readouterr().out
    assert "wrote keyshot's verdict into 0 summary_info.json files" in printed
    assert "removed keyshot's keys from 2 summary_info.json files" in printed
    assert all(_summary(study / run) == old for run, old in before.items())


def test_a_summary_that_cannot_be_written_is_named_and_fails_the_run(study, capsys, monkeypatch):
    original = (study / RELAUNCHED / "summary_info.json").read_bytes()

    real_replace = os.replace

    def refuse(src, dst):  # the disk refuses the run folders' files, not keyshot's own
        if Path(dst).name == "summary_info.json":
            raise PermissionError(13, "Permission denied")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", refuse)
    with FakeOpenAI(make_judge()) as judge:
        assert _judge(study, study.parent / "judged", judge, "--agentlab-summary") == 2
    err = capsys.readouterr().err
    assert f"--agentlab-summary: {study / RELAUNCHED / 'summary_info.json'}: not written" in err
    assert "the run's verdict is in verdicts.jsonl" in err
    assert (study / RELAUNCHED / "summary_info.json").read_bytes() == original  # whole, as it was
    assert not [p for p in study.rglob("*.tmp")]


# ---------------------------------------------------------------------------- a live study, AgentLab's reader
@pytest.fixture(scope="module")
def live_study(tmp_path_factory) -> dict:
    """A study of 8 runs written by AgentLab 0.4.2's loop on live MiniWoB pages (one relaunched), once."""
    pytest.importorskip("agentlab.experiments.launch_exp", reason="AgentLab 0.4.2: make setup-browser")
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    from keyshot.env.miniwob.setup import MiniWoBError, prepare_browser

    try:
        prepare_browser()
    except MiniWoBError as exc:  # no Chromium here
        pytest.skip(str(exc))
    root = tmp_path_factory.mktemp("agentlab")
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.agentlab_study", "study", str(root)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def judged(live_study, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("judged") / "out"
    argv = [
        "judge",
        live_study["study"],
        "--config",
        CONFIG,
        "--no-progress",
        f"out={out}",
        "--agentlab-summary",
    ]
    with FakeOpenAI(make_judge("task_hash")) as judge:
        done = subprocess.run(
            [sys.executable, "-m", "keyshot.infer.cli", *argv, f"judge.base_url={judge.base_url}"]
            + ["judge.api_key_env=null", "pipeline.outcome_logprobs=5"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    return {"out": out, "stdout": done.stdout, "stderr": done.stderr}


@pytest.mark.slow
def test_a_study_of_agentlabs_loop_is_judged_under_its_names_each_run_once(live_study, judged):
    assert live_study["relaunched"] == 1 and len(live_study["runs"]) == 8
    [superseded] = live_study["superseded"]
    verdicts = latest_verdicts(read_verdicts(judged["out"] / "verdicts.jsonl"))
    assert sorted(Path(v.source).name for v in verdicts) == sorted(Path(r).name for r in live_study["runs"])
    assert {v.agent for v in verdicts} == {ORACLE, RANDOM}
    assert all(v.finished and v.success is not None for v in verdicts)
    [image] = [v for v in verdicts if v.source == live_study["image_goal"][0]]
    assert image.task.startswith("Click on the ") and "WARNING" not in image.task
    assert not any("WARNING" in v.task for v in verdicts)
    summary = json.loads((judged["out"] / "summary.json").read_text())["run"]
    assert summary["not_trajectories"] == 1 and summary["load_errors"] == 0
    [why] = summary["not_trajectory_messages"]
    assert why.startswith(f"{superseded}: superseded by a relaunch")
    assert "wrote keyshot's verdict into 8 summary_info.json files" in judged["stdout"]
    warned = [line for line in judged["stderr"].splitlines() if " WARNING " in line]
    assert warned == []  # the superseded run is said once, in the summary above; the study's files: never


@pytest.mark.slow
def test_agentlabs_own_result_table_shows_keyshots_verdicts(live_study, judged):
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.agentlab_study", "results", live_study["study"]],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {row["exp_dir"]: row for row in json.loads(done.stdout)}  # AgentLab's load_result_df
    verdicts = {Path(v.source).name: v for v in read_verdicts(judged["out"] / "verdicts.jsonl")}
    assert sorted(rows) == sorted(verdicts)  # AgentLab skips the superseded run too
    protocol = json.loads((judged["out"] / "run.json").read_text())["protocol"]
    for name, row in rows.items():
        assert row["keyshot_success"] is verdicts[name].success
        assert row["keyshot_p_success"] == pytest.approx(verdicts[name].p_success)
        assert row["keyshot_protocol"] == protocol
        assert row["agent.agent_name"] == verdicts[name].agent  # one name for the agent, AgentLab's
