"""``python -m keyshot.env.miniwob [TASK]``: check the live browser set-up with one scripted episode."""

from __future__ import annotations

import argparse
import json
import sys

from keyshot.env.miniwob.agents import ScriptedAgent
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.setup import MiniWoBError
from keyshot.env.play import run_episode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m keyshot.env.miniwob",
        description="Check the live browser set-up: one scripted MiniWoB episode.",
    )
    parser.add_argument("task", nargs="?", default="click-button")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        with MiniWoBBrowser(args.task, seed=args.seed) as browser:
            episode = run_episode(browser, ScriptedAgent())
            report = {
                "task": browser.task_id,
                "goal": browser.task,
                "steps": len(episode.screenshots),
                "miniwob_reward": browser.reward,
                "chromium": str(browser.setup.chromium),
            }
            episode.discard()
    except MiniWoBError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0 if report["miniwob_reward"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
