"""The plan is the render (docs/architecture.md, "One renderer"): a training row's planned length is the length the
processor renders, at the edges too (rows whose text leaves 0-10 visual tokens of room; tiny, huge and
extreme-aspect screenshots); a rendering off its plan is skipped, not fatal; ``--check`` renders the
shrunk rows first. And the checkpoint's answer length (``keyshot.json`` answer_tokens) reaches
``keyshot serve`` and ``keyshot judge``."""

from __future__ import annotations

import dataclasses
import logging
import shutil

import pytest
import torch
from PIL import Image, ImageDraw

from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.model.checkpoint import describe_checkpoint, read_meta, write_meta
from keyshot.infer.protocol.chat_template import (
    NO_IMAGE_ROOM,
    TEXT_TOO_LONG,
    DataError,
    DroppedRow,
    ExamplePlan,
    ScorerRenderer,
    image_policy_for,
    set_processor_pixel_bounds,
)
from keyshot.infer.protocol.messages import scorer_answer, scorer_example
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.images import encoded
from keyshot.train.batches import ScorerDataset, answer_token_stats
from keyshot.train.training_inputs import check_rendering

PROMPTS = load_prompt_set("online_mind2web")
#: Qwen2.5-VL-7B's own processor bounds (the tiny model's maximum is smaller).
QWEN_BOUNDS = (3136, 1003520)
EDGE_SIZES = [(1288, 728), (10, 10), (28, 28), (4000, 3000), (1288, 28), (28, 2000), (27, 5000), (5000, 27)]
ROOMS = range(-1, 11)  # visual tokens the text leaves: none (or less) up to 10


@pytest.fixture
def processor(tiny_model_dir):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(tiny_model_dir)


def _page(size: tuple[int, int]) -> Image.Image:
    width, height = size
    img = Image.new("RGB", size, (250, 250, 250))
    draw = ImageDraw.Draw(img)
    draw.rectangle([0, 0, width, max(1, height // 2)], fill=(40, 170, 70))
    draw.line([0, height - 1, width - 1, 0], fill=(20, 20, 20), width=3)
    return img


def _messages(words: int) -> list[dict]:
    reasoning = "The hours are shown" + " and" * words + "."
    return scorer_example(PROMPTS, "Find the hours", "\n1. Hours", scorer_answer(reasoning, 5))


def _rows_with_room(renderer: ScorerRenderer, rooms) -> dict[int, list[dict]]:
    """For each room, messages whose text leaves exactly that many visual tokens under max_length."""
    roomy = ScorerRenderer(renderer.processor, renderer.policy, max_length=1 << 20)
    by_text = {roomy.plan(0, _messages(w), (56, 56)).text_tokens: _messages(w) for w in range(0, 40)}
    found = {room: by_text.get(renderer.max_length - room) for room in rooms}
    missing = [room for room, messages in found.items() if messages is None]
    assert not missing, f"no answer length leaves room {missing}: {sorted(by_text)}"
    return found


def test_the_issue_row_1288x728_renders_at_its_planned_length(processor):
    """Row 149 of the issue: a 1288x728 shot whose text leaves 6 visual tokens. The plan lowered
    max_pixels to 4704 and counted 3 tokens for an 84x28 image; the processor enlarged it to its
    min_pixels and emitted 8. Now the plan counts what the processor emits."""
    set_processor_pixel_bounds(processor, *QWEN_BOUNDS)
    renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=480)
    messages = _rows_with_room(renderer, [6])[6]
    plan = renderer.plan(149, messages, (1288, 728))
    assert isinstance(plan, ExamplePlan) and plan.bounded
    width, height = plan.image_size
    assert width * height >= QWEN_BOUNDS[0]  # never sent below the processor's minimum
    example = renderer.render(messages, _page((1288, 728)), plan.max_pixels)
    grid = example["image_grid_thw"][0]
    assert example["input_ids"].numel() == plan.length <= 480
    assert int(grid.prod()) // 4 == plan.visual_tokens == 6
    assert (int(grid[2]) * 14, int(grid[1]) * 14) == plan.image_size
    # with 5 tokens of room no image of that shape fits: dropped with its own reason
    tight = ScorerRenderer(processor, image_policy_for(processor), max_length=479)
    dropped = tight.plan(149, messages, (1288, 728))
    assert isinstance(dropped, DroppedRow) and dropped.reason == NO_IMAGE_ROOM and dropped.room == 5


@pytest.mark.parametrize("bounds,max_aspect", [(None, 4.0), (QWEN_BOUNDS, 4.0), (QWEN_BOUNDS, None)])
def test_every_edge_row_renders_at_its_planned_length(processor, bounds, max_aspect):
    """Rows leaving 0-10 visual tokens of room, with tiny, huge and extreme-aspect screenshots: each kept
    row renders at exactly its planned length, each dropped row says why."""
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    if bounds:
        set_processor_pixel_bounds(processor, *bounds)
    renderer = ScorerRenderer(processor, image_policy_for(processor, max_aspect), max_length=470)
    rooms = _rows_with_room(renderer, ROOMS)
    rows = [(room, size) for room in ROOMS for size in EDGE_SIZES]
    part = {"type": Value("string"), "text": Value("string")}
    features = Features({"image": ImageFeature(), "messages": [{"role": Value("string"), "content": [part]}]})
    split = Dataset.from_list(
        [
            {"image": {"bytes": encoded(_page(size)), "path": None}, "messages": rooms[room]}
            for room, size in rows
        ],
        features=features,
    )
    data = ScorerDataset(split, renderer, name="edges")

    kept = {plan.row: plan for plan in data.plans}
    assert len(kept) == data.stats.kept
    for i, plan in enumerate(data.plans):
        example = data[i]
        room, size = rows[plan.row]
        assert example["input_ids"].numel() == plan.length <= renderer.max_length, (room, size, plan)
        assert int(example["image_grid_thw"][0].prod()) // 4 == plan.visual_tokens, (room, size, plan)
    assert data.mismatched_rows == []
    reasons = {}
    for index, (room, size) in enumerate(rows):
        if index in kept:
            continue
        dropped = renderer.plan(index, rooms[room], size)
        assert dropped.reason == (TEXT_TOO_LONG if room <= 0 else NO_IMAGE_ROOM), (room, size)
        reasons[dropped.reason] = reasons.get(dropped.reason, 0) + 1
    assert reasons[TEXT_TOO_LONG] == data.stats.dropped_too_long == 2 * len(EDGE_SIZES)
    assert reasons[NO_IMAGE_ROOM] == data.stats.dropped_no_image_room >= 3 * len(EDGE_SIZES)  # rooms 1-3
    assert data.stats.bounded > 0 and data.stats.kept + sum(reasons.values()) == len(rows)


def _tampered(data: ScorerDataset, index: int) -> None:
    """Make example ``index``'s plan one visual token short of what it renders (a plan bug)."""
    plan = data.plans[index]
    data.plans[index] = dataclasses.replace(plan, visual_tokens=plan.visual_tokens - 1)


@pytest.fixture
def small_set(processor, tmp_path):
    from keyshot.infer.testing.scorer_data import build_scorer_dataset
    from keyshot.train.batches import load_scorer_dataset

    ds = load_scorer_dataset(build_scorer_dataset(tmp_path / "ds", n_train=8, n_val=2))
    roomy = ScorerDataset(ds["train"], ScorerRenderer(processor, image_policy_for(processor), 4096))
    renderer = ScorerRenderer(processor, image_policy_for(processor), max_length=sorted(roomy.lengths)[3])
    data = ScorerDataset(ds["train"], renderer)
    assert len(data) == 8 and 1 <= data.stats.bounded <= 4  # some rows shrunk, some not
    return data


def test_a_row_rendered_off_its_plan_is_skipped_named_and_counted(small_set, caplog):
    """A mismatch during training does not end the run: the next planned row takes the batch slot, the
    row is logged with its numbers and flagged where the DataLoader workers' flags are seen too."""
    bad, in_worker = 2, 5
    _tampered(small_set, bad)
    with caplog.at_level(logging.WARNING, logger="keyshot.train.batches"):
        assert small_set[bad]["input_ids"].numel() == small_set.lengths[bad + 1]
    plan = small_set.plans[bad]
    assert f"train row {plan.row}: rendered {plan.length + 1} tokens, planned {plan.length}" in caplog.text
    assert "skipped (the next planned row trains in its place)" in caplog.text
    _tampered(small_set, in_worker)
    loader = torch.utils.data.DataLoader(
        small_set,
        batch_size=None,
        sampler=[bad, in_worker, in_worker, 0],
        num_workers=1,
        collate_fn=lambda e: e,
    )
    lengths = [e["input_ids"].numel() for e in loader]
    assert lengths == [small_set.lengths[i] for i in (bad + 1, in_worker + 1, in_worker + 1, 0)]
    # flagged once each, the worker's flag included (shared memory)
    assert small_set.mismatched_rows == [small_set.plans[bad].row, small_set.plans[in_worker].row]
    assert small_set.mismatch_flags().tolist() == [int(i in (bad, in_worker)) for i in range(len(small_set))]
    for i in range(len(small_set)):
        _tampered(small_set, i)
    with pytest.raises(DataError, match="no planned row renders at its planned length"):
        small_set[0]


def test_check_renders_every_shrunk_row_and_names_a_mismatch(small_set):
    """What ``train/sft.py --check`` runs: every shrunk row rendered, a mismatch named with its numbers."""
    shrunk = sum(p.bounded for p in small_set.plans)
    assert shrunk >= 1
    line = check_rendering(small_set, sample=2)
    assert f"train: {shrunk} shrunk and 2 other rows render at their planned length" in line
    index = next(i for i, p in enumerate(small_set.plans) if p.bounded)
    _tampered(small_set, index)
    plan = small_set.plans[index]
    with pytest.raises(DataError) as caught:
        check_rendering(small_set, sample=0)
    message = str(caught.value)
    assert message.startswith(f"1 of {shrunk} rendered rows differ from their plan: train row {plan.row}: ")
    assert f"rendered {plan.length + 1} tokens, planned {plan.length}" in message
    assert f"max_pixels={plan.max_pixels}" in message and "visual tokens, grid 1x" in message


def test_answer_token_stats():
    assert answer_token_stats([]) == {}
    counts = list(range(1, 201))
    assert answer_token_stats(counts) == {"max": 200, "p99": 199, "rows": 200}
    assert answer_token_stats([7]) == {"max": 7, "p99": 7, "rows": 1}


def test_dataset_records_its_answer_lengths(small_set, processor):
    lengths = [
        len(processor.tokenizer(small_set.renderer.split(small_set.rows[p.row]["messages"])[1])["input_ids"])
        for p in small_set.plans
    ]
    assert small_set.answer_tokens == answer_token_stats(lengths)
    assert small_set.answer_tokens["max"] == max(lengths) > 10


# ----------------------------------------------------------------------------- serve and judge


@pytest.fixture
def answered_checkpoint(scorer_checkpoint, tmp_path):
    """The tiny scorer checkpoint, as trained on answers of up to 150 tokens."""
    folder = tmp_path / "answered"
    shutil.copytree(scorer_checkpoint, folder)
    meta = read_meta(folder)
    meta.answer_tokens = {"max": 150, "p99": 120, "rows": 700}
    write_meta(folder, meta)
    return folder


def test_serve_allows_the_trained_answer_length(answered_checkpoint, scorer_checkpoint, tmp_path):
    import json

    from keyshot.infer.serve.plan import ServeConfig, ServeError, plan_server
    from keyshot.infer.serve.server import VLLMServer

    base = {"model": str(answered_checkpoint), "device": "cpu", "tmpdir": str(tmp_path)}
    plan = plan_server(ServeConfig(**base))
    assert plan.max_tokens == 150 == describe_checkpoint(answered_checkpoint).answer_tokens
    flag = plan.command[plan.command.index("--override-generation-config") + 1]
    assert json.loads(flag) == {"temperature": 0.0, "max_new_tokens": 150}
    assert VLLMServer(ServeConfig(**base)).endpoint().max_tokens == 150
    assert plan_server(ServeConfig(**base, max_tokens=200)).max_tokens == 200
    with pytest.raises(ServeError, match=r"max_tokens=100 is below the longest answer .* \(150 tokens"):
        plan_server(ServeConfig(**base, max_tokens=100))
    # a checkpoint that does not record its answers is served as before
    old = plan_server(ServeConfig(model=str(scorer_checkpoint), device="cpu", tmpdir=str(tmp_path)))
    assert old.max_tokens is None and describe_checkpoint(scorer_checkpoint).answer_tokens is None


def _judge_config(overrides):
    from keyshot.infer.judge.config import JudgeRunConfig

    return load_config(JudgeRunConfig, "configs/judge/tiny_cpu.yaml", overrides)


def test_judge_scorer_max_tokens_follows_the_checkpoint(answered_checkpoint, caplog):
    """configs/judge/tiny_cpu.yaml's 64 tokens would cut a real-format answer: with a checkpoint that
    records its answers it is raised (a line says so); an explicit scorer.max_tokens below is refused."""
    from keyshot.infer.client.usage import UsageLedger
    from keyshot.infer.judge.scorer_factory import build_scorer

    with caplog.at_level(logging.INFO, logger="keyshot.infer.judge.scorer_factory"):
        scorer = build_scorer(
            _judge_config([f"scorer.checkpoint={answered_checkpoint}"]), None, UsageLedger()
        )
    assert scorer.max_tokens == 150
    assert f"scorer max_tokens raised from 64 to 150, the longest answer {answered_checkpoint}" in caplog.text
    remote = build_scorer(_judge_config([]), None, UsageLedger())  # no checkpoint known: left alone
    assert remote.max_tokens is None and remote.client.endpoint.max_tokens == 64
    roomy = _judge_config([f"scorer.checkpoint={answered_checkpoint}", "scorer.endpoint.max_tokens=400"])
    assert build_scorer(roomy, None, UsageLedger()).max_tokens is None  # the endpoint's 400 stands
    explicit = _judge_config([f"scorer.checkpoint={answered_checkpoint}", "scorer.max_tokens=100"])
    with pytest.raises(
        ConfigError, match=r"scorer.max_tokens=100 is below the longest answer .* \(150 tokens"
    ):
        build_scorer(explicit, None, UsageLedger())
    enough = _judge_config([f"scorer.checkpoint={answered_checkpoint}", "scorer.max_tokens=160"])
    assert build_scorer(enough, None, UsageLedger()).max_tokens == 160


def test_a_scorer_cut_at_its_trained_answer_length_is_called_a_checkpoint_problem(
    answered_checkpoint, tmp_path, capsys
):
    """The limit already allows the longest trained answer (150 tokens) and every answer runs past it:
    raising the limit again would only pay for longer answers, so the message points at the checkpoint."""
    from keyshot.infer.cli import main as keyshot
    from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
    from tests.support.judge_inputs import VERBOSE, judge_argv

    with FakeOpenAI(make_judge(reasoning_words=VERBOSE)) as server:
        argv = judge_argv(
            server, tmp_path / "run", concurrency="1", **{"scorer.checkpoint": str(answered_checkpoint)}
        )
        assert keyshot(argv) == 2
    err = capsys.readouterr().err
    stop = next(line for line in err.splitlines() if "stopped:" in line)
    assert "at up to 150 completion tokens" in stop
    assert "already allows the longest answer the scorer's checkpoint was trained on (150 tokens)" in stop
    assert "check the checkpoint" in stop and "raise scorer" not in stop
