"""Every shipped teacher set and synth config loads, names its command, and rejects bad keys by name."""

from __future__ import annotations

import pytest

from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.synth_config import load_build_config, load_synth_config
from keyshot.data_synth.teachers import load_teacher_set
from tests.support import paths

ROOT = paths.REPO
TEACHER_SETS = sorted((ROOT / "configs" / "teachers").glob("*.yaml"))
SYNTH_CONFIGS = sorted((ROOT / "configs" / "synth").glob("*.yaml"))


@pytest.mark.parametrize("path", TEACHER_SETS, ids=lambda p: p.name)
def test_teacher_sets_load(path):
    assert path.read_text(encoding="utf-8").startswith("# keyshot synth")
    teachers = load_teacher_set(path)
    for t in [teachers.key_points_judge, *teachers.teachers]:
        assert t.image_token_count(1280, 720) > 0
        if t.endpoint.needs_api_key():  # remote APIs: a key by environment variable, and a spending cap
            assert t.endpoint.api_key_env and t.endpoint.budget_usd


@pytest.mark.parametrize("path", SYNTH_CONFIGS, ids=lambda p: p.name)
def test_synth_configs_load(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # teacher-set paths in synth configs are relative to the repository
    assert path.read_text(encoding="utf-8").startswith("# keyshot synth")
    build = load_build_config(path, [])
    if "run_dir:" in path.read_text(encoding="utf-8"):
        cfg = load_synth_config(path)
        assert cfg.teacher_set().teachers and cfg.build == build
        names = set(cfg.teacher_set().names())
        assert set(build.aggregation.teacher_priority) <= names
    assert {"train"} <= set(build.splits.agents or build.splits.fractions)


def test_shipped_paper_config_is_the_paper_split():
    cfg = load_build_config(ROOT / "configs" / "synth" / "paper.yaml", [])
    assert cfg.splits.agents["train"] == ["SeeAct", "Browser_Use", "Claude_Computer_Use_3.5"]
    assert sorted(cfg.splits.agents["validation"] + cfg.splits.agents["test"]) == [
        "Agent-E",
        "Claude_Computer_Use_3.7",
        "Operator",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["build.aggregation.consensus=mode"], "'mode' is not one of"),
        (["build.aggregation.balance.max_score1_ratio=-1"], "max_score1_ratio must be >= 0"),
        (["bogus=1"], "unknown key"),
        (["trajectories_in_flight=0"], "must be >= 1"),
    ],
)
def test_bad_synth_settings_are_named(overrides, message, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SynthError, match=message):
        load_synth_config(ROOT / "configs" / "synth" / "paper.yaml", overrides)


def test_bad_teacher_set_names_the_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text("key_points_judge: {endpoint: {base_url: 'http://x', model: m}}\nteachers: []\n")
    with pytest.raises(SynthError, match=r"t.yaml: .*at least one teacher"):
        load_teacher_set(path)
    path.write_text(
        "key_points_judge: {endpoint: {base_url: 'http://x', model: m}}\n"
        "teachers: [{endpoint: {base_url: 'http://x', model: m}, image_tokens: pixels}]\n"
    )
    with pytest.raises(SynthError, match="image_tokens 'pixels' is not one of"):
        load_teacher_set(path)


def test_judge_and_teacher_may_not_share_a_name(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(
        "key_points_judge: {endpoint: {base_url: 'http://x', model: gpt-4o}}\nteachers: [{endpoint: {base_url: 'http://x', model: gpt-4o}}]\n"
    )
    with pytest.raises(SynthError, match="give the judge its own endpoint.name"):
        load_teacher_set(path)
