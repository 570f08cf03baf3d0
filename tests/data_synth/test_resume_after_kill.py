"""kill -9 of a `keyshot synth run` process, then the same command again: the run completes and no
call whose answer reached the run is paid twice (counters of two teacher servers in subprocesses)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.infer.testing.fake_openai import fetch_stats, spawn_fake_openai
from keyshot.infer.testing.watch import kill_when
from tests.support import paths
from tests.support.synth_env import fixture_trajectories, teacher_set, write_config

ROOT = paths.REPO
N_TRAJ, N_SHOTS = 6, 20
UNIQUE_CALLS = N_TRAJ + 2 * N_SHOTS  # key points once per trajectory, every screenshot by both teachers


def _synth(config: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "keyshot.infer.cli", "synth", "run", "--config", str(config), "--no-build"]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _label_lines(run: Path) -> int:
    path = run / LABELS_FILE
    if not path.exists():
        return 0
    return sum('"kind": "label"' in line for line in path.read_text(encoding="utf-8").splitlines())


def test_kill_minus_9_then_resume_repays_nothing(tmp_path):
    run = tmp_path / "run"
    with (
        spawn_fake_openai("teacher:brightness", latency_s=0.08) as (bright_url, _),
        spawn_fake_openai("teacher:darkness", latency_s=0.08) as (dark_url, _),
    ):
        one_at_a_time = {"max_concurrency": 1}
        teachers = teacher_set(
            {"bright": bright_url, "dark": dark_url}, bright=one_at_a_time, dark=one_at_a_time
        )
        teachers["key_points_judge"]["endpoint"]["max_concurrency"] = 1
        config = write_config(tmp_path / "synth.yaml", run, teachers)

        proc = _synth(config)
        kill_when(proc, lambda: _label_lines(run) >= 8, "8 labels were written")
        proc.stdout.close()
        at_kill = _label_lines(run)
        assert at_kill < 2 * N_SHOTS, "the run finished before the kill; the test proves nothing"

        resumed = _synth(config)
        out, _ = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, out
        served = [fetch_stats(u, settled=True).completions_served for u in (bright_url, dark_url)]

        # every screenshot is labelled once, by both teachers
        contents = read_store(run / LABELS_FILE)
        uids = {t.uid for t in fixture_trajectories()}
        assert {uid for uid, _, _ in contents.labels} == uids
        assert len(contents.labels) == 2 * N_SHOTS and all(lb.valid for lb in contents.labels.values())
        # the resumed run skipped what the killed one had recorded (a torn last line aside), and repaid
        # at most the calls in flight when it died: one per teacher server (concurrency 1 on each)
        new, skipped = map(
            int, re.search(r"labels: (\d+) new, \d+ of them failed, (\d+) already done", out).groups()
        )
        assert new + skipped == 2 * N_SHOTS and skipped >= at_kill - 1
        assert UNIQUE_CALLS <= sum(served) <= UNIQUE_CALLS + 2

        # once complete, running again sends nothing at all
        requests = [fetch_stats(bright_url).requests, fetch_stats(dark_url).requests]
        again = _synth(config)
        out, _ = again.communicate(timeout=120)
        assert again.returncode == 0, out
        assert [fetch_stats(bright_url).requests, fetch_stats(dark_url).requests] == requests
        assert "labels: 0 new" in out


def test_a_run_folder_with_the_old_run_json_resumes(tmp_path):
    """Synthesis run folders written before run.json had one format hold the manifest itself at the top
    of run.json: such a folder resumes (nothing done is asked again) and its record is kept, sessions
    included, in today's format."""
    from keyshot.data_synth.labelling_run import run_synth
    from keyshot.infer.testing.fake_openai import FakeOpenAI, make_teacher
    from tests.support.synth_env import RULES, synth_config

    run = tmp_path / "run"
    with FakeOpenAI(make_teacher(RULES["bright"])) as bright, FakeOpenAI(make_teacher(RULES["dark"])) as dark:
        teachers = teacher_set({"bright": bright.base_url, "dark": dark.base_url})
        part = synth_config(tmp_path / "part.yaml", run, teachers, max_trajectories=2)
        first = run_synth(part, build=False)
        assert first.exit_code == 0 and first.labels_new > 0
        manifest = json.loads((run / "run.json").read_text(encoding="utf-8"))["manifest"]
        (run / "run.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")  # the old format

        whole = synth_config(tmp_path / "whole.yaml", run, teachers)
        resumed = run_synth(whole, build=False)
        assert resumed.exit_code == 0
        assert resumed.labels_skipped == first.labels_new and resumed.labels_new > 0
        requests = len(bright.requests) + len(dark.requests)
        again = run_synth(whole, build=False)
        assert again.labels_new == 0 and len(bright.requests) + len(dark.requests) == requests

    record = json.loads((run / "run.json").read_text(encoding="utf-8"))
    assert set(record) == {"manifest"}
    assert {k: record["manifest"][k] for k in ("prompt_version", "image_policy", "parse_mode")} == {
        k: manifest[k] for k in ("prompt_version", "image_policy", "parse_mode")
    }
    assert [s["kind"] for s in record["manifest"]["sessions"]] == ["run", "run", "run"]
