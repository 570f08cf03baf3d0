"""One set of episodes in two layouts (AgentLab runs, and the same runs as Online-Mind2Web folders whose
agent is unknown), labelled by two teachers and built into a dataset: no request is sent twice, identical
rows are one row with a count, no screenshot is in two splits, and the fractions are met by task groups
after the builder says why the agent split could not meet them."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections import Counter
from pathlib import Path

import pytest

from keyshot.data_synth.labelling_run import run_synth
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_teacher
from tests.support import synth_env
from tests.support.synth_env import RULES, synth_config, teacher_set

FRACTIONS = {"train": 0.6, "test": 0.4}


def _agentlab_copy(root: Path) -> Path:
    """The AgentLab runs; in the stuck one, step 5 shows the same screenshot bytes as step 4."""
    stuck = synth_env.agentlab_runs(root)
    shutil.copyfile(stuck / "screenshot_step_4.png", stuck / "screenshot_step_5.png")
    return root


@pytest.fixture(scope="module")
def two_layouts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_layouts")
    agentlab = _agentlab_copy(tmp / "agentlab")
    om2w = synth_env.as_online_mind2web(agentlab, tmp / "om2w")
    trajs = list(load_trajectories(agentlab))
    # the dark teacher answers some screenshots without a score, and is not asked again: such an
    # answer is never cached, yet the same request from the other layout must not be sent again
    with (
        FakeOpenAI(make_teacher(RULES["bright"])) as bright,
        FakeOpenAI(make_teacher(RULES["dark"], garbage_rate=0.3)) as dark,
    ):
        teachers = teacher_set(
            {"bright": bright.base_url, "dark": dark.base_url}, dark={"max_invalid_retries": 0}
        )
        cfg = synth_config(
            tmp / "synth.yaml",
            tmp / "run",
            teachers,
            sources=[{"path": str(agentlab)}, {"path": str(om2w)}],
            build={"splits": {"fractions": FRACTIONS}},
        )
        report = run_synth(cfg)
        yield {"report": report, "trajs": trajs, "bright": bright, "dark": dark}


def test_no_request_is_sent_twice(two_layouts):
    report, trajs = two_layouts["report"], two_layouts["trajs"]
    assert report.trajectories == 4 and report.labels_new == 2 * 2 * sum(t.num_screenshots for t in trajs)
    assert report.labels_failed > 0  # some of dark's answers had no score
    distinct_shots = len({hashlib.sha256(s.read_bytes()).digest() for t in trajs for s in t.screenshots})
    assert distinct_shots == sum(t.num_screenshots for t in trajs) - 1  # the stuck page
    bright, dark = (synth_env.request_bodies(two_layouts[name]) for name in ("bright", "dark"))
    assert max(bright.values()) == 1 and max(dark.values()) == 1, "a byte-identical request was sent twice"
    assert sum(bright.values()) == len(trajs) + distinct_shots  # key points once per task (the judge)
    assert sum(dark.values()) == distinct_shots


def test_identical_rows_are_one_row_with_a_count(two_layouts):
    from datasets import load_from_disk

    report, trajs = two_layouts["report"], two_layouts["trajs"]
    assert sum(t.num_screenshots for t in trajs) == 11
    dataset = load_from_disk(str(report.dataset.path))
    rows = [row for split in dataset for row in dataset[split]]
    keys = Counter(
        (hashlib.sha256(row["image"].tobytes()).hexdigest(), json.dumps(row["messages"][:-1])) for row in rows
    )
    assert max(keys.values()) == 1
    # every labelled screenshot of both layouts is counted once, in the row it was collapsed into
    assert sum(row["count"] for row in rows) == 2 * sum(t.num_screenshots for t in trajs)
    assert len(rows) == sum(t.num_screenshots for t in trajs) - 1
    assert sorted(Counter(row["count"] for row in rows).items()) == [(2, len(rows) - 1), (4, 1)]
    assert {row["agent"] for row in rows} == {"DemoAgent-gpt-4o"}  # the copy that names its agent is kept
    assert report.dataset.meta.duplicates == {"rows_collapsed": 22 - len(rows), "score_conflicts": 0}


def test_no_screenshot_is_in_two_splits_and_the_fallback_is_said(two_layouts):
    from datasets import load_from_disk

    report = two_layouts["report"]
    dataset = load_from_disk(str(report.dataset.path))
    splits_of: dict[str, set[str]] = {}
    for split in dataset:
        for row in dataset[split]:
            splits_of.setdefault(hashlib.sha256(row["image"].tobytes()).hexdigest(), set()).add(split)
    assert sorted(dataset) == ["test", "train"]
    assert all(len(s) == 1 for s in splits_of.values())
    info = report.dataset.meta.splits
    # one agent (the unknown copies share its screenshots): the agent split leaves test empty
    assert info["unit"] == "task group" and "test would get no row" in info["reason"]
    assert info["requested"] == FRACTIONS and info["screenshots_in_two_splits"] == 0
    assert info["grouped_trajectories"] == 4 and info["groups"] == 2
    for split, share in FRACTIONS.items():
        assert abs(info["achieved"][split] - share) <= 0.1
        assert info["achieved"][split] == pytest.approx(
            len(dataset[split]) / sum(map(len, dataset.values())), abs=1e-3
        )
    card = (report.dataset.path / "README.md").read_text(encoding="utf-8")
    assert "Split by task group" in card and info["reason"] in card
    assert f"duplicate rows collapsed: {report.dataset.meta.duplicates['rows_collapsed']} rows" in card
    assert "screenshots in more than one split: 0" in card


def test_the_builder_warns_when_it_falls_back(two_layouts, tmp_path, caplog):
    from keyshot.data_synth.dataset import BuildConfig, build_dataset
    from keyshot.data_synth.splits import SplitConfig

    run = Path(two_layouts["report"].dataset.path).parent
    with caplog.at_level(logging.WARNING, logger="keyshot.data_synth.splits"):
        build_dataset(
            run, BuildConfig(splits=SplitConfig(fractions=FRACTIONS), output_dir=str(tmp_path / "d"))
        )
    assert any("splitting by agent cannot meet the requested fractions" in r.message for r in caplog.records)
