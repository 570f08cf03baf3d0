"""The whole path on real records (../shared/data beside the repository; skipped where it is absent):
AgentRewardBench's released WebJudge records imported as teacher labels, the dataset built from them,
the tiny model trained on their real-format answers to its last step at max_length 1024, the trained
checkpoint served by vLLM judging full AgentLab runs of WorkArena, and metrics against their rewards.

Fixtures are short and clean; these records are long and hit the edges (retina screenshots, answers of a
few hundred tokens, agents whose trajectories share screenshots, an agent split that cannot meet its
fractions). Each stage runs as a user runs it, from the command line."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from datasets import Image, load_from_disk

from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI
from keyshot.infer.testing.fake_responders import make_judge
from tests.support import paths
from tests.support.frameworks import python_or_skip

REPO = paths.REPO
BIN = Path(sys.executable).parent
SHARED = REPO.parent / "shared" / "data"
ARB = SHARED / "arb_webjudge" / "dev"
AGENTLAB = SHARED / "agentlab_workarena"

#: The training's last step: the plan covers every real row, the run stops here (an epoch is ~37 steps: the
#: path is the same, the minutes are not)
TRAIN_STEPS = 10

# The real records are not ours to ship (50 MB); a clone without the shared folder beside it skips.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (ARB / "index.csv").is_file() or not AGENTLAB.is_dir(),
        reason=f"no real data at {SHARED} (the shared data folder beside the repository)",
    ),
]


def _run(cmd: list, ok: tuple[int, ...] = (0,), timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode in ok, (proc.returncode, (proc.stdout + proc.stderr)[-6000:])
    return proc


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    work = tmp_path_factory.mktemp("real-data")
    run = work / "synth"
    _run([BIN / "keyshot", "synth", "import-arb", ARB, "--run", run])
    _run([BIN / "keyshot", "synth", "build", run])
    train = work / "train"
    out = _run(
        [
            BIN / "accelerate", "launch", "--config_file", "configs/accelerate/cpu1.yaml",
            "-m", "keyshot.train.sft", "--config", "configs/train/tiny_cpu.yaml",
            f"model.name_or_path={tiny_model_dir}", f"data.path={run / 'dataset'}", f"run_dir={train}",
            "data.max_length=1024", "epochs=1", f"max_steps={TRAIN_STEPS}", "log.tracker=none",
            "checkpoint.every_steps=0",
        ]
    )  # fmt: skip
    return {"work": work, "dataset": run / "dataset", "train": train, "train_output": out.stdout + out.stderr}


def test_the_dataset_of_real_records_keeps_every_screenshot_in_one_split(trained):
    ds = load_from_disk(str(trained["dataset"])).cast_column("image", Image(decode=False))
    by_split = {split: {hashlib.sha256(im["bytes"]).hexdigest() for im in ds[split]["image"]} for split in ds}
    assert all(by_split.values()), {s: len(v) for s, v in by_split.items()}
    splits = list(by_split)
    for i, a in enumerate(splits):
        for b in splits[i + 1 :]:
            assert not by_split[a] & by_split[b], f"screenshots in {a} and {b}"
    card = (trained["dataset"] / "README.md").read_text(encoding="utf-8")
    assert "screenshots in more than one split: 0" in card


def test_training_on_real_answers_reaches_its_last_step(trained):
    meta = json.loads((trained["train"] / "final" / "keyshot.json").read_text(encoding="utf-8"))
    lines = (trained["train"] / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    steps = [r["step"] for r in map(json.loads, lines) if r["split"] == "train"]
    # the plan's line: "train: 146 rows, 116 kept, 5 shrunk …, 29 dropped …; 147 examples an epoch"
    plan = re.search(r"train: (\d+) rows, (\d+) kept, .*?; (\d+) examples an epoch", trained["train_output"])
    assert plan, trained["train_output"][-3000:]
    rows, examples = int(plan[1]), int(plan[3])
    assert rows == load_from_disk(str(trained["dataset"]))["train"].num_rows
    assert examples // 4 > TRAIN_STEPS  # one epoch of global batches of 4 would run longer
    assert steps == list(range(1, TRAIN_STEPS + 1)) and meta["extra"]["steps"] == TRAIN_STEPS, meta["extra"]
    assert meta["extra"]["rows_skipped_off_plan"] == []
    # the checkpoint knows the length of the answers it was trained on (real ones run to hundreds of tokens)
    assert meta["answer_tokens"]["max"] > 200 and meta["answer_tokens"]["rows"] == examples


def _judge(config: str, out: Path, judge_url: str, *extra: object, ok=(0,)) -> subprocess.CompletedProcess:
    return _run(
        [BIN / "keyshot", "judge", AGENTLAB, "--config", config, "--out", out, "--no-progress",
         f"judge.base_url={judge_url}", "judge.model=fake-judge", *extra],
        ok=ok,
    )  # fmt: skip


def _verdicts(out: Path) -> list[dict]:
    path = out / "verdicts.jsonl"  # a run that stopped before its first verdict has none
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    return [json.loads(line) for line in lines]


def test_the_trained_scorer_gives_no_verdict_without_evidence_on_full_runs(trained):
    """One epoch does not teach the tiny model to end its answers: served by vLLM at the trained answer
    length, its answers are cut. The run must say so and give no verdict it has no score for."""
    vllm_python = python_or_skip("vllm")
    out = trained["work"] / "judge-trained"
    with FakeOpenAI(make_judge(), model="fake-judge") as judge:
        proc = _judge(
            "configs/judge/tiny_cpu.yaml", out, judge.base_url,
            "--serve-scorer", trained["train"] / "final", f"scorer.serve.vllm_python={vllm_python}",
            ok=(0, 2, 3),
        )  # fmt: skip
    verdicts = _verdicts(out)
    for v in verdicts:
        readable = [s for s in v["screenshots"] if s.get("score") is not None]
        assert v["success"] is None or readable, v["task_id"]
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    if summary["cut_answers"]:
        assert "scorer.max_tokens" in proc.stdout + proc.stderr
    run = summary["run"]
    if proc.returncode == 0:
        assert not run["stopped"] and all(v["success"] is not None for v in verdicts), proc.stderr[-3000:]
    elif run["stopped"]:
        # the first answers were all cut: the run stops (exit 2) and leaves the rest for the next run, said
        assert proc.returncode == run["exit_code"] == 2 and "max_tokens" in run["stopped"], run
        assert not all(v["success"] is not None for v in verdicts) or run["not_reached"] > 0, run
        assert "stopped" in proc.stderr, proc.stderr[-3000:]
    else:
        assert any(v["success"] is None for v in verdicts), proc.stderr[-3000:]


def test_full_agentlab_runs_are_all_accounted_for_and_metrics_read_their_rewards(trained):
    """The same runs with a stand-in scorer that always answers: every run judged or named with its reason
    (one crashed before its first screenshot), then metrics against the runs' own rewards."""
    runs = sorted(p for p in AGENTLAB.iterdir() if p.is_dir())
    out = trained["work"] / "judge-stand-in"
    with FakeOpenAI(make_judge(), model="fake-judge") as judge:
        config = fake_judge_config(
            trained["work"] / "stand-in.yaml", judge.base_url,
            {"endpoint": {"base_url": judge.base_url, "model": "fake-judge"}},
        )  # fmt: skip
        proc = _judge(str(config), out, judge.base_url)
    verdicts = _verdicts(out)
    not_loaded = [r for r in runs if not list(r.glob("screenshot_step_*.png"))]
    assert len(verdicts) + len(not_loaded) == len(runs)
    assert all(v["success"] is not None for v in verdicts)
    for run in not_loaded:
        assert f"{run}: trajectory has no screenshots" in proc.stdout + proc.stderr
    metrics = trained["work"] / "metrics"
    _run([BIN / "keyshot", "metrics", out / "verdicts.jsonl", "--out", metrics])
    table = json.loads((metrics / "metrics.json").read_text(encoding="utf-8"))
    text = (metrics / "metrics.md").read_text(encoding="utf-8")
    assert "Truth: AgentLab reward." in text
    assert f"| **Overall** | {len(verdicts)} | 0 |" in text, text
    assert table
