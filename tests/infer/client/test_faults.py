"""Trust under faults and hostile input: no verdict from a failed call, a breaker per endpoint, one
writer per run folder, no secret written, a protocol fingerprint per run, config ranges, and the
reference configuration's exact request parameters."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.processes import free_port
from keyshot.infer.protocol.verdicts import latest_verdicts, read_verdicts
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories
from tests.support import paths

REPO = paths.REPO
WEBJUDGE7B = str(REPO / "configs/judge/webjudge7b.yaml")
REFERENCE = str(REPO / "configs/judge/reference_gpt4o.yaml")
N_TRAJ, N_SHOTS = 12, 4


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return synthetic_trajectories(tmp_path_factory.mktemp("world"), N_TRAJ, N_SHOTS, seed=3)


def judge_argv(world: Path, out: Path, judge_url: str, scorer_url: str, *extra: str) -> list[str]:
    return [
        "judge",
        str(world),
        "--config",
        WEBJUDGE7B,
        "--no-progress",
        f"out={out}",
        f"judge.base_url={judge_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        "judge.backoff_base_s=0.01",
        f"scorer.endpoint.base_url={scorer_url}",
        "scorer.endpoint.model=fake-scorer",
        "scorer.endpoint.backoff_base_s=0.01",
        "scorer.logprobs=null",
        *extra,
    ]


def outcome_of(v) -> tuple:
    return (v.success, v.kept, [s.score for s in v.screenshots], v.key_points)


@pytest.fixture(scope="module")
def clean_run(world, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("clean") / "run"
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url)) == 0
        scorer_calls = scorer.stats.completions_served
    verdicts = {v.task_id: outcome_of(v) for v in read_verdicts(out / "verdicts.jsonl")}
    assert len(verdicts) == N_TRAJ
    return {"verdicts": verdicts, "scorer_calls": scorer_calls}


def test_half_failing_scorer_keeps_no_wrong_verdict_and_a_rerun_repays_nothing(
    world, clean_run, tmp_path, capsys
):
    out = tmp_path / "run"
    faults = FaultPlan({"500": 0.3, "429": 0.2}, seed=1)
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge(), faults=faults) as scorer:
        code = keyshot(
            judge_argv(world, out, judge.base_url, scorer.base_url, "scorer.endpoint.max_retries=1")
        )
        answered = scorer.stats.completions_served
    err = capsys.readouterr().err
    verdicts = latest_verdicts(read_verdicts(out / "verdicts.jsonl"))
    assert len(verdicts) == N_TRAJ  # nothing lost
    incomplete = [v for v in verdicts if not v.finished]
    assert incomplete, "with 50% faults and one retry some scorer calls must give up"
    assert code == 3 and f"{len(incomplete)} trajectories incomplete; re-run the same command" in err
    for v in verdicts:
        if v.finished:
            assert outcome_of(v) == clean_run["verdicts"][v.task_id]  # a kept verdict is the clean one
        else:
            assert v.success is None and v.outcome_calls == [] and v.incomplete
            assert v.error.startswith("key screenshots: incomplete")
            assert any(s.call_failed for s in v.screenshots)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["incomplete"] == len(incomplete)
    assert {t["task_id"] for t in summary["incomplete_trajectories"]} == {v.task_id for v in incomplete}

    # the same command against a healthy scorer: only the failed calls are paid, all verdicts are clean
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url)) == 0
        repaid = scorer.stats.completions_served
        assert judge.stats.completions_served == len(incomplete)  # their outcome calls only
    assert repaid == clean_run["scorer_calls"] - answered
    final = latest_verdicts(read_verdicts(out / "verdicts.jsonl"))
    assert {v.task_id: outcome_of(v) for v in final} == clean_run["verdicts"]
    assert len(read_verdicts(out / "verdicts.jsonl")) == N_TRAJ + len(incomplete)  # a new line each


def test_allow_partial_keeps_the_reference_behaviour_and_says_so(world, tmp_path):
    out = tmp_path / "run"
    faults = FaultPlan(script=["500"])  # the first scorer request fails and, with no retry, its call
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge(), faults=faults) as scorer:
        argv = judge_argv(
            world, out, judge.base_url, scorer.base_url, "scorer.endpoint.max_retries=0", "concurrency=1"
        )
        assert keyshot([*argv, "--allow-partial"]) == 0
    verdicts = read_verdicts(out / "verdicts.jsonl")
    partial = [v for v in verdicts if v.partial]
    assert len(partial) == 1 and partial[0].finished and partial[0].success is not None
    failed = [s for s in partial[0].screenshots if s.call_failed]
    assert len(failed) == 1 and failed[0].score == 0 and failed[0].index not in partial[0].kept
    assert all(v.config["allow_partial"] for v in verdicts)


def test_an_endpoint_that_fails_everything_trips_the_breaker(world, tmp_path, capsys):
    out = tmp_path / "run"
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        argv = judge_argv(world, out, judge.base_url, scorer.base_url)
        argv.remove("judge.backoff_base_s=0.01")  # the shipped backoff
        started = time.monotonic()
        code = keyshot(argv)
        elapsed = time.monotonic() - started
        requests = judge.stats.requests
        url = judge.base_url
    err = capsys.readouterr().err
    assert code == 4
    assert requests <= 60 and elapsed < 90, (requests, elapsed)
    assert re.search(
        rf"endpoint 'fake-judge' at {re.escape(url)} is down: \d+ requests in a row failed \(last: HTTP 500",
        err,
    )
    assert "re-run the same command" in err
    assert not read_verdicts(out / "verdicts.jsonl")  # nothing half-judged was written


def test_second_writer_is_refused_naming_the_holder(world, tmp_path, capsys):
    out = tmp_path / "run"
    with RunLock(out, what="keyshot judge (the first terminal)"):
        code = keyshot(judge_argv(world, out, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"))
    assert code == 2
    err = capsys.readouterr().err
    assert "another keyshot process is writing here" in err and f"pid {os.getpid()}" in err
    assert "(the first terminal)" in err and "--wait" in err


def test_second_process_is_refused_at_once(world, tmp_path):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"from keyshot.infer.runs.lock import RunLock; import time\nwith RunLock({str(out)!r}): time.sleep(30)",
        ],
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 20
        while not (out / ".lock").exists() or not (out / ".lock").read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        started = time.monotonic()
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "keyshot.infer.cli",
                *judge_argv(world, out, "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and time.monotonic() - started < 20
        assert f"pid {holder.pid}" in proc.stderr and proc.stderr.count("\n") <= 2, proc.stderr
    finally:
        holder.kill()
        holder.wait()


def test_stale_lock_is_taken_over_with_a_warning(world, tmp_path, caplog):
    out = tmp_path / "run"
    out.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (out / ".lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "command": "old"}))
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url, "limit=1")) == 0
    assert f"taking over a stale lock left by pid {dead.pid}" in caplog.text


def test_an_api_key_in_the_name_field_is_refused_without_echoing_it(world, tmp_path, capsys):
    key = "sk-proj-4f8a9c0d1e2b3a4f5e6d7c8b"
    code = keyshot(
        judge_argv(
            world,
            tmp_path / "run",
            "http://127.0.0.1:9/v1",
            "http://127.0.0.1:9/v1",
            f"judge.api_key_env={key}",
        )
    )
    err = capsys.readouterr().err
    assert code == 2 and "api_key_env must name an environment variable" in err
    assert "'sk-p…'" in err and key[4:] not in err


def test_a_config_error_names_its_overrides_without_their_secrets(world, tmp_path, capsys):
    """A config error names the command line overrides it came from; a key's value and a URL's password
    in them are not printed."""
    argv = judge_argv(
        world,
        tmp_path / "run",
        "https://someone:hunter2-pass@127.0.0.1:9/v1",
        "http://127.0.0.1:9/v1",
        "judge.access_token=abcd1234secretvalue",
        "judge.modle=oops",
    )
    assert keyshot(argv) == 2
    err = capsys.readouterr().err
    assert "command line override" in err and "'modle' (did you mean 'model'?)" in err
    assert "'judge.access_token=abcd…'" in err
    assert "hunter2-pass" not in err and "1234secretvalue" not in err


def test_no_secret_reaches_a_file_or_the_terminal(world, tmp_path, capsys, monkeypatch):
    key, password = "sk-live-KEYSHOT-SECRET-0123456789", "hunter2-url-password"
    monkeypatch.setenv("KEYSHOT_TEST_JUDGE_KEY", key)
    out = tmp_path / "run"
    faults = FaultPlan(script=["500", "429"])  # error bodies quote the Authorization header
    with (
        FakeOpenAI(make_judge(), faults=faults, leak_auth_in_errors=True) as judge,
        FakeOpenAI(make_judge()) as scorer,
    ):
        url = judge.base_url.replace("http://", f"http://user:{password}@")
        argv = judge_argv(
            world,
            out,
            url,
            scorer.base_url,
            "judge.api_key_env=KEYSHOT_TEST_JUDGE_KEY",
            "limit=3",
        )
        assert keyshot(["--verbose", *argv]) == 0
        assert judge.auth_headers and all(judge.auth_headers)  # credentials were sent (URL's win in httpx)
    printed = capsys.readouterr()
    for secret in (key, password):
        assert secret not in printed.out + printed.err
        for path in out.rglob("*"):
            if path.is_file():
                assert secret.encode() not in path.read_bytes(), path
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["config"]["judge"]["base_url"].startswith("http://***@127.0.0.1:")


def test_another_protocol_on_the_same_folder_is_refused(world, tmp_path, capsys):
    out = tmp_path / "run"
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url, "limit=2")) == 0
        before = (out / "verdicts.jsonl").read_bytes()
        code = keyshot(
            judge_argv(world, out, judge.base_url, scorer.base_url, "limit=2", "pipeline.threshold=4")
        )
    err = capsys.readouterr().err
    assert code == 2 and "threshold: 3.0 in the folder, 4.0 now" in err and "use a new --out" in err
    assert (out / "verdicts.jsonl").read_bytes() == before


def test_a_folder_from_before_the_prompt_variant_rename_resumes(world, tmp_path, capsys):
    """run.json files that still say ``variant`` are read as ``prompt_variant``: the folder resumes."""
    out = tmp_path / "run"
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url, "limit=2")) == 0
        run = json.loads((out / "run.json").read_text())
        run["protocol"]["variant"] = run["protocol"].pop("prompt_variant")
        (out / "run.json").write_text(json.dumps(run))
        calls = judge.stats.requests
        assert keyshot(judge_argv(world, out, judge.base_url, scorer.base_url, "limit=2")) == 0
        assert judge.stats.requests == calls  # nothing judged again
    capsys.readouterr()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("concurrency=0", "concurrency must be >= 1, got 0"),
        ("pipeline.threshold=99", "pipeline: threshold must be within the score scale [1, 5], got 99"),
        ("judge.timeout_s=0", "timeout_s must be > 0"),
        ("judge.max_tokens=0", "max_tokens must be >= 1"),
        ("scorer.batch_size=0", "batch_size must be >= 1"),
        ("scorer.tower_cuda_graphs=2", "tower_cuda_graphs needs the in-process scorer on a GPU"),
        ("concurency=2", "unknown key(s) 'concurency' (did you mean 'concurrency'?)"),
    ],
)
def test_impossible_values_are_refused_naming_the_key(world, tmp_path, capsys, override, message):
    code = keyshot(
        judge_argv(world, tmp_path / "run", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1", override)
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_tower_cuda_graphs_take_any_cuda_device_and_are_refused_off_one():
    """One rule for a GPU device (local_scorer.on_cuda) in the config's check and the scorer's."""
    from keyshot.infer.judge.config import ScorerConfig
    from keyshot.infer.judge.local_scorer import TransformersScorer
    from keyshot.infer.protocol.prompts import load_prompt_set

    for device in ("cuda", "cuda:1"):
        assert ScorerConfig(backend="transformers", device=device, tower_cuda_graphs=2).tower_cuda_graphs == 2
    with pytest.raises(ValueError, match="tower_cuda_graphs needs the in-process scorer on a GPU"):
        ScorerConfig(backend="transformers", device="cpu", tower_cuda_graphs=2)
    # the scorer refuses before it reads the model folder
    with pytest.raises(ValueError, match="tower_cuda_graphs needs device cuda, not cpu"):
        TransformersScorer(
            "/nonexistent", load_prompt_set("online_mind2web"), device="cpu", tower_cuda_graphs=2
        )


def test_reference_configuration_sends_the_reference_request_parameters(world, tmp_path):
    with FakeOpenAI(make_judge()) as judge:
        argv = [
            "judge",
            str(world),
            "--config",
            REFERENCE,
            "--no-progress",
            f"out={tmp_path / 'run'}",
            "limit=2",
        ]
        argv += [f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]
        assert keyshot(argv) == 0
        bodies = list(judge.requests)
    assert len(bodies) == 2 * (N_SHOTS + 2)  # key points, every screenshot, outcome
    for body in bodies:
        assert {k: v for k, v in body.items() if k not in ("model", "messages")} == {
            "max_tokens": 512,
            "temperature": 0.0,
        }


# ----------------------------------------------------------------------------- nothing outside the input
V2 = paths.FIXTURES / "trajectories" / "online_mind2web_v2"


def _v2_copies(root: Path, n: int) -> list[Path]:
    import shutil

    src = next(p for p in V2.iterdir() if p.is_dir())
    folders = []
    for i in range(n):
        dst = root / "input" / f"task{i}"
        shutil.copytree(src, dst)
        data = json.loads((dst / "result.json").read_text())
        data["task_id"] = f"task{i}"
        data["task"] += f" (copy {i})"
        (dst / "result.json").write_text(json.dumps(data))
        folders.append(dst)
    return folders


def _point_first_screenshot_at(folder: Path, ref: str) -> None:
    data = json.loads((folder / "result.json").read_text())
    data["action_history"][0]["screenshot"] = ref
    (folder / "result.json").write_text(json.dumps(data))


def _load(root: Path, **kwargs) -> tuple[list, list]:
    from keyshot.infer.loaders import load_trajectories

    errors: list = []
    found = list(load_trajectories(root, on_error="skip", errors=errors, **kwargs))
    return found, errors


def test_screenshot_references_outside_the_input_are_refused(tmp_path):
    secret_dir = tmp_path / "home"
    secret_dir.mkdir()
    secret = secret_dir / "private.png"
    from PIL import Image

    Image.new("RGB", (64, 64), "red").save(secret)
    folders = _v2_copies(tmp_path, 4)
    _point_first_screenshot_at(folders[0], "../../home/private.png")  # a `..` escape
    _point_first_screenshot_at(folders[1], str(secret))  # an absolute path
    (folders[2] / "trajectory" / "escape.png").symlink_to(secret)  # a symlink inside that leads out
    _point_first_screenshot_at(folders[2], "escape.png")
    found, errors = _load(tmp_path / "input")
    assert [t.task_id for t in found] == ["task3"]  # the clean one is judged
    assert len(errors) == 3
    for err in errors:
        assert "is outside the input" in str(err) and "--allow-outside" in str(err)
    assert "'../../home/private.png'" in str(errors[0]) and str(folders[0] / "result.json") in str(errors[0])
    # the user can allow that folder explicitly
    found, errors = _load(tmp_path / "input", allow_outside=(secret_dir,))
    assert len(found) == 4 and not errors


def test_fifo_and_other_non_files_are_refused_without_opening(tmp_path):
    folders = _v2_copies(tmp_path, 3)
    fifo = folders[0] / "trajectory" / "pipe.png"
    os.mkfifo(fifo)
    _point_first_screenshot_at(folders[0], "pipe.png")
    (folders[1] / "result.json").unlink()
    os.mkfifo(folders[1] / "result.json")  # would block read_text() forever
    dangling = folders[2] / "trajectory" / "gone.png"
    dangling.symlink_to(folders[2] / "trajectory" / "nowhere.png")
    _point_first_screenshot_at(folders[2], "gone.png")
    started = time.monotonic()
    found, errors = _load(tmp_path / "input")
    assert time.monotonic() - started < 10 and not found
    messages = sorted(map(str, errors))
    assert any("pipe.png" in m and "not a regular file" in m for m in messages), messages
    assert any("result.json" in m and "not a regular file" in m for m in messages), messages
    assert any("gone.png" in m and "missing" in m for m in messages), messages


def test_judge_refuses_an_escaping_reference_and_judges_the_rest(tmp_path, capsys):
    folders = _v2_copies(tmp_path, 2)
    outside = tmp_path / "elsewhere.jpg"
    outside.write_bytes((folders[0] / "trajectory" / "0000.jpg").read_bytes())
    _point_first_screenshot_at(folders[0], "../../elsewhere.jpg")
    out = tmp_path / "run"
    with FakeOpenAI(make_judge()) as judge:
        argv = ["judge", str(tmp_path / "input"), "--config", REFERENCE, "--no-progress", f"out={out}"]
        argv += [f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]
        assert keyshot(argv) == 0
        sent = json.dumps(judge.requests)
    assert [v.task_id for v in read_verdicts(out / "verdicts.jsonl")] == ["task1"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run"]["load_errors"] == 1 and "elsewhere.jpg" in summary["run"]["load_error_messages"][0]
    assert "elsewhere.jpg" in capsys.readouterr().out  # listed in the printed summary
    assert "(copy 0)" not in sent and "(copy 1)" in sent  # nothing of the escaping trajectory was sent


# ----------------------------------------------------------------------------- preflight


@pytest.mark.parametrize("case", ["closed port", "key refused", "model not served", "variable missing"])
def test_preflight_fails_fast_naming_url_model_and_variable(world, tmp_path, capsys, monkeypatch, case):
    monkeypatch.setenv("KEYSHOT_TEST_KEY", "right-key")
    monkeypatch.delenv("KEYSHOT_TEST_UNSET", raising=False)
    out = tmp_path / "run"
    with (
        FakeOpenAI(
            make_judge(), model="gpt-4o", api_key="right-key" if case != "key refused" else "other"
        ) as judge,
        FakeOpenAI(make_judge()) as scorer,
    ):
        url = f"http://127.0.0.1:{free_port()}/v1" if case == "closed port" else judge.base_url
        argv = judge_argv(world, out, url, scorer.base_url, "judge.api_key_env=KEYSHOT_TEST_KEY")
        argv[argv.index("judge.model=fake-judge")] = "judge.model=" + (
            "gpt-5-typo" if case == "model not served" else "gpt-4o"
        )
        if case == "variable missing":
            argv.append("judge.api_key_env=KEYSHOT_TEST_UNSET")
        started = time.monotonic()
        code = keyshot(argv)
        elapsed = time.monotonic() - started
        chat_requests = judge.stats.requests + scorer.stats.requests
    err = capsys.readouterr().err
    assert code == 6 and elapsed < 10, (code, elapsed, err)
    assert chat_requests == 0  # nothing was paid
    assert err.count("\n") == 1 and "endpoint 'gpt" in err and "127.0.0.1" in err, err
    expected = {
        "closed port": "cannot connect",
        "key refused": "the key in $KEYSHOT_TEST_KEY was refused (HTTP 401)",
        "model not served": "model 'gpt-5-typo' is not served there; it serves: gpt-4o",
        "variable missing": "the environment variable KEYSHOT_TEST_UNSET is not set",
    }[case]
    assert expected in err
    assert not read_verdicts(out / "verdicts.jsonl")
