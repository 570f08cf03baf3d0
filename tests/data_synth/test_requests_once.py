"""Synthesis over one set of WorkArena episodes held in two layouts (AgentLab runs and their Online-Mind2Web
conversion, which re-saved the screenshot files), two teachers, outcome verdicts, four trajectories in
flight, and a run whose page did not change for many steps (its last screenshot repeated, some copies
byte-identical, some re-saved: other bytes, the same pixels): no byte-identical request reaches a
server twice, and no (image, request) row is kept twice."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image

from keyshot.data_synth.labelling_run import run_synth
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge, make_teacher
from keyshot.infer.testing.fake_requests import identify_step
from tests.support.synth_env import (
    RULES,
    agentlab_runs,
    as_online_mind2web,
    request_bodies,
    synth_config,
    teacher_set,
)

REPEATS = 16  # more copies of the stuck page than trajectories_in_flight x images_in_flight would hide


def _agentlab(root: Path) -> Path:
    """The AgentLab runs, the stuck one's last page repeated: some copies byte-identical, some saved again."""
    stuck = agentlab_runs(root)
    shots = sorted(stuck.glob("screenshot_step_*.png"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    page = Image.open(shots[-1])
    page.load()
    for i in range(len(shots), len(shots) + REPEATS):
        if i % 2:  # the page saved again: other bytes, the same pixels
            page.save(stuck / f"screenshot_step_{i}.png", compress_level=1 + i % 9)
        else:
            shutil.copyfile(shots[-1], stuck / f"screenshot_step_{i}.png")
    return root


def _silent_outcome_judge():
    """The fake judge, except that its outcome answers carry no status (malformed, never cached)."""
    judge = make_judge()
    return lambda request: "I looked at it." if identify_step(request) == "outcome" else judge(request)


@pytest.mark.slow
def test_two_layouts_of_a_stuck_run_send_no_request_twice(tmp_path):
    from datasets import load_from_disk

    agentlab = _agentlab(tmp_path / "agentlab")
    om2w = as_online_mind2web(agentlab, tmp_path / "om2w", resave=True)
    trajs = list(load_trajectories(agentlab))
    with (
        FakeOpenAI(make_teacher(RULES["bright"])) as bright,
        FakeOpenAI(make_teacher(RULES["dark"], garbage_rate=0.3)) as dark,
        FakeOpenAI(_silent_outcome_judge()) as judge,
    ):
        teachers = teacher_set(
            {"bright": bright.base_url, "dark": dark.base_url}, dark={"max_invalid_retries": 0}
        )
        teachers["key_points_judge"]["endpoint"].update(base_url=judge.base_url, max_invalid_retries=0)
        cfg = synth_config(
            tmp_path / "synth.yaml",
            tmp_path / "run",
            teachers,
            sources=[{"path": str(agentlab)}, {"path": str(om2w)}],
            trajectories_in_flight=4,
            outcome=True,
            build={"splits": {"fractions": {"train": 0.6, "test": 0.4}}},
        )
        report = run_synth(cfg)

    assert report.trajectories == 4 and not report.bad_trajectories
    bodies = request_bodies(bright, dark, judge)
    assert max(bodies.values()) == 1, "a byte-identical request was sent twice"
    assert report.labels_failed > 0  # some of dark's answers had no score; asked once all the same
    steps = Counter(identify_step(r) for r in judge.requests)
    assert steps == {"key_points": len(trajs), "outcome": 2 * len(trajs)}  # per episode and teacher, once

    pixels = {
        hashlib.sha256(Image.open(s.path).convert("RGB").tobytes()).digest()
        for t in trajs
        for s in t.screenshots
    }
    assert len({s.read_bytes() for t in trajs for s in t.screenshots}) > len(pixels)  # some pages re-saved
    assert len(bright.requests) == len(dark.requests) == len(pixels)  # each page scored once by each teacher

    dataset = load_from_disk(str(report.dataset.path))
    rows = [row for split in dataset for row in dataset[split]]
    keys = Counter(
        (hashlib.sha256(r["image"].tobytes()).hexdigest(), json.dumps(r["messages"][:-1])) for r in rows
    )
    assert max(keys.values()) == 1, "an identical (image, request) row was kept twice"
    labelled = 2 * sum(t.num_screenshots for t in trajs)  # both layouts, each screenshot once
    assert sum(r["count"] for r in rows) + sum(report.dataset.report.dropped.values()) == labelled
    assert max(r["count"] for r in rows) == 2 * (REPEATS + 1)  # the stuck page: one row
