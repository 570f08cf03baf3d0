"""A fake judge that answers from what MiniWoB's enter-text pages show (the live proof of the rewards per
step, tests/env/test_step_rewards_live.py): as the scorer it reads a screenshot's pixels (is there text in
the text field, is the Submit button pressed: the field's focus ring gone with the click), and as the judge
it answers the outcome and the step question from those descriptions alone."""

from __future__ import annotations

import re

import numpy as np

from keyshot.infer.testing.fake_openai import (
    decode_image,
    identify_step,
    is_follow_up,
    key_points_answer,
    user_parts,
)

HOLDS_TEXT = "The text field holds text."
EMPTY = "The text field is empty."
PRESSED = "The Submit button is pressed."
_LISTED = re.compile(r"^Screenshot (\d+) \(score [^)]*\): (.*)$", re.M)


def read_page(url: str) -> tuple[bool, bool]:
    """(text in the field, Submit pressed) of an enter-text page at MiniWoB's own size, as the scorer sees
    it (the task's 160x210 area at the left, the field a third of the way down, the button below it).
    Pressed: the field holds text and has lost its focus ring (black) to the click on the button. The
    button's own hover shade is no sign: Chromium paints it a frame later or not at all before the
    screenshot (seen: in 4 of 13 runs)."""
    pixels = np.asarray(decode_image(url).convert("L"), dtype=np.int16)
    h, w = pixels.shape
    field = pixels[int(0.26 * h) : int(0.33 * h), int(0.08 * w) : int(0.43 * w)]
    around = pixels[int(0.22 * h) : int(0.36 * h), int(0.1 * w) : int(0.4 * w)]  # the field and its border
    typed = int((field < 100).sum()) > 50
    focused = float(around.mean(axis=1).min()) < 60
    return typed, typed and not focused


def page_judge(request: dict) -> str:
    step = identify_step(request)
    text, images = user_parts(request)
    if step == "key_points":
        return key_points_answer(text.split("Task:", 1)[-1].strip().splitlines()[0])
    if step == "key_screenshot":
        typed, pressed = read_page(images[0])
        said = " ".join([HOLDS_TEXT if typed else EMPTY, *([PRESSED] if pressed else [])])
        return f"**Reasoning**: {said}\n\n**Score**: {1 + 2 * typed + 2 * pressed}"
    if is_follow_up(request):
        shots = [(int(i), said) for i, said in _LISTED.findall(text)]
        block = text.split("The key points:", 1)[-1].split("\n\n", 1)[0]
        points = re.findall(r"^\d+\. (.+)$", block, re.M)

        def first(shown: str) -> str:
            return next((f"Screenshot {i}" for i, said in shots if shown in said), "none")

        return "\n".join(
            f"Key Point {k + 1}: " + first(PRESSED if "submit" in point.lower() else HOLDS_TEXT)
            for k, point in enumerate(points)
        )
    done = PRESSED in text and HOLDS_TEXT in text
    return f'Thoughts: the pages {"show" if done else "do not show"} the text submitted.\nStatus: "{"success" if done else "failure"}"'
