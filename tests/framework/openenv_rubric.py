"""keyshot's OpenEnv rubric (keyshot.frameworks.openenv.rubric.KeyshotRubric) called as OpenEnv calls a rubric
(``Rubric.__call__``, OpenEnv's released code), on BrowserGym observations of keyshot's environment; run in
the OpenEnv venv by tests/reward/test_openenv_rubric.py (openenv is not installed in .venv).

    python tests/framework/openenv_rubric.py PLAN_JSON

PLAN: ``{"healthy": CONFIG, "dead": CONFIG, "zero": CONFIG, "steps": CONFIG, "keep": DIR}`` (configs whose
judge answers, whose judge is down, the latter with ``on_failure: zero``, and one with
``pipeline.step_rewards``). Prints one JSON object, one entry per case.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from browsergym_env.models import BrowserGymAction, BrowserGymObservation
from PIL import Image

from keyshot.frameworks.openenv.rubric import KeyshotRubric
from keyshot.infer.testing.images import encoded
from keyshot.reward import shared

GOAL = "Click the button."


def pixels(seed: int, channels: int = 3) -> list:
    """A 40×60 page as OpenEnv sends a screenshot: nested lists of 0-255 integers."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(40, 60, channels), dtype=np.uint8).tolist()


def png(seed: int) -> bytes:
    return encoded(Image.fromarray(np.asarray(pixels(seed), dtype=np.uint8)))


def observation(screenshot, done: bool = False, error: str = "", seed: int = 0) -> BrowserGymObservation:
    return BrowserGymObservation(
        goal=GOAL,
        url="file:///miniwob/click-test.html",
        screenshot=screenshot,
        done=done,
        error=error,
        last_action_error=bool(error),
        metadata={"task_id": f"miniwob.click-test.{seed}"},
    )


def action(text: str) -> BrowserGymAction:
    return BrowserGymAction(action_str=text)


def play(rubric: KeyshotRubric, steps: list, barrier: threading.Barrier | None = None) -> dict:
    """``steps``: (action or None, observation) pairs, the last one done; the rubric's value at each."""
    values = []
    for i, (act, obs) in enumerate(steps):
        if barrier is not None and i == len(steps) - 1:
            barrier.wait()  # the sessions end together
        values.append(rubric(act, obs))
    final = steps[-1][1]
    metadata = final["metadata"] if isinstance(final, dict) else final.metadata
    return {
        "values": values,
        "last_score": rubric.last_score,
        "metadata": metadata,
        "kept_screenshots": [
            o.get("screenshot") if isinstance(o, dict) else o.screenshot for _, o in rubric.trajectory
        ],
        "step_rewards": rubric.compute_step_rewards(),
    }


def episode(seed: int, final_screenshot=None, **final) -> list:
    return [
        (None, observation(pixels(seed), seed=seed)),
        (action("click('13')"), observation(pixels(seed + 1), seed=seed)),
        (
            action("click('14')"),
            observation(
                pixels(seed + 2) if final_screenshot is None else final_screenshot, True, seed=seed, **final
            ),
        ),
    ]


def main() -> None:
    plan = json.loads(sys.argv[1])
    out: dict = {}

    # three sessions of one task ending at once: one batch, one key-point call
    barrier = threading.Barrier(3)
    rubrics = [KeyshotRubric(plan["healthy"], keep_dir=plan["keep"]) for _ in range(3)]
    with ThreadPoolExecutor(3) as pool:
        out["together"] = list(pool.map(lambda i: play(rubrics[i], episode(10 * i), barrier), range(3)))
    out["batches"] = shared.shared_batcher(plan["healthy"]).batches

    # other forms of a screenshot: PNG bytes, a PIL image, RGBA pixels; dict observations (GenericEnvClient's)
    rubric = KeyshotRubric(plan["healthy"])
    as_dicts = [(None if a is None else a.model_dump(), o.model_dump()) for a, o in episode(40)]
    as_dicts[0][1]["screenshot"] = png(40)
    as_dicts[1][1]["screenshot"] = Image.fromarray(np.asarray(pixels(41), dtype=np.uint8))
    as_dicts[2][1]["screenshot"] = pixels(42, channels=4)
    out["forms"] = play(rubric, as_dicts)

    # the whole trajectory at once (TrajectoryRubric.score_trajectory)
    pairs = episode(50)
    out["score_trajectory"] = {"value": rubric.score_trajectory(pairs), "metadata": pairs[-1][1].metadata}

    # screenshots that cannot be judged: rows of unequal length; none (the browser failed)
    ragged = pixels(60)
    ragged[5] = ragged[5][:-1]
    out["ragged"] = play(KeyshotRubric(plan["healthy"]), episode(60, final_screenshot=ragged))
    failed = episode(70)
    failed[-1] = (failed[-1][0], observation(None, True, error="the browser failed at step 2: it crashed"))
    out["no_screenshot"] = play(KeyshotRubric(plan["healthy"]), failed)

    # rewards per step (pipeline.step_rewards): compute_step_rewards gives each step its own
    out["steps"] = play(KeyshotRubric(plan["steps"]), episode(110))

    # a judge that is down: None with the reason (never 0); with on_failure: zero, a counted 0.0
    out["dead"] = play(KeyshotRubric(plan["dead"]), episode(80))
    out["zero"] = play(KeyshotRubric(plan["zero"]), episode(90))

    # a reset mid-episode drops the unscored episode's files
    rubric = KeyshotRubric(plan["healthy"])
    for act, obs in episode(100)[:2]:
        rubric(act, obs)
    folder = rubric._recorder.episode.folder
    out["reset"] = {"before": folder.is_dir(), "steps": len(rubric.trajectory)}
    rubric.reset()
    out["reset"].update(after=folder.exists(), steps_after=len(rubric.trajectory))

    # no config given and none in the environment: one line naming the variable
    os.environ.pop(shared.CONFIG_ENV, None)
    try:
        KeyshotRubric()
        out["no_config"] = None
    except Exception as exc:  # noqa: BLE001 - the message is what is checked
        out["no_config"] = f"{type(exc).__name__}: {exc}"
    out["kept"] = sorted(p.name for p in Path(plan["keep"]).glob("*.jsonl"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
