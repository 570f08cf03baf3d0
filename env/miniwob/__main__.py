"""``python -m keyshot.env.miniwob [TASK]``: check the live browser set-up with one scripted episode."""

from __future__ import annotations

import argparse
import json
import sys

from keyshot.env.miniwob.settings import SessionSettings
from keyshot.infer.common.command import Command


def check_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "task", nargs="?", default=SessionSettings.task, help="the MiniWoB task (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0)


def check(args: argparse.Namespace) -> int:
    """One scripted episode of ``args.task``; its report as one JSON line (exit 1: no MiniWoB reward)."""
    from keyshot.env.miniwob.agents import ScriptedAgent
    from keyshot.env.miniwob.client import MiniWoBBrowser
    from keyshot.env.play import run_episode

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
    print(json.dumps(report))
    return 0 if report["miniwob_reward"] is not None else 1


COMMAND = Command(
    "miniwob",
    help="check the live browser set-up: one scripted MiniWoB episode",
    arguments=check_arguments,
    run=check,
)


def main(argv: list[str] | None = None) -> int:
    """Through keyshot's one command layer: a MiniWoBError (no Chromium, an unknown task) is one line, exit 2."""
    from keyshot.infer.cli import run_alone

    return run_alone(COMMAND, argv, prog="python -m keyshot.env.miniwob")


if __name__ == "__main__":
    sys.exit(main())
