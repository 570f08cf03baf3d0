"""``keyshot reward filter --link`` output judges back with its identity (issue 35 item 9): the links keep
the names identities are read from (AgentLab's ``<time>_<agent>_on_<task>``, Online-Mind2Web's
``<agent>/<task>``), ``keyshot judge OUT/accepted`` reads them inside the input, and the same runs reached
twice are judged once. Overrides are written ``key=value`` as for every keyshot command."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.launch import start_reward_serve
from tests.support import paths

TRAJECTORIES = paths.FIXTURES / "trajectories"
AGENTLAB_RUN = next((TRAJECTORIES / "agentlab").iterdir())
SEEDS = ("2024-12-18_12-51-50", "2024-12-19_08-00-00")  # one task run twice by one agent


def identity(t) -> tuple:
    return (t.benchmark, t.agent, str(t.task_id), t.run)


@pytest.fixture
def rollouts(tmp_path) -> Path:
    """Two AgentLab runs of one task (two seeds) and two Online-Mind2Web tasks of an agent "SeeAct"."""
    root = tmp_path / "rollouts"
    for stamp in SEEDS:
        shutil.copytree(AGENTLAB_RUN, root / (stamp + AGENTLAB_RUN.name[len(SEEDS[0]) :]))
    for task in (TRAJECTORIES / "online_mind2web_v1").iterdir():
        shutil.copytree(task, root / "SeeAct" / task.name)
    return root


@pytest.fixture
def on_failure() -> str:
    return "zero"  # the service needs a number


def test_accepted_links_judge_back_with_their_agent_task_and_run(tmp_path, rollouts, config, capsys):
    originals = sorted(identity(t) for t in load_trajectories(rollouts))
    assert len(originals) == 4 and len({o[3] for o in originals if o[1] != "SeeAct"}) == 2  # two seeds
    out = tmp_path / "filtered"
    argv = ["reward", "filter", str(rollouts), "--config", str(config), "--min-reward", "0"]
    # overrides after the command and among its options, as judge takes them
    argv += ["--out", str(out), "concurrency=2", "--link", "pipeline.threshold=3"]
    assert keyshot(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in (out / "accepted.jsonl").read_text().splitlines()]
    assert sorted((r["benchmark"], r["agent"], r["task_id"], r["run"]) for r in records) == originals
    links = {str(p.relative_to(out / "accepted")) for p in (out / "accepted").rglob("*") if p.is_symlink()}
    runs = {p.name for p in rollouts.iterdir() if p.name != "SeeAct"}  # <time>_<agent>_on_<task>
    assert links == runs | {f"SeeAct/{p.name}" for p in (rollouts / "SeeAct").iterdir()}

    judged = tmp_path / "judged"
    argv = ["judge", str(out / "accepted"), "--config", str(config), f"out={judged}", "--no-progress"]
    assert keyshot(argv) == 0, capsys.readouterr().err  # no link refused as "outside the input"
    verdicts = read_verdicts(judged / "verdicts.jsonl")
    assert sorted((v.benchmark, v.agent, str(v.task_id), v.run) for v in verdicts) == originals

    # the runs and their links given together are the same runs: judged once
    both = tmp_path / "both"
    argv = [
        "judge",
        str(rollouts),
        str(out / "accepted"),
        "--config",
        str(config),
        f"out={both}",
        "--no-progress",
    ]
    assert keyshot(argv) == 0
    assert len(read_verdicts(both / "verdicts.jsonl")) == len(originals)
    assert json.loads((both / "summary.json").read_text())["run"]["duplicates"]


def test_the_filter_is_a_library_call_the_command_only_wires(tmp_path, rollouts, config, capsys):
    """The rollout filter lived in reward/command.py; it is keyshot.reward.rollout_filter.filter_rollouts,
    and the command's files are what it writes."""
    from keyshot.reward.rollout_filter import filter_rollouts

    result = filter_rollouts(
        str(config), ["concurrency=2"], [str(rollouts)], tmp_path / "lib", min_reward=0, link=False
    )
    assert result.accepted == len(result.records) == 4 and result.failed == result.failed_calls == 0
    argv = ["reward", "filter", str(rollouts), "--config", str(config), "--min-reward", "0", "--out"]
    assert keyshot([*argv, str(tmp_path / "cli"), "concurrency=2"]) == 0, capsys.readouterr().err
    for name in ("rewards.jsonl", "accepted.jsonl"):
        assert (tmp_path / "lib" / name).read_text() == (tmp_path / "cli" / name).read_text()


def test_a_link_leading_out_of_its_target_is_still_refused_naming_where_it_leads(tmp_path, rollouts):
    """A trajectory folder linked into the input is read as its target, nothing more: a screenshot link
    inside it that leads elsewhere is refused, and the message names the path it resolves to."""
    secret = tmp_path / "secret.png"
    shutil.copy(AGENTLAB_RUN / "screenshot_step_0.png", secret)
    run = next(p for p in rollouts.iterdir() if p.name.startswith(SEEDS[0]))
    (run / "screenshot_step_0.png").unlink()
    (run / "screenshot_step_0.png").symlink_to(secret)
    accepted = tmp_path / "accepted"
    accepted.mkdir()
    (accepted / run.name).symlink_to(run, target_is_directory=True)
    errors: list = []
    assert list(load_trajectories(accepted, on_error="skip", errors=errors)) == []
    [error] = errors
    assert "is outside the input" in str(error) and f"which resolves to {secret}" in str(error)


def test_reward_help_names_no_missing_config_and_every_job_is_listed(capsys):
    with pytest.raises(SystemExit):
        keyshot(["reward", "--help"])
    text = capsys.readouterr().out
    for path in (p for p in text.split() if p.startswith("configs/")):
        assert (paths.REPO / path).is_file(), path
    with pytest.raises(SystemExit):
        keyshot(["--help"])
    top = capsys.readouterr().out
    assert "keyshot reward filter" in top and "keyshot reward serve" in top


def test_a_stopped_service_says_it_stopped_not_that_it_can_resume(tmp_path, config):
    """SIGTERM ends ``keyshot reward serve`` with its own line, not the judge's "re-run ... to resume"; the
    service takes overrides as ``key=value`` too."""
    # it says where it listens once uvicorn's signal handlers are in place
    with start_reward_serve(config, tmp_path, "concurrency=2") as service:
        service.proc.send_signal(signal.SIGTERM)
        service.proc.wait(30)
        service.output.wait_for("stopped by SIGTERM")
        rest = service.output.text()
    assert "stopped by SIGTERM; the service answered the requests in flight and stopped" in rest, rest
    assert "re-run the same command" not in rest
