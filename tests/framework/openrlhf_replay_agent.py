"""An OpenRLHF agent file (``--train.agent_func_path``) whose environment replays a dict rollout's
screenshots, one per step; the label is the rollout as JSON (``{"task", "screenshots", ...}``), and a
``"raise_at": N`` key makes the environment fail at step N (the tests' exception path).
bench/reward.py's OpenRLHF row loads it through OpenRLHF's own executor
(tests/framework/openrlhf_rollouts.py), so OpenRLHF, not the bench, drives every episode."""

import asyncio
import json

from openrlhf.utils.agent import AgentInstanceBase

from keyshot.frameworks.openrlhf.executor import KeyshotAgentExecutor
from keyshot.frameworks.openrlhf.reward import KeyshotAgentInstance, Observation


class AgentInstance(KeyshotAgentInstance, AgentInstanceBase):
    async def start(self, label):
        rollout = json.loads(label)
        self.shots, self.at, self.raise_at = rollout["screenshots"], 0, rollout.get("raise_at")
        return rollout["task"], Observation("page 0", self.shots[0])

    async def act(self, action_text):
        self.at += 1
        await asyncio.sleep(0)
        if self.at == self.raise_at:
            raise RuntimeError(f"the replayed environment failed at step {self.at}")
        done = self.at == len(self.shots) - 1
        return Observation(f"page {self.at}", self.shots[self.at], done=done, answer="done" if done else None)


class AgentExecutor(KeyshotAgentExecutor):
    agent_instance_cls = AgentInstance
