"""A newcomer's first hour (issue 30), from the command line: the dry run without an endpoint, run
folders that do not trap you (a failed first run, other inputs), the demo's table and the report's
protocol line and agent table."""

from __future__ import annotations

import json
import re
from pathlib import Path

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.errors import EXIT_PREFLIGHT, EXIT_USAGE
from keyshot.infer.common.processes import free_port
from keyshot.infer.common.text import ELLIPSIS
from keyshot.infer.demo import ID_WIDTH, MEANINGLESS, verdict_table
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths
from tests.support.report_pages import Page

REPO = paths.REPO
TRAJ = paths.FIXTURES / "trajectories"
REFERENCE = str(REPO / "configs" / "judge" / "reference_gpt4o.yaml")
WEBJUDGE7B = str(REPO / "configs" / "judge" / "webjudge7b.yaml")
OM2W = TRAJ / "online_mind2web_v1"  # 2 trajectories, no agent name
AGENTLAB = TRAJ / "agentlab"  # 1 trajectory of DemoAgent-gpt-4o
ALL = [OM2W, AGENTLAB, TRAJ / "online_mind2web_v2", TRAJ / "jsonl" / "trajectories.jsonl"]
N_TRAJECTORIES, N_SCREENSHOTS = 6, 20
UNSET_KEY = "KEYSHOT_FIRST_HOUR_NO_SUCH_KEY"


def dead_url() -> str:
    """The URL of a port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/v1"


def fake_judge_args(url: str) -> list[str]:
    return [f"judge.base_url={url}", "judge.model=fake-judge", "judge.api_key_env=null", "judge.timeout_s=10"]


def judge(paths: list[Path], out: Path, url: str, *extra: str, config: str = REFERENCE) -> int:
    argv = ["judge", *map(str, paths), "--config", config, "--out", str(out), "--no-progress"]
    return keyshot([*argv, *fake_judge_args(url), *extra])


def estimate_rows(printed: str) -> dict[str, list[str]]:
    """The dry run's estimate table: endpoint role -> its cells."""
    rows = [line.strip("|").split("|") for line in printed.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_dry_run_with_a_dead_endpoint_says_what_it_would_judge_then_the_endpoint(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["judge", *map(str, ALL), "--config", REFERENCE, "--out", str(out), "--dry-run"]
    assert keyshot([*argv, f"judge.api_key_env={UNSET_KEY}"]) == EXIT_PREFLIGHT  # no key yet
    printed = capsys.readouterr()
    assert f"dry run: {N_TRAJECTORIES} trajectories found" in printed.out
    assert f"{N_TRAJECTORIES} to judge with {N_SCREENSHOTS} screenshots" in printed.out
    assert "not judged: none" in printed.out
    judge_row = estimate_rows(printed.out)["judge"]
    # the reference configuration: the judge scores every screenshot, then key points and outcome
    assert judge_row[0] == "gpt-4o-2024-11-20" and int(judge_row[1]) == N_SCREENSHOTS + 2 * N_TRAJECTORIES
    assert float(judge_row[4]) > 0 and judge_row[5] == "100.00"  # priced by the config, its budget
    assert "the inputs above are checked; the endpoints are not ready" in printed.err
    assert "cannot connect" not in printed.err  # no key: nothing was sent
    assert f"{UNSET_KEY} is not set" in printed.err and "No API key yet?" in printed.err
    assert not out.exists()  # a dry run writes nothing

    # keyshot's own configuration: the 7B scorer takes the screenshots off the judge, which costs less
    argv = ["judge", *map(str, ALL), "--config", WEBJUDGE7B, "--out", str(out), "--dry-run"]
    argv += [f"judge.base_url={dead_url()}", f"scorer.endpoint.base_url={dead_url()}"]
    assert keyshot(argv) == EXIT_PREFLIGHT
    rows = estimate_rows(capsys.readouterr().out)
    assert int(rows["judge"][1]) == 2 * N_TRAJECTORIES and int(rows["scorer"][1]) == N_SCREENSHOTS
    assert 0 < float(rows["judge"][4]) < float(judge_row[4]) and float(rows["scorer"][4]) == 0


def test_dry_run_says_why_the_rest_is_not_judged(tmp_path, capsys):
    out = tmp_path / "o"
    crashed = TRAJ / "agentlab_crashed"
    with FakeOpenAI(make_judge()) as server:
        assert judge([OM2W], out, server.base_url) == 0
        calls = server.stats.completions_served
        capsys.readouterr()
        argv = ["judge", str(OM2W), str(OM2W), str(AGENTLAB), str(crashed), "--config", REFERENCE]
        argv += ["--out", str(out), "--dry-run", "--append", *fake_judge_args(server.base_url)]
        assert keyshot(argv) == 0
        assert server.stats.completions_served == calls  # preflight lists models; no model was called
    printed = capsys.readouterr().out
    assert "1 to judge with 7 screenshots" in printed
    assert (
        f"not judged: 2 already judged in {out}; 2 duplicates of another trajectory; 1 could not be loaded"
        in printed
    )
    assert "  not loaded: " in printed and "trajectory has no screenshots" in printed
    assert printed.rstrip().endswith("endpoints reachable, keys accepted, models served; nothing was called")


def test_judging_released_judge_records_points_at_the_commands_that_read_them(tmp_path, capsys):
    """AgentRewardBench's released WebJudge records are verdicts: keyshot judge names the two commands
    that read them (metrics, synth import-arb), with the judges found there."""
    records = paths.FIXTURES / "arb"
    argv = ["judge", str(records), "--config", REFERENCE, "--out", str(tmp_path / "o"), "--dry-run"]
    assert keyshot(argv + fake_judge_args(dead_url())) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{records / 'index.csv'} looks like AgentRewardBench's released judge records" in err
    assert f"keyshot metrics --arb-index {records / 'index.csv'} --arb-judge webjudge_7B" in err
    assert "judges there: webjudge_7B, webjudge_gpt4o, webjudge_o4_mini" in err
    assert f"keyshot synth import-arb {records} --run RUN" in err


def test_a_run_that_failed_at_preflight_leaves_a_folder_another_config_may_use(tmp_path, capsys):
    out = tmp_path / "o"
    argv = ["judge", str(OM2W), "--config", WEBJUDGE7B, "--out", str(out), "--no-progress"]
    argv += [
        f"judge.base_url={dead_url()}",
        f"judge.api_key_env={UNSET_KEY}",
        f"scorer.endpoint.base_url={dead_url()}",
    ]
    assert keyshot(argv) == EXIT_PREFLIGHT
    assert not (out / "run.json").exists() and not (out / "verdicts.jsonl").exists()
    capsys.readouterr()
    with FakeOpenAI(make_judge()) as server:
        assert judge([OM2W], out, server.base_url) == 0  # another protocol: the reference configuration
    protocol = json.loads((out / "run.json").read_text())["protocol"]
    assert protocol["judge_model"] == "fake-judge" and protocol["scorer_backend"] == "none"
    assert len(read_verdicts(out / "verdicts.jsonl")) == 2
    # the folder now holds verdicts: another protocol is refused, as before
    assert keyshot(argv) == EXIT_USAGE
    assert "holds verdicts of another protocol" in capsys.readouterr().err


def test_other_inputs_are_refused_naming_counts_and_mixed_with_append(tmp_path, capsys):
    out = tmp_path / "o"
    with FakeOpenAI(make_judge()) as server:
        assert judge([OM2W], out, server.base_url) == 0
        before = (out / "verdicts.jsonl").read_bytes()
        capsys.readouterr()
        assert judge([AGENTLAB, TRAJ / "online_mind2web_v2"], out, server.base_url) == EXIT_USAGE
        err = capsys.readouterr().err
        assert (
            f"{out} holds verdicts of 2 trajectories that are not in this input; of this input's 2, 0 are "
            "judged there and 2 would be added beside them: pass --append" in err
        )
        assert (out / "verdicts.jsonl").read_bytes() == before
        # the dry run says the same before anything is called
        dry = ["judge", str(AGENTLAB), "--config", REFERENCE, "--out", str(out), "--dry-run"]
        assert keyshot([*dry, *fake_judge_args(server.base_url)]) == EXIT_USAGE
        assert "pass --append" in capsys.readouterr().err
        assert judge([AGENTLAB, TRAJ / "online_mind2web_v2"], out, server.base_url, "--append") == 0
        assert len(read_verdicts(out / "verdicts.jsonl")) == 4
        calls = server.stats.completions_served
        # the same folders again, all of them, or only some: nothing to add, nothing refused
        assert judge([OM2W, AGENTLAB, TRAJ / "online_mind2web_v2"], out, server.base_url) == 0
        assert judge([OM2W], out, server.base_url) == 0
        assert server.stats.completions_served == calls
    capsys.readouterr()


def test_demo_table_keeps_the_end_of_long_ids(tmp_path):
    with FakeOpenAI(make_judge()) as server:
        assert judge([OM2W], tmp_path / "o", server.base_url) == 0
    lines = (tmp_path / "o" / "verdicts.jsonl").read_text().splitlines()
    ids = [f"2025-01-02_11-00-06_DemoAgentArgs_on_workarena.servicenow.order-item_{i}" for i in (7, 12)]
    rows = []
    for task_id, line in zip(ids, lines, strict=True):
        rows.append(json.dumps({**json.loads(line), "task_id": task_id}) + "\n")
    (tmp_path / "v.jsonl").write_text("".join(rows))
    table = verdict_table(read_verdicts(tmp_path / "v.jsonl")).splitlines()[2:]
    shown = [row.split("|")[1].strip() for row in table]
    assert shown[0] != shown[1] and all(len(s) == ID_WIDTH and ELLIPSIS in s for s in shown)
    assert shown[0].startswith("2025-01-02_11-00-") and shown[0].endswith("order-item_7")
    assert "MEANINGLESS" in MEANINGLESS and "UNTRAINED" in MEANINGLESS


def test_report_explains_its_protocol_line_and_has_no_row_for_an_unnamed_agent(tmp_path):
    out = tmp_path / "o"
    with FakeOpenAI(make_judge()) as server:
        assert judge([OM2W, AGENTLAB], out, server.base_url, "--report") == 0
    index = Page((out / "report" / "index.html").read_text())
    text = [t.strip() for t in index.text if t.strip()]
    assert (
        "δ = 3.0: a screenshot whose score on the 1–5 scale is at least 3.0 is kept; at most 50 screenshots "
        "are kept per trajectory for the outcome call" in text
    )
    start = text.index("By agent")
    agent_table = text[start : text.index("Trajectories", start)]
    assert "DemoAgent-gpt-4o" in agent_table and "—" not in agent_table
    assert any(re.fullmatch(r"2 trajectories name no agent: not in this table.*", t) for t in agent_table)


def test_the_direct_demo_command_finds_vllm_beside_its_venv(monkeypatch):
    """``python -m keyshot.infer.demo`` without --vllm-python: $KEYSHOT_VLLM_PYTHON, else the .venv-vllm
    that make setup-vllm puts beside .venv (issue 35 item 12)."""
    import sys

    from keyshot.infer.demo import default_vllm_python

    monkeypatch.delenv("KEYSHOT_VLLM_PYTHON", raising=False)
    beside = Path(sys.prefix).parent / ".venv-vllm" / "bin" / "python"
    assert default_vllm_python() == (str(beside) if beside.exists() else None)
    monkeypatch.setenv("KEYSHOT_VLLM_PYTHON", "/opt/vllm/bin/python")
    assert default_vllm_python() == "/opt/vllm/bin/python"
