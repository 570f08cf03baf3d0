"""A learnable world for the end-to-end loop: screenshots with a visible, task-dependent cue.

Every task asks to "open the <colour> panel". A screenshot is a real one (fixtures) or a rendered
page, and may carry a large panel in one of three colours. The teacher reads the pixels: the
screenshot is key (score 5) when it shows the panel the task asks for, weak (2) when it shows a
panel of another colour, irrelevant (1) when it shows none. So the score is a deterministic
function of what the screenshot shows *for the task*: a scorer must look at the image and read
the task to agree with it, and an untrained one cannot.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from keyshot.infer.testing.fake_requests import decode_image, identify_step, system_text, user_parts
from keyshot.infer.testing.fake_responders import key_points_answer, outcome_answer

COLOURS = {"red": (220, 30, 30), "blue": (40, 70, 220), "yellow": (240, 200, 30)}
SIZE = (1280, 720)
PANEL = (560, 380)
MIN_PANEL_FRACTION = 0.04  # a panel covers ~14 % of the screen; real pages have < 0.5 % of these colours
_TASK_COLOUR = re.compile(r"\bopen the (red|blue|yellow) panel\b", re.IGNORECASE)


def draw_screen(background: Image.Image | None, panel: str | None, rng: random.Random) -> Image.Image:
    """A 1280×720 screenshot: a real background (or a rendered page) with an optional panel."""
    if background is not None:
        img = background.convert("RGB").resize(SIZE)
    else:
        img = Image.new("RGB", SIZE, (246, 246, 246))
        d = ImageDraw.Draw(img)
        d.rectangle([0, 0, SIZE[0], 56], fill=(60, 64, 72))
        for _ in range(14):
            x, y = rng.randint(20, 1100), rng.randint(80, 680)
            d.rectangle(
                [x, y, x + rng.randint(60, 260), y + rng.randint(8, 22)], fill=(rng.randint(150, 200),) * 3
            )
    if panel is not None:
        d = ImageDraw.Draw(img)
        x, y = rng.randint(0, SIZE[0] - PANEL[0]), rng.randint(60, SIZE[1] - PANEL[1])
        d.rectangle([x, y, x + PANEL[0], y + PANEL[1]], fill=COLOURS[panel], outline=(20, 20, 20), width=3)
    return img


def detect_panel(img: Image.Image) -> str | None:
    """The colour of the panel the screenshot shows, or None: a pixel count, nothing learned."""
    arr = np.asarray(img.convert("RGB").resize((320, 180)), dtype=np.int16)
    best, best_fraction = None, 0.0
    for name, rgb in COLOURS.items():
        close = np.abs(arr - np.array(rgb, dtype=np.int16)).max(axis=2) < 45
        fraction = float(close.mean())
        if fraction > best_fraction:
            best, best_fraction = name, fraction
    return best if best_fraction >= MIN_PANEL_FRACTION else None


def task_colour(task: str) -> str | None:
    match = _TASK_COLOUR.search(task)
    return match.group(1).lower() if match else None


def cue_score(task: str, img: Image.Image) -> tuple[int, str | None]:
    shown, wanted = detect_panel(img), task_colour(task)
    if shown is None:
        return 1, None
    return (5 if shown == wanted else 2), shown


def cue_answer(task: str, img: Image.Image) -> str:
    score, shown = cue_score(task, img)
    seen = f"The page shows a {shown} panel." if shown else "The page shows no panel."
    return f"**Reasoning**: {seen}\n\n**Score**: {score}"


def cue_teacher(request: dict) -> str:
    """Responder for the fake OpenAI server: key points, cue scores, and an outcome."""
    step = identify_step(request)
    text, images = user_parts(request)
    task = text.split("\n\n")[0].removeprefix("**Task**: ").removeprefix("Task: ").removeprefix("User Task: ")
    if step == "key_points":
        return key_points_answer(task)
    if step == "key_screenshot":
        return cue_answer(task, decode_image(images[0]))
    if step == "outcome":
        return outcome_answer(task, len(images), "any_image")
    raise ValueError(f"unknown step for system prompt {system_text(request)[:60]!r}")


@dataclass
class WorldSpec:
    agents: dict[str, int]  # agent name -> number of trajectories
    screenshots_per_trajectory: int = 5
    seed: int = 0


def make_world(out_dir: Path, backgrounds: list[Path], spec: WorldSpec) -> dict[str, Path]:
    """Write one keyshot JSONL file per agent (screenshots as PNG beside it); return agent -> file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "screens").mkdir(exist_ok=True)
    bgs = [Image.open(p).convert("RGB") for p in backgrounds]
    files: dict[str, Path] = {}
    for a_index, (agent, n) in enumerate(sorted(spec.agents.items())):
        rng = random.Random(spec.seed * 1000 + a_index)
        lines = []
        for t in range(n):
            colour = rng.choice(sorted(COLOURS))
            shots = []
            for s in range(spec.screenshots_per_trajectory):
                kind = rng.choices(["match", "other", "none"], weights=[0.35, 0.3, 0.35])[0]
                panel = colour if kind == "match" else rng.choice([c for c in COLOURS if c != colour])
                bg = rng.choice(bgs) if bgs and rng.random() < 0.5 else None
                img = draw_screen(bg, None if kind == "none" else panel, rng)
                name = f"screens/{agent}-{t:03d}-{s}.png"
                img.save(out_dir / name)
                shots.append(name)
            lines.append(
                {
                    "task_id": f"{agent}-{t:03d}",
                    "task": f"Open the {colour} panel on the dashboard.",
                    "actions": [f"click('panel-{s}')" for s in range(len(shots))],
                    "screenshots": shots,
                    "agent": agent,
                    "benchmark": "cue-world",
                }
            )
        path = out_dir / f"{agent}.jsonl"
        path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
        files[agent] = path
    return files


def agreement(pairs: list[tuple[int, int | None]], threshold: int = 3) -> dict:
    """Scorer vs teacher on the same screenshots: exact match (an invalid answer counts as wrong),
    mean absolute error over valid answers, and precision/recall of "key" (score >= threshold)."""
    n = len(pairs)
    valid = [(t, p) for t, p in pairs if p is not None]
    tp = sum(1 for t, p in valid if t >= threshold and p >= threshold)
    fp = sum(1 for t, p in valid if t < threshold and p >= threshold)
    fn = sum(1 for t, p in pairs if t >= threshold and (p is None or p < threshold))
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    return {
        "screenshots": n,
        "valid": len(valid) / n if n else 0.0,
        "exact": sum(1 for t, p in valid if t == p) / n if n else 0.0,
        "mae": sum(abs(t - p) for t, p in valid) / len(valid) if valid else None,
        "key_precision": precision,
        "key_recall": recall,
        "key_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
    }
