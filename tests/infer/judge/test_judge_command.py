"""``keyshot judge``: verdict files, summaries, resume (also after ``kill -9``), budget stops."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import load_config, split_paths_and_overrides
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, fetch_stats, make_judge, spawn_fake_openai
from keyshot.infer.testing.watch import kill_when, line_count
from tests.support import paths
from tests.support.judge_inputs import ALL_PATHS, N_SCREENSHOTS, N_TRAJECTORIES, TRAJ, judge_overrides
from tests.support.vllm import vllm_request_count

REPO = paths.REPO
FIXTURES = paths.FIXTURES
REFERENCE_OUTPUT = (
    FIXTURES
    / "reference_outputs"
    / "WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json"
)


def lines_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_split_paths_and_overrides(tmp_path):
    odd = tmp_path / "a=b"
    odd.mkdir()
    assert split_paths_and_overrides(["runs/x", "out=o", "judge.model=m", str(odd)]) == (
        ["runs/x", str(odd)],
        ["out=o", "judge.model=m"],
    )


def test_shipped_judge_configs_load():
    configs = sorted((REPO / "configs" / "judge").glob("*.yaml"))
    assert {p.name for p in configs} >= {"webjudge7b.yaml", "reference_gpt4o.yaml", "tiny_cpu.yaml"}
    for path in configs:
        assert path.read_text().startswith("# keyshot judge")
        cfg = load_config(JudgeRunConfig, path)
        assert cfg.judge.model and cfg.pipeline.threshold == 3
    assert load_config(JudgeRunConfig, REPO / "configs/judge/reference_gpt4o.yaml").scorer.backend == "none"


def test_reference_run_writes_verdicts_and_resumes_for_free(tmp_path, capsys):
    out = tmp_path / "run"
    config = str(REPO / "configs/judge/reference_gpt4o.yaml")
    with FakeOpenAI(make_judge()) as server:
        argv = ["judge", *map(str, ALL_PATHS), "--config", config, "--no-progress"]
        assert keyshot([*argv, *judge_overrides(server.base_url, out)]) == 0
        first = server.stats.completions_served
        assert first == N_SCREENSHOTS + 2 * N_TRAJECTORIES  # reference configuration: N + 2 each
        printed = capsys.readouterr().out
        assert "keyshot judge summary" in printed and "| judge |" in printed

        verdicts = read_verdicts(out / "verdicts.jsonl")
        assert len(verdicts) == N_TRAJECTORIES and all(v.finished for v in verdicts)
        summary = json.loads((out / "summary.json").read_text())
        assert summary["trajectories"] == N_TRAJECTORIES and summary["run"]["judged"] == N_TRAJECTORIES
        assert summary["usage"]["judge"]["calls"] == first
        assert summary["success"] == sum(v.success is True for v in verdicts)
        assert (out / "summary.md").read_text().startswith("# keyshot judge summary")

        # A second run finds everything done: no call, no new line, same summary counts.
        assert keyshot([*argv, *judge_overrides(server.base_url, out)]) == 0
        assert server.stats.completions_served == first
        assert len(lines_of(out / "verdicts.jsonl")) == N_TRAJECTORIES
        again = json.loads((out / "summary.json").read_text())
        assert again["run"]["judged"] == 0 and again["run"]["skipped"] == N_TRAJECTORIES
        assert again["success_rate"] == summary["success_rate"]  # counts all verdicts, not just new ones

        # Deleting the verdicts re-judges from the call cache: still no new paid call.
        (out / "verdicts.jsonl").unlink()
        assert keyshot([*argv, *judge_overrides(server.base_url, out)]) == 0
        assert server.stats.completions_served == first
        assert json.loads((out / "summary.json").read_text())["usage"]["judge"]["cached"] == first


def test_resume_from_reference_output(tmp_path):
    trajectories = tmp_path / "om2w"
    shutil.copytree(TRAJ / "online_mind2web_v1", trajectories)
    # The reference already judged this task (its output names task id om2w-task-a).
    (trajectories / "48c73f3f53e2611c4a1052457c1033db").rename(trajectories / "om2w-task-a")
    out = tmp_path / "run"
    with FakeOpenAI(make_judge()) as server:
        argv = ["judge", str(trajectories), "--config", str(REPO / "configs/judge/reference_gpt4o.yaml")]
        argv += [
            "--resume-from",
            str(REFERENCE_OUTPUT),
            "--no-progress",
            *judge_overrides(server.base_url, out),
        ]
        assert keyshot(argv) == 0
        assert server.stats.completions_served == 3 + 2  # only the other task (3 screenshots) is judged
    rows = lines_of(out / "verdicts.jsonl")
    # om2w-task-b is in the reference output but not in the input: left out, and counted
    assert [r["task_id"] for r in rows] == ["om2w-task-a", "fb7b4f784cfde003e2548fdf4e8d6b4f"]
    assert rows[0]["record_format"] == "online_mind2web_run" and rows[1]["record_format"] == "keyshot"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 2 and summary["run"]["judged"] == 1 and summary["run"]["skipped"] == 1
    assert summary["run"]["resume_from_left_out"] == 1


def test_budget_stop_then_finish(tmp_path):
    out = tmp_path / "run"
    config = str(REPO / "configs/judge/reference_gpt4o.yaml")
    paths = [str(TRAJ / "online_mind2web_v1"), str(TRAJ / "online_mind2web_v2")]
    prices = {"judge.price_input_per_mtok": "1000", "judge.price_output_per_mtok": "1000", "concurrency": "1"}
    with FakeOpenAI(make_judge()) as server:
        argv = ["judge", *paths, "--config", config, "--no-progress"]
        code = keyshot(
            [*argv, *judge_overrides(server.base_url, out, **prices, **{"judge.budget_usd": "0.5"})]
        )
        assert code == 5  # stopped by the budget (its own exit code)
        partial = lines_of(out / "verdicts.jsonl") if (out / "verdicts.jsonl").exists() else []
        assert len(partial) < 3 and all(r["error"] is None for r in partial)
        paid = server.stats.completions_served
        assert (
            keyshot([*argv, *judge_overrides(server.base_url, out, **prices, **{"judge.budget_usd": "1000"})])
            == 0
        )
        rows = lines_of(out / "verdicts.jsonl")
        assert sorted(r["task_id"] for r in rows) == sorted({r["task_id"] for r in rows})  # no duplicates
        assert len(rows) == 3
        # The finishing run re-paid nothing the stopped run had received (all answers were cached).
        assert paid < (2 + 2) + (3 + 2) + (4 + 2)
        assert server.stats.completions_served == (2 + 2) + (3 + 2) + (4 + 2)


def test_config_errors_are_clear(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("judge: {base_url: http://127.0.0.1:1/v1, model: m}\npipeline: {treshold: 3}\n")
    assert keyshot(["judge", str(TRAJ / "agentlab"), "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "treshold" in err
    good = tmp_path / "good.yaml"
    good.write_text("judge: {base_url: http://127.0.0.1:1/v1, model: m}\nscorer: {backend: none}\n")
    assert keyshot(["judge", str(tmp_path / "nowhere"), "--config", str(good), f"out={tmp_path / 'o'}"]) == 2
    assert "nowhere" in capsys.readouterr().err


def _cache_rows(path: Path) -> dict[str, int]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT model, COUNT(*) FROM completions GROUP BY model").fetchall())


@pytest.mark.slow
def test_kill_9_and_resume_repays_nothing(vllm_server, scorer_checkpoint, tmp_path):
    """kill -9 a judging process mid-run, run it again: every trajectory once, no answer paid twice."""
    out = tmp_path / "run"
    cache = out / "calls.sqlite"
    with spawn_fake_openai("judge", latency_s=0.4) as (judge_url, _):
        argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", *map(str, ALL_PATHS)]
        argv += ["--config", str(REPO / "configs/judge/tiny_cpu.yaml"), "--no-progress"]
        argv += judge_overrides(judge_url, out, concurrency="2", **{"judge.max_concurrency": "2"})
        argv += [
            f"scorer.endpoint.base_url={vllm_server.base_url}",
            f"scorer.endpoint.model={vllm_server.model_name}",
            "scorer.endpoint.max_tokens=8",
            # the untrained model's answers are all cut: strict mode would stop the run (tests/infer/judge/test_evidence.py)
            "pipeline.parse_mode=reference",
            f"scorer.checkpoint={scorer_checkpoint}",
        ]
        vllm_before = vllm_request_count(vllm_server)
        proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        verdicts = out / "verdicts.jsonl"
        try:
            kill_when(proc, lambda: line_count(verdicts) >= 2, "2 verdicts were written", timeout_s=300)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}: {proc.stderr.read().decode()[-2000:]}") from None
        proc.stderr.close()

        done_at_kill = verdicts.read_bytes().count(b"\n")
        assert 2 <= done_at_kill < N_TRAJECTORIES
        judge_served_at_kill = fetch_stats(
            judge_url, settled=True
        ).completions_served  # the kill's in-flight calls done
        vllm_at_kill = vllm_request_count(vllm_server)
        rows_at_kill = _cache_rows(cache)

        resumed = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        rows_final = _cache_rows(cache)
        judge_served_final = fetch_stats(judge_url, settled=True).completions_served
        vllm_final = vllm_request_count(vllm_server)

    rows = lines_of(out / "verdicts.jsonl")
    keys = [(r["task_id"], r["agent"]) for r in rows]
    assert len(rows) == N_TRAJECTORIES and len(set(keys)) == N_TRAJECTORIES  # none lost, none twice
    assert all(r["error"] is None for r in rows)
    assert sum(r["usage"]["judge"]["calls"] for r in rows) == 2 * N_TRAJECTORIES
    judge_model, scorer_model = "fake-judge", vllm_server.model_name
    # Every call the resumed run paid for was one the killed run had not stored: nothing re-paid.
    assert judge_served_final - judge_served_at_kill == rows_final[judge_model] - rows_at_kill.get(
        judge_model, 0
    )
    assert vllm_final - vllm_at_kill == rows_final[scorer_model] - rows_at_kill.get(scorer_model, 0)
    # Over both runs: one judge answer per call, except those in flight at the kill (at most 2).
    assert rows_final[judge_model] == 2 * N_TRAJECTORIES
    assert 0 <= judge_served_final - rows_final[judge_model] <= 2
    assert rows_final[scorer_model] == N_SCREENSHOTS
    assert 0 <= (vllm_final - vllm_before) - N_SCREENSHOTS <= 4  # the scorer endpoint's concurrency
