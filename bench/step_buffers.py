"""What a ``keyshot reward env`` step leaves behind in the server's memory, with and without the fixed
glibc mmap threshold (``keyshot.infer.common.processes.return_large_buffers``), measured in the same run.

    .venv-openenv/bin/python -m bench.step_buffers [--sessions 24] [--steps 3] [--json FILE]

Each session is a thread of its own, as in OpenEnv's server (an executor per session): a step decodes a
1920x1080 PNG into the page's fields (``wire_fields``), builds keyshot's observation, has the rubric read
its screenshot (``screenshot_of``) and write it as a PNG (what the episode keeps), then OpenEnv's
``serialize_observation`` and ``WSObservationResponse`` encode it (the event loop's part), and every
session keeps its last answer. Printed: the RSS each session adds, both ways, and their ratio. Each way runs
in a process of its own (the threshold is process-wide).
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
from PIL import Image

from bench import record
from bench.record import REPO, Rows, ratio_table


def step_memory(sessions: int, steps: int, fixed: bool) -> float:
    """RSS added per session after ``steps`` steps of ``sessions`` sessions (MiB)."""
    from openenv.core.env_server.serialization import serialize_observation
    from openenv.core.env_server.types import WSObservationResponse

    from keyshot.env.page import Page
    from keyshot.frameworks.openenv.rubric import screenshot_of
    from keyshot.frameworks.openenv.server import PixelObservation
    from keyshot.frameworks.openenv.wire import wire_fields
    from keyshot.infer.common.processes import return_large_buffers
    from keyshot.infer.testing.images import encoded

    if fixed:
        return_large_buffers()
    rng = np.random.default_rng(0)
    pixels = (
        rng.integers(0, 40, (1080, 1920, 3), dtype=np.uint8) + np.arange(1920, dtype=np.uint8)[None, :, None]
    )
    png = encoded(Image.fromarray(pixels), "PNG", compress_level=1)

    def step(_: int) -> PixelObservation:
        fields = wire_fields(Page("Goal: x\n\nPage structure:\nRootWebArea", png, 0, False), "x")
        observation = PixelObservation.model_construct(
            **fields, url="u", done=False, reward=None, metadata={}
        )
        kept = io.BytesIO()
        screenshot_of(observation.screenshot).save(kept, format="PNG")
        return observation

    executors = [ThreadPoolExecutor(1) for _ in range(sessions)]
    start = psutil.Process().memory_info().rss
    held = []
    for _ in range(steps):
        observations = [f.result() for f in [e.submit(step, i) for i, e in enumerate(executors)]]
        answers = [WSObservationResponse(data=serialize_observation(o)) for o in observations]
        for answer in answers:
            answer.model_dump_json()
        held = [observations, answers]  # noqa: F841  (each session's last answer, as OpenEnv's handler keeps it)
    return (psutil.Process().memory_info().rss - start) / 2**20 / sessions


def rows_of(figures: dict) -> Rows:
    mib = figures["mib_per_session"]
    row = (
        "RSS a session keeps: glibc's mmap threshold fixed at 1 MiB vs glibc's own",
        f"{mib['fixed'] / mib['glibc']:.2f}×",
        f"{mib['fixed']:.1f} vs {mib['glibc']:.1f} MiB a session after {figures['steps']} steps of "
        f"{figures['sessions']} sessions, each a thread (1920x1080 screenshots; the screenshot's array is 5.9 MiB)",
    )
    return Rows((ratio_table([row]),))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=24)
    parser.add_argument("--steps", type=int, default=3)
    record.json_option(parser)
    parser.add_argument("--way", choices=["fixed", "glibc"], help=argparse.SUPPRESS)  # one way, in a child
    args = parser.parse_args(argv)
    if args.way:
        print(json.dumps(step_memory(args.sessions, args.steps, args.way == "fixed")))
        return 0
    figures = {}
    for way in ("glibc", "fixed"):
        command = [sys.executable, "-m", "bench.step_buffers", "--sessions", str(args.sessions)]
        command += ["--steps", str(args.steps), "--way", way]
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, check=True)
        figures[way] = json.loads(done.stdout.strip().splitlines()[-1])
    figures = {"sessions": args.sessions, "steps": args.steps, "mib_per_session": figures}
    return record.finish(args.json, figures, rows_of, __spec__.name, argv)


if __name__ == "__main__":
    sys.exit(main())
