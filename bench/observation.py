"""What one step of TRL's BrowserGym example costs on ``keyshot reward env``, at OpenEnv's 1280x720 and at
MiniWoB's own page (``--viewport miniwob``), measured in the same run. TRL's tool loop steps its
environments one at a time, so a generation batch takes (1 + steps) x sessions x this.

    nice .venv/bin/python -m bench.observation [--steps 4] [--viewports 1280x720,miniwob] [--json FILE]

For each viewport the server (in .venv-openenv, against the fake judge) serves OpenEnv's own
``BrowserGymEnv`` client (in .venv-openenv-trl, as the example uses it), which resets a click-test page and
calls ``noop()`` ``--steps`` times (BrowserGym's noop waits 1 s). Printed per viewport: the median seconds
of a step at the client, of the client's own parse of such an answer (``json.loads`` and OpenEnv's
``BrowserGymObservation``, on the same JSON), of the example's turning it into an image (``np.array``, PIL's
thumbnail to 512), the screenshot's shape and the JSON's size; then each figure's ratio to the first
viewport's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import record
from bench.record import REPO, Rows, Table


def play(url: str, steps: int) -> dict:
    """(In the client's venv.) One episode through ``BrowserGymEnv``, each step timed."""
    import numpy as np
    from browsergym_env import BrowserGymAction, BrowserGymEnv
    from browsergym_env.models import BrowserGymObservation
    from PIL import Image

    env = BrowserGymEnv(base_url=url)
    try:
        started = time.perf_counter()
        result = env.reset(task_name="click-test")
        reset_s = time.perf_counter() - started
        step_s, parse_s, image_s = [], [], []
        for _ in range(steps):
            started = time.perf_counter()
            result = env.step(BrowserGymAction(action_str="noop()"))
            step_s.append(time.perf_counter() - started)
            text = result.observation.model_dump_json()  # the answer's observation as the wire carries it
            started = time.perf_counter()
            BrowserGymObservation.model_validate(json.loads(text))
            parse_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            image = Image.fromarray(np.array(result.observation.screenshot, dtype=np.uint8))
            image.thumbnail((512, 512), Image.LANCZOS)  # what the example does with it
            image_s.append(time.perf_counter() - started)
    finally:
        env.close()
    return {
        "reset_s": round(reset_s, 2),
        "step_s": round(statistics.median(step_s), 2),
        "client_parse_s": round(statistics.median(parse_s), 2),
        "example_image_s": round(statistics.median(image_s), 3),
        "shape": list(np.asarray(result.observation.screenshot).shape),
        "json_mb": round(len(text) / 1e6, 1),
    }


def measure(viewport: str, steps: int, tmp: Path) -> dict:
    from keyshot.infer.testing.configs import fake_judge_config
    from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
    from keyshot.infer.testing.frameworks import framework_python
    from keyshot.infer.testing.launch import start_reward_env

    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        scorer_endpoint = {"base_url": scorer.base_url, "model": "webjudge-7b", "api_key_env": None}
        config = fake_judge_config(tmp / "reward.yaml", judge.base_url, {"endpoint": scorer_endpoint})
        extra = ["--miniwob", "click-test", "--max-steps", str(steps + 1), "--viewport", viewport]
        with open(tmp / "server.log", "w") as log:
            served = start_reward_env(
                framework_python("openenv"), config, *extra, "--max-sessions", "1", stderr=log, timeout_s=300
            )
        try:
            client = subprocess.run(
                [
                    str(framework_python("openenv", "trl")),
                    "-m",
                    "bench.observation",
                    "--client",
                    served.url,
                    "--steps",
                    str(steps),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                timeout=600,
            )
            if client.returncode:
                raise SystemExit(f"the client failed: {client.stderr[-2000:]}")
        finally:
            served.stop(grace_s=120)
    return {"viewport": viewport, **json.loads(client.stdout.strip().splitlines()[-1])}


FIGURES = ("reset_s", "step_s", "client_parse_s", "example_image_s")


def rows_of(figures: dict) -> Rows:
    """A row per viewport, each figure after the first row's with its ratio to the first's."""
    base, rows = figures["viewports"][0], []
    for i, row in enumerate(figures["viewports"]):
        cells = [row["viewport"]]
        for key in (*FIGURES, "json_mb"):
            ratio = f" ({row[key] / base[key]:.2f}x)" if i and base[key] else ""
            cells.append(f"{row[key]}{ratio}")
        cells.insert(5, "x".join(map(str, row["shape"])))
        rows.append(tuple(cells))
    columns = (
        "viewport",
        "reset s",
        "step s",
        "the client's parse of an answer s",
        "the example's image s",
        "screenshot",
        "JSON MB",
    )
    return Rows((Table(columns, tuple(rows), "lrrrrlr"),))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--viewports", default="1280x720,miniwob")
    record.json_option(parser)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # the client's own run
    args = parser.parse_args(argv)
    if args.client:
        print(json.dumps(play(args.client, args.steps)))
        return 0
    from keyshot.infer.testing.frameworks import missing

    for flavour in ("", "trl"):
        if missing("openenv", flavour):
            raise SystemExit(missing("openenv", flavour))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for viewport in args.viewports.split(","):
            rows.append(measure(viewport, args.steps, Path(tmp)))
            print(json.dumps(rows[-1]), flush=True)
    return record.finish(args.json, {"steps": args.steps, "viewports": rows}, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
