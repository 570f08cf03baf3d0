"""The built DatasetDict: round trip, images, token parity with the infer request, agent splits, card."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from keyshot.data_synth.dataset import BuildConfig, build_dataset
from keyshot.data_synth.dataset_meta import META_FILE, read_dataset_meta
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labelling_run import run_synth
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.data_synth.splits import SplitConfig, allocate
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from keyshot.infer.protocol.messages import scorer_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_teacher
from tests.support.synth_env import (
    LEAKY_SPLITS,
    RULES,
    SPLITS,
    expected_scores,
    fixture_trajectories,
    median_low,
    synth_config,
    teacher_set,
)

PROMPTS = load_prompt_set("online_mind2web")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dataset")
    with FakeOpenAI(make_teacher(RULES["bright"])) as bright, FakeOpenAI(make_teacher(RULES["dark"])) as dark:
        urls = {"bright": bright.base_url, "dark": dark.base_url}
        cfg = synth_config(tmp / "synth.yaml", tmp / "run", teacher_set(urls))
        report = run_synth(cfg)  # labels, then builds RUN/dataset
    assert report.dataset is not None
    return Path(cfg.run_dir), report.dataset


@pytest.fixture(scope="module")
def dataset(built):
    from datasets import load_from_disk

    return load_from_disk(str(built[1].path))


def test_round_trip_rows_and_consensus_scores(built, dataset):
    run, result = built
    trajs = {t.uid: t for t in fixture_trajectories()}
    assert sorted(dataset) == ["test", "train"]
    assert sum(len(dataset[s]) for s in dataset) == sum(t.num_screenshots for t in trajs.values())
    assert set(dataset["train"]["count"]) == {1}  # no two fixture rows are the same request
    assert result.meta.rows == {s: len(dataset[s]) for s in ("train", "test")}
    expected = {(uid, n): expected_scores(t, rule) for uid, t in trajs.items() for n, rule in RULES.items()}
    for split in dataset:
        for row in dataset[split]:
            traj = trajs[row["uid"]]
            scores = {n: expected[(row["uid"], n)][row["step"]] for n in RULES}
            assert row["score"] == median_low(list(scores.values()))
            assert {t["teacher"]: t["score"] for t in row["teacher_scores"]} == scores
            assert all(t["valid"] and t["error"] is None for t in row["teacher_scores"])
            assert row["answer"].endswith(f"**Score**: {row['score']}") and row["answer"].startswith(
                "**Reasoning**: "
            )
            assert row["messages"][-1] == {
                "role": "assistant",
                "content": [{"type": "text", "text": row["answer"]}],
            }
            assert row["prompt_version"] == PROMPTS.version
            assert row["task"] == traj.task and row["agent"] == traj.agent and row["task_id"] == traj.task_id
            assert row["teacher"] in RULES and sorted(row["teacher_models"]) == ["fake-bright", "fake-dark"]
            assert row["human_label"] == traj.human_label


def test_images_are_the_prepared_jpeg_bytes(dataset):
    from datasets import Image

    trajs = {t.uid: t for t in fixture_trajectories()}
    raw = dataset["train"].cast_column("image", Image(decode=False))
    for row, decoded in zip(raw, dataset["train"], strict=True):
        prepared = prepare_image(trajs[row["uid"]].screenshots[row["step"]].path, DEFAULT_POLICY)
        assert row["image"]["bytes"] == prepared.jpeg
        img = decoded["image"]
        assert img.size == (prepared.width, prepared.height)
        assert np.array_equal(np.asarray(img.convert("RGB")), np.asarray(prepared.pil()))


def test_row_renders_to_the_same_tokens_as_the_infer_request(built, dataset, tiny_model_dir):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(str(tiny_model_dir))
    contents = read_store(built[0] / LABELS_FILE)
    checked = 0
    for split in ("train", "test"):
        for row in dataset[split].select(range(2)):
            traj = contents.trajectories[row["uid"]]
            # what infer sends for this screenshot, rendered by the same processor
            request = scorer_messages(PROMPTS, traj.task, row["key_points"], image_url=None)
            prepared = prepare_image(Path(traj.screenshots[row["step"]]), DEFAULT_POLICY)
            want_text = processor.apply_chat_template(request, tokenize=False, add_generation_prompt=True)
            want = processor(text=[want_text], images=[prepared.pil()], return_tensors="np")
            # the dataset row without its answer turn, with the row's own image
            got_text = processor.apply_chat_template(
                row["messages"][:-1], tokenize=False, add_generation_prompt=True
            )
            got = processor(text=[got_text], images=[row["image"]], return_tensors="np")
            assert got_text == want_text
            assert got["input_ids"].tolist() == want["input_ids"].tolist()
            assert np.array_equal(got["pixel_values"], want["pixel_values"])
            assert np.array_equal(got["image_grid_thw"], want["image_grid_thw"])
            # the training form (with the answer) is the prompt followed by the target
            full = processor.apply_chat_template(row["messages"], tokenize=False)
            assert full.startswith(want_text) and row["answer"] in full[len(want_text) :]
            checked += 1
    assert checked == 4


def _split_of_images(dataset) -> dict[str, set[str]]:
    from datasets import Image

    out: dict[str, set[str]] = {}
    for split in dataset:
        for row in dataset[split].cast_column("image", Image(decode=False)):
            out.setdefault(hashlib.sha256(row["image"]["bytes"]).hexdigest(), set()).add(split)
    return out


def test_splits_are_by_agent_without_overlap(dataset):
    agents = {split: set(dataset[split]["agent"]) for split in dataset}
    assert agents == {split: set(names) for split, names in SPLITS.items()}
    assert all(len(splits) == 1 for splits in _split_of_images(dataset).values())


def test_listed_agents_that_share_screenshots_are_kept_together(built, tmp_path):
    # the old lists put SeeAct (train), Agent-E (validation) and Operator (test), whose fixture
    # trajectories share screenshot files, in three splits: their group goes where most of its rows are
    from datasets import load_from_disk

    run, _ = built
    result = build_dataset(
        run, BuildConfig(splits=SplitConfig(agents=LEAKY_SPLITS), output_dir=str(tmp_path / "d"))
    )
    dataset = load_from_disk(str(result.path))
    assert sorted(dataset) == ["train"]
    assert all(len(splits) == 1 for splits in _split_of_images(dataset).values())
    info = result.meta.splits
    assert info["unit"] == "agent lists" and info["moved"] == 2  # Agent-E's and Operator's trajectories
    assert info["screenshots_in_two_splits"] == 0 and info["shared_screenshots"] == 4
    card = (result.path / "README.md").read_text(encoding="utf-8")
    assert "2 trajectories were placed outside their agent's split" in card
    assert "| validation | listed | 0.000 | 0 |" in card


def test_hash_split_of_agents_is_seeded_and_disjoint():
    def assign(agents, cfg):  # agents of one row each, dealt out as the builder deals agent units
        return allocate(dict.fromkeys(agents, 1), cfg.shares(), cfg.seed)

    agents = [f"agent-{i}" for i in range(10)]
    cfg = SplitConfig(fractions={"train": 0.6, "validation": 0.2, "test": 0.2}, seed=3)
    split_of = assign(agents, cfg)
    assert split_of == assign(list(reversed(agents)), cfg)
    counts = {s: sum(v == s for v in split_of.values()) for s in ("train", "validation", "test")}
    assert counts == {"train": 6, "validation": 2, "test": 2}
    assert split_of != assign(agents, SplitConfig(seed=4))
    few = assign(["a", "b", "c"], SplitConfig(fractions={"train": 0.8, "validation": 0.1, "test": 0.1}))
    assert sorted(few.values()) == ["test", "train", "validation"]
    # by rows: one large agent fills train, the small ones the other splits
    by_rows = allocate({"big": 60, "mid": 25, "small": 15}, cfg.shares(), 0)
    assert by_rows == {"big": "train", "mid": "validation", "small": "test"}
    with pytest.raises(ValueError, match="listed in both"):
        SplitConfig(agents={"train": ["a"], "test": ["a"]})


def test_card_meta_and_dataset_info(built, dataset):
    _, result = built
    folder = result.path
    card = (folder / "README.md").read_text(encoding="utf-8")
    meta = read_dataset_meta(folder)
    assert meta.prompt_version == PROMPTS.version and meta.data_hash.startswith("sha256:")
    assert meta.image_policy == DEFAULT_POLICY.to_dict()
    assert meta.prompt_version in card and meta.data_hash in card
    assert "| bright | dark |" in card  # the agreement table's one pair
    for split, n in meta.rows.items():
        assert f"{split}: {n}" in card
    assert (folder / "scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    info = json.loads(dataset["train"].info.description)["keyshot"]
    assert info["data_hash"] == meta.data_hash and info["prompt_version"] == meta.prompt_version
    assert json.loads((folder / META_FILE).read_text())["rows"] == meta.rows


def test_rebuild_is_deterministic_and_replaces_the_folder(built, tmp_path):
    run, result = built
    # three threads prepare the images this time: same rows, same order, same hash
    cfg = BuildConfig(splits=SplitConfig(agents=SPLITS), output_dir=str(tmp_path / "again"), image_workers=3)
    again = build_dataset(run, cfg)
    assert again.meta.data_hash == result.meta.data_hash
    # a second build into the same folder replaces it whole
    cfg.aggregation.consensus = "majority"  # two teachers that disagree: the tie goes to the first listed
    cfg.aggregation.teacher_priority = ["bright"]  # median_low took the lower score, mostly dark's
    third = build_dataset(run, cfg)
    assert third.path == again.path and read_dataset_meta(third.path).aggregation["consensus"] == "majority"
    assert third.meta.data_hash != again.meta.data_hash
    from datasets import load_from_disk

    trajs = {t.uid: t for t in fixture_trajectories()}
    rows = load_from_disk(str(third.path))["train"]
    for row in rows:
        assert row["score"] == expected_scores(trajs[row["uid"]], RULES["bright"])[row["step"]]
    assert set(rows["teacher"]) == {"bright"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_build_refuses_another_image_policy_than_the_teachers_saw(built, tmp_path):
    run, _ = built
    other = dict(DEFAULT_POLICY.to_dict(), max_pixels=200_704)
    with pytest.raises(SynthError, match="teachers saw images under policy"):
        build_dataset(run, BuildConfig(image_policy=other, output_dir=str(tmp_path / "x")))
    with pytest.raises(SynthError, match="prompt version"):
        build_dataset(run, BuildConfig(prompt_variant="general", output_dir=str(tmp_path / "x")))


def test_read_dataset_meta_names_a_foreign_folder(tmp_path):
    with pytest.raises(SynthError, match="not built by keyshot"):
        read_dataset_meta(tmp_path)
