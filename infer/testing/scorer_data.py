"""Small scorer datasets for the training tests, built directly (no teachers, no network).

Rows are what ``keyshot synth`` writes: ``messages`` from ``keyshot.infer.protocol.messages.scorer_example`` (answer
included), the screenshot in its own ``image`` column, ``answer``, ``score`` and provenance.

The screenshots are synthetic and *learnable*: a coloured banner over the top two thirds of the page
decides the score (green → 5, amber → 3, red → 1) and the answer names the colour, so a model that
reads the image answers held-out screenshots right. Sizes and key-point lists vary so that examples differ in length.
"""

from __future__ import annotations

import random
from pathlib import Path

from PIL import Image, ImageDraw

from keyshot.infer.protocol.messages import scorer_answer, scorer_example
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.images import encoded

BANNERS = {5: ("green", (40, 170, 70)), 3: ("amber", (230, 160, 20)), 1: ("red", (200, 40, 40))}
SIZES = [(1280, 720), (640, 480), (800, 1600), (320, 240), (1024, 768), (480, 960)]
TASKS = [
    "Find a red shirt under $20 and add it to the cart",
    "Book a table for two at an Italian restaurant on Friday",
    "Search for the opening hours of the city library",
    "Subscribe to the assistant newsletter with the email test@example.com",
]
KEY_POINTS = [
    "Red shirt",
    "Price under $20",
    "Added to cart",
    "Table for two",
    "Friday",
    "Opening hours",
    "Email given",
]


def screenshot(score: int, size: tuple[int, int], rng: random.Random) -> Image.Image:
    """A page with grey text-like bars and a banner whose colour encodes ``score``."""
    width, height = size
    img = Image.new("RGB", size, (250, 250, 250))
    draw = ImageDraw.Draw(img)
    for _ in range(12):
        x, y = rng.randrange(0, width // 2), rng.randrange(height // 3, height)
        draw.rectangle([x, y, x + rng.randrange(40, width // 2), y + 8], fill=(rng.randrange(90, 180),) * 3)
    draw.rectangle([0, 0, width, height * 2 // 3], fill=BANNERS[score][1])
    return img


def scorer_rows(n: int, seed: int, agent: str, variant: str = "online_mind2web", sizes=SIZES):
    prompts = load_prompt_set(variant)
    rng = random.Random(seed)
    for i in range(n):
        score = rng.choice(sorted(BANNERS))
        colour = BANNERS[score][0]
        task = rng.choice(TASKS)
        points = rng.sample(KEY_POINTS, rng.randint(1, 4))
        key_points = "\n" + "\n".join(f"{k + 1}. {p}" for k, p in enumerate(points))
        answer = scorer_answer(f"The banner is {colour}, so the page is a {colour} page.", score)
        jpeg = encoded(screenshot(score, sizes[i % len(sizes)], rng), "JPEG", quality=90)
        yield {
            "image": {"bytes": jpeg, "path": None},
            "messages": scorer_example(prompts, task, key_points, answer),
            "answer": answer,
            "score": score,
            "prompt_version": prompts.version,
            "task": task,
            "key_points": key_points,
            "task_id": f"{agent}-{i // 4}",
            "step": i % 4,
            "agent": agent,
        }


def build_scorer_dataset(out_dir: str | Path, n_train: int = 16, n_val: int = 8, seed: int = 0) -> Path:
    """Save a ``DatasetDict`` (train / validation, split by agent) to ``out_dir`` and return it."""
    from datasets import Dataset, DatasetDict, Features, Image, Value

    part = {"type": Value("string"), "text": Value("string")}
    features = Features(
        {
            "image": Image(),
            "messages": [{"role": Value("string"), "content": [part]}],
            "answer": Value("string"),
            "score": Value("int32"),
            "prompt_version": Value("string"),
            "task": Value("string"),
            "key_points": Value("string"),
            "task_id": Value("string"),
            "step": Value("int32"),
            "agent": Value("string"),
        }
    )
    splits = {
        "train": list(scorer_rows(n_train, seed, agent="seeact")),
        "validation": list(scorer_rows(n_val, seed + 1, agent="operator")),
    }
    ds = DatasetDict({name: Dataset.from_list(rows, features=features) for name, rows in splits.items()})
    out = Path(out_dir)
    ds.save_to_disk(str(out))
    return out
