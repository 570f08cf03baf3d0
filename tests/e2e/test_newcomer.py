"""A newcomer's first hour, from any folder (issue 62): a judged folder finds its files from another
working folder (older folders too), a command that finds none of them says so in one line, the truth has
one name everywhere, a closed output ends a command quietly, shipped configs by name, --version, the
defaults in --help, a YAML error in one line, one warning once, and the sweep's own examples run as
written. Every test works in a scratch folder outside the repository (tmp_path as the working folder)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from keyshot import load_trajectories, webjudge_from_config
from keyshot.infer.cli import build_parser
from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import ConfigError, load_config, resolve_config
from keyshot.infer.common.errors import EXIT_CLOSED_OUTPUT, EXIT_PREFLIGHT, EXIT_USAGE
from keyshot.infer.judge import sweep as sweep_command
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths

AGENTLAB = paths.FIXTURES / "trajectories" / "agentlab"  # 1 run of DemoAgent-gpt-4o, cum_reward recorded
CRASHED = paths.FIXTURES / "trajectories" / "agentlab_crashed"
OM2W = paths.FIXTURES / "trajectories" / "online_mind2web_v1"  # 2 trajectories, no agent name
ARB = paths.FIXTURES / "arb_records"


@pytest.fixture(scope="module")
def judge_server():
    with FakeOpenAI(make_judge("task_hash")) as server:
        yield server


def fake(server: FakeOpenAI) -> list[str]:
    return [f"judge.base_url={server.base_url}", "judge.model=fake-judge", "judge.api_key_env=null"]


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if "error" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture(scope="module")
def judged(tmp_path_factory, judge_server):
    """An AgentLab run and a crashed one judged from their parent folder by a relative path, as a newcomer
    types it: (the folder keyshot judge ran in, the run folder, what it printed)."""
    work = tmp_path_factory.mktemp("work")
    shutil.copytree(AGENTLAB, work / "mytraj", dirs_exist_ok=True)
    shutil.copytree(CRASHED, work / "mytraj", dirs_exist_ok=True)
    before = Path.cwd()
    os.chdir(work)
    try:
        argv = ["judge", "mytraj", "--config", "reference_gpt4o", "--out", "run", "--no-progress"]
        code = subprocess.run(
            [sys.executable, "-m", "keyshot.infer.cli", *argv, *fake(judge_server)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        os.chdir(before)
    assert code.returncode == 0, code.stderr[-2000:]
    return work, work / "run", code.stdout + code.stderr


def test_verdicts_record_paths_that_resolve_from_anywhere(judged, tmp_path, monkeypatch, caplog):
    work, run, printed = judged
    [v] = read_verdicts(run / VERDICTS_FILE)
    assert Path(v.source).is_absolute() and v.screenshots
    assert all(Path(s.path).is_absolute() and Path(s.path).is_file() for s in v.screenshots)
    # the crashed run is said once (in the summary's list), not also as a warning
    assert printed.count("filter-asset-list_27") == 1

    monkeypatch.chdir(tmp_path)  # another working folder
    caplog.set_level(logging.INFO)
    assert keyshot(["report", str(run), "--out", "report", "--no-progress"]) == 0
    assert "0 screenshots converted, 0 reused" not in caplog.text
    assert len(list((tmp_path / "report" / "images").glob("*.t.jpg"))) == len(
        set(s.path for s in v.screenshots)
    )


def test_an_older_folder_finds_its_files_from_its_recorded_inputs(judged, tmp_path, monkeypatch, capsys):
    """Verdicts of an older keyshot recorded paths as given on the command line (relative to the folder
    judge ran in): read from elsewhere, they are found again from run.json's recorded inputs."""
    work, run, _ = judged
    old = tmp_path / "old-run"
    shutil.copytree(run, old)
    rows = [json.loads(line) for line in (old / VERDICTS_FILE).read_text().splitlines()]
    for row in rows:
        row["source"] = os.path.relpath(row["source"], work)
        for shot in row["screenshots"]:
            shot["path"] = os.path.relpath(shot["path"], work)
    (old / VERDICTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert not Path(rows[0]["source"]).is_absolute()

    monkeypatch.chdir(tmp_path)
    assert keyshot(["sweep", str(old), "--plan"]) == 0
    assert keyshot(["report", str(old), "--out", "report", "--no-progress"]) == 0
    assert list((tmp_path / "report" / "images").glob("*.t.jpg"))
    capsys.readouterr()


def test_a_command_that_finds_none_of_its_files_says_so_in_one_line(judged, tmp_path, monkeypatch, capsys):
    _, run, _ = judged
    moved = tmp_path / "moved"
    shutil.copytree(run, moved)
    rows = [json.loads(line) for line in (moved / VERDICTS_FILE).read_text().splitlines()]
    for row in rows:  # the trajectories are gone from where the verdicts say they were
        row["source"] = str(tmp_path / "gone" / Path(row["source"]).name)
        for shot in row["screenshots"]:
            shot["path"] = str(tmp_path / "gone" / Path(shot["path"]).name)
    (moved / VERDICTS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["report", str(moved), "--out", "report", "--no-progress"],
        ["sweep", str(moved), "--plan"],
        ["sweep", str(moved), "--config", "reference_gpt4o", "--out", "sweep", "--no-progress"],
    ):
        assert keyshot(argv) == EXIT_USAGE, argv
        line = one_error_line(capsys.readouterr().err)
        assert "none of its" in line and "can be" in line, line
    assert not (tmp_path / "sweep").exists()


def test_the_truth_has_one_name_everywhere(judged, tmp_path, monkeypatch, judge_server, capsys):
    _, run, _ = judged
    summary = (run / "summary.md").read_text()
    assert "Agreement with the truth (AgentLab reward): 100.0% of 1" in summary or (
        "Agreement with the truth (AgentLab reward): 0.0% of 1" in summary
    )
    monkeypatch.chdir(tmp_path)
    assert keyshot(["report", str(run), "--out", "report", "--no-progress"]) == 0
    index = (tmp_path / "report" / "index.html").read_text()
    assert "Agreement with the truth: AgentLab reward" in index and "(AgentLab reward; dropped" in index
    assert "unnamed" not in index
    argv = ["sweep", str(run), "--config", "reference_gpt4o", "--out", "sweep", "--no-progress"]
    assert keyshot([*argv, *fake(judge_server)]) == 0
    assert keyshot(["metrics", "sweep", "--out", "metrics"]) == 0
    printed = capsys.readouterr().out
    assert "Truth: AgentLab reward. Rates count" in printed
    assert (
        json.loads((tmp_path / "metrics" / "delta_comparison.json").read_text())["truth"] == "AgentLab reward"
    )


def closed_output(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """``keyshot ARGV`` with a standard output whose reader has gone (``| head`` once it read its lines)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "keyshot.infer.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return subprocess.CompletedProcess(argv, proc.wait(timeout=300), "", err)


def test_a_closed_output_ends_a_command_quietly(judged, tmp_path):
    _, run, _ = judged
    for argv in (
        ["metrics", str(run / VERDICTS_FILE), "--out", "metrics"],
        ["report", str(run), "--out", "report", "--no-progress"],
        ["judge", str(OM2W), "--config", "reference_gpt4o", "--dry-run", "judge.api_key_env=NO_SUCH_KEY_62"],
    ):
        done = closed_output(argv, tmp_path)
        assert done.returncode == EXIT_CLOSED_OUTPUT, (argv, done.stderr[-2000:])
        assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr


def test_shipped_configs_by_name_version_and_one_line_config_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    dead = ["judge.base_url=http://127.0.0.1:9/v1", "scorer.endpoint.base_url=http://127.0.0.1:9/v1"]
    for config in ("webjudge7b", "configs/judge/webjudge7b.yaml", "judge/webjudge7b"):
        assert keyshot(["judge", str(OM2W), "--config", config, "--dry-run", *dead]) == EXIT_PREFLIGHT
        assert "dry run: 2 trajectories found" in capsys.readouterr().out
    # a name three folders share is the command's own (judge/tiny_cpu), and refused where none is its own
    assert resolve_config("tiny_cpu", JudgeRunConfig.SHIPPED_FOLDER).parent.name == "judge"
    assert load_config(JudgeRunConfig, "tiny_cpu").scorer.backend == "openai"  # the judge config, read
    with pytest.raises(ConfigError, match="judge/tiny_cpu, serve/tiny_cpu, train/tiny_cpu"):
        resolve_config("tiny_cpu")
    assert keyshot(["judge", str(OM2W), "--config", "no_such_config", "--dry-run"]) == EXIT_USAGE
    assert "e.g. --config webjudge7b" in one_error_line(capsys.readouterr().err)
    (tmp_path / "bad.yaml").write_text("judge:\n  model: gpt-4o\n  temperature: [0.1,\n")
    assert keyshot(["judge", str(OM2W), "--config", "bad.yaml", "--dry-run"]) == EXIT_USAGE
    line = one_error_line(capsys.readouterr().err)
    assert "bad.yaml:4:1: not valid YAML" in line and "<unicode string>" not in line

    with pytest.raises(SystemExit) as done:
        keyshot(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("keyshot 0.")


def _parsers(parser: argparse.ArgumentParser, prog: str = "keyshot"):
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, f"{prog} {name}")


def test_every_help_shows_each_options_default(capsys):
    for prog, parser in _parsers(build_parser()):
        text = " ".join(parser.format_help().split())
        for action in parser._actions:
            default = action.default
            if (
                not action.option_strings
                or default in (None, False, "", [], ())
                or default is argparse.SUPPRESS
            ):
                continue
            assert "default" in " ".join(
                (action.help % vars(action) if action.help else "").split()
            ).lower() or (f"(default: {default})" in text), (
                f"{prog} {action.option_strings[0]}: its default {default!r} is not shown"
            )


def test_the_sweeps_help_examples_run_as_written(judge_server, tmp_path, monkeypatch, capsys, caplog):
    """Each example of ``keyshot sweep --help``, as written (the fake judge's endpoint added), in a scratch
    folder holding what they name: a judged folder, released records, labels."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(OM2W, tmp_path / "traj")
    shutil.copytree(ARB, tmp_path / "arb_records")
    labels = {p.name: 1 for p in OM2W.iterdir()}
    (tmp_path / "data" / "online_mind2web").mkdir(parents=True)
    (tmp_path / "data" / "online_mind2web" / "human_label.json").write_text(json.dumps(labels))
    argv = ["judge", "traj", "--config", "reference_gpt4o", "--out", "runs/om2w", "--no-progress"]
    assert keyshot([*argv, "--agent", "MyAgent", *fake(judge_server)]) == 0
    examples = [
        line.strip() for line in sweep_command.__doc__.splitlines() if line.strip().startswith("keyshot ")
    ]
    assert len(examples) == 3
    capsys.readouterr()
    caplog.set_level(logging.INFO)
    for example in examples:
        words = shlex.split(example)[1:]
        extra = [*fake(judge_server), "--no-progress"] if words[0] == "sweep" else []
        caplog.clear()
        assert keyshot([*words, *extra]) == 0, (example, capsys.readouterr().err[-2000:])
        err = capsys.readouterr().err + caplog.text
        if "arb_records" in example:  # released records: the shipped config's pipeline gives way, said once
            assert err.count("give way to the judged folder's") == 1
            assert "image policy" not in err and "not a trajectory" not in err
    refused = ["sweep", "arb_records/webjudge_o4_mini", "--config", "webjudge7b", "--out", "runs/refused"]
    assert keyshot([*refused, "pipeline.parse_mode=strict", *fake(judge_server)]) == EXIT_USAGE
    assert "drop the override" in one_error_line(capsys.readouterr().err)


def test_agent_is_said_once_where_runs_record_their_own(tmp_path, caplog):
    shutil.copytree(AGENTLAB, tmp_path / "a")
    shutil.copytree(
        AGENTLAB / next(AGENTLAB.iterdir()).name,
        tmp_path / "a" / ("2025-01-01_00-00-00_DemoAgentArgs_on_x.y_1"),
    )
    caplog.set_level(logging.WARNING)
    loaded = list(load_trajectories(tmp_path / "a", agent="NewcomerAgent"))
    assert len(loaded) == 2 and {t.agent for t in loaded} == {"DemoAgent-gpt-4o"}
    assert (
        len(list(load_trajectories(tmp_path / "a", agent="NewcomerAgent"))) == 2
    )  # read again: not said again
    assert caplog.text.count("agent='NewcomerAgent' is not used") == 1


def test_webjudge_from_a_config_in_python(judge_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    judge = webjudge_from_config("reference_gpt4o", *fake(judge_server))
    verdicts = judge.judge_sync(load_trajectories(OM2W))
    assert len(verdicts) == 2 and all(v.finished and v.success is not None for v in verdicts)


def test_reward_serve_checks_its_endpoints_at_start(tmp_path, monkeypatch, capsys):
    """As keyshot judge: a judge and scorer that are down end ``keyshot reward serve`` at start, exit 6,
    in one line naming both (docs/reliability.md), before the service listens."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    monkeypatch.chdir(tmp_path)
    dead = "http://127.0.0.1:9/v1"
    argv = ["reward", "serve", "--config", "reward/openrlhf", "--port", "0", "--allow-root", str(tmp_path)]
    argv += [f"judge.base_url={dead}", "judge.api_key_env=null", f"scorer.endpoint.base_url={dead}"]
    assert keyshot(argv) == EXIT_PREFLIGHT
    line = one_error_line(capsys.readouterr().err)
    assert line.count("cannot connect") == 2
