"""BrowserGym's own experiment loop (browsergym-experiments' ExpArgs.run) on a MiniWoB task, with a scripted
agent that clicks what the goal names (keyshot.env.miniwob.agents.ScriptedAgent) or one that clicks at
random; each run is an AgentLab-format folder (screenshot_step_N.png, step_N.pkl.gz, summary_info.json).

    python tests/support/browsergym_loop.py ROOT TASK AGENT:SEED[,SEED] [AGENT:SEED ...]   (AGENT: named | random)

Run by path in a process of its own (playwright is slow where many modules are loaded); prints the run
folders as a JSON list. The loop's own environment launches Chromium without keyshot's arguments, and
counts tokens with tiktoken: keyshot's prepare_browser (the set-up exported into this process) makes both
work here.
"""

from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from browsergym.experiments.agent import Agent, AgentInfo
from browsergym.experiments.loop import AbstractAgentArgs, EnvArgs, ExpArgs

from keyshot.env.miniwob.agents import ScriptedAgent, random_action
from keyshot.env.miniwob.setup import prepare_browser
from keyshot.env.page import Page


def _page(obs: dict) -> Page:
    return Page(f"Goal: {obs['goal']}\n\nPage structure:\n{obs['axtree_txt']}", None, 0, False)


class NamedTargetAgent(Agent):
    def __init__(self):
        self.script = ScriptedAgent()

    def get_action(self, obs: dict) -> tuple[str | None, AgentInfo]:
        action = self.script(_page(obs))
        return action, AgentInfo(think=f"the goal names it: {action}")


class RandomClickAgent(Agent):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def get_action(self, obs: dict) -> tuple[str, AgentInfo]:
        action = random_action(_page(obs), self.rng)
        return action, AgentInfo(think="a click at random")


@dataclass
class NamedTargetAgentArgs(AbstractAgentArgs):
    def make_agent(self) -> Agent:
        return NamedTargetAgent()


@dataclass
class RandomClickAgentArgs(AbstractAgentArgs):
    seed: int = 0

    def make_agent(self) -> Agent:
        return RandomClickAgent(self.seed)


def main(argv: list[str]) -> int:
    root, task, *specs = argv
    prepare_browser()
    runs = []
    plan = [
        (kind, int(seed)) for spec in specs for kind, seeds in [spec.split(":")] for seed in seeds.split(",")
    ]
    for kind, seed in plan:
        agent = NamedTargetAgentArgs() if kind == "named" else RandomClickAgentArgs(seed=seed)
        exp = ExpArgs(
            agent_args=agent,
            env_args=EnvArgs(task_name=f"miniwob.{task}", task_seed=seed, max_steps=3, headless=True),
        )
        exp.prepare(Path(root))
        exp.run()
        runs.append(str(exp.exp_dir))
    print(json.dumps(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
