"""An OpenRLHF multi-turn agent file (``--train.agent_func_path``) whose reward is keyshot's WebJudge.

Modeled on OpenRLHF's ``examples/python/vlm_multiturn_agent.py``: OpenRLHF loads this file by path with no
arguments and builds ``AgentExecutor``; each rollout gets its own ``AgentInstance``. keyshot's
``KeyshotAgentInstance`` does the reward part (an Episode per rollout, every page's screenshot recorded and
shown to the policy, the final step's reward awaited through one process-wide batcher) and
``KeyshotAgentExecutor`` shows the policy the first page, judges an episode that OpenRLHF stops at its
token budget and ends every rollout, whichever way it ends, with one ``close``; this file writes only the
environment part and where a page goes in the chat. The environment here is a live MiniWoB page in
headless Chromium for a label ``miniwob:TASK:SEED`` (e.g. ``miniwob:click-button:3``; ``make
setup-browser``), else the replay stand-in: the label is a recorded trajectory folder, replayed one
screenshot per step until its last. Put your browser in ``start`` / ``act`` / ``close`` for real training.

On a cluster (docs/reward.md)::

    export KEYSHOT_REWARD_CONFIG=configs/reward/openrlhf.yaml
    python3 -m openrlhf.cli.train_ppo_ray --train.agent_func_path examples/reward/openrlhf_agent.py \\
        --actor.model_name_or_path Qwen/Qwen3.5-0.8B --data.image_key images --data.label_key label ...

Here, without OpenRLHF: the file drives its own instances through reset/step, as OpenRLHF's executor does::

    KEYSHOT_REWARD_CONFIG=configs/reward/local.yaml python examples/reward/openrlhf_agent.py LABEL [LABEL ...]

(a MiniWoB label is played by the scripted agent that clicks what the goal names, a folder by clicks)
"""

import asyncio
import dataclasses
import functools
import json
import sys

from keyshot.env.miniwob.agents import ScriptedAgent
from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.play import record_failure
from keyshot.env.replay import ReplayBrowser
from keyshot.frameworks.openrlhf.reward import KeyshotAgentInstance
from keyshot.infer.common.errors import KeyshotError

try:
    from openrlhf.utils.agent import AgentInstanceBase

    from keyshot.frameworks.openrlhf.executor import KeyshotAgentExecutor
except ImportError:  # tried here without OpenRLHF: __main__ below drives the instances itself
    AgentInstanceBase = KeyshotAgentExecutor = None

# Qwen-style turn markers and image placeholder, as in OpenRLHF's VLM example (adjust for your model)
USER_START = "\n<|im_start|>user\n"
USER_END = "<|im_end|>\n<|im_start|>assistant\n"
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"


class AgentInstance(KeyshotAgentInstance, *([AgentInstanceBase] if AgentInstanceBase else [])):
    """The environment part: open the label's page, act, show the next page, give the browser back."""

    def __init__(self, pool=None):
        super().__init__()
        self.pool = (
            pool  # the executor's BrowserPool; without one (driven here) a live page opens its own browser
        )
        self.browser = None

    async def start(self, label):
        if str(label).startswith("miniwob:"):  # a live page: miniwob:TASK:SEED (its own thread: it blocks)
            _, task, seed = str(label).split(":")
            opened = self.pool.lease if self.pool is not None else functools.partial(MiniWoBBrowser, task)
            self.browser = await asyncio.to_thread(opened)
            self.page = page = await asyncio.to_thread(self.browser.reset, int(seed), task)
        else:
            self.browser = ReplayBrowser(label)
            self.page = page = self.browser.reset()
        spec = {
            "task": self.browser.task,
            "start_url": self.browser.start_url,
            "task_id": self.browser.task_id,
        }
        return spec, dataclasses.replace(page, text=self._page_text(page))  # its text for the policy

    async def act(self, action_text):
        self.page = page = await asyncio.to_thread(self.browser.act, action_text)
        record_failure(self.episode, page)  # a browser that died: no reward, the reason logged
        if page.done:  # the episode is over: no turn of the policy's follows (the page is judged, not shown)
            return dataclasses.replace(page, text="\n<|im_end|>\n")
        return dataclasses.replace(page, text=f"{USER_START}{self._page_text(page)}{USER_END}")

    async def close(self):
        """keyshot calls this once, however the episode ended (done, the token budget, an error): the
        browser closed (a pool's page given back to it)."""
        if self.browser is not None:
            await asyncio.to_thread(self.browser.close)

    def first_prompt(self, prompt, page):
        """The first page inside the dataset prompt's user turn (before the assistant's), else its own turn."""
        if prompt.endswith(USER_END):
            return f"{prompt[: -len(USER_END)]}\n{page.text}{USER_END}"
        return f"{prompt}{USER_START}{page.text}{USER_END}"

    @staticmethod
    def _page_text(page):
        image = f"{IMAGE_PLACEHOLDER}\n" if page.screenshot is not None else ""
        return f"{image}{page.text}\nWhat should we do next?"


if KeyshotAgentExecutor is not None:

    class AgentExecutor(KeyshotAgentExecutor):  # the name OpenRLHF's vLLM engine loads
        """Live pages come from one BrowserPool per engine, opened at the first live label within the
        machine's browser budget: a rollout takes a browser, each reset a new episode in its page."""

        agent_instance_cls = AgentInstance
        pool = None

        def new_agent(self, label):
            if self.pool is None and str(label).startswith("miniwob:"):
                self.pool = BrowserPool(BrowserBudget.for_machine(), str(label).split(":")[1])
            return AgentInstance(self.pool)

        def close(self):
            if self.pool is not None:
                self.pool.close()


async def drive(label: str, action: str = "click('next')") -> dict:
    """One rollout through reset/step with OpenRLHF's states, until done; the final step's result. A
    MiniWoB page is played by the scripted agent (``action`` where it finds nothing to do)."""
    agent = AgentInstance()
    await agent.reset({"observation": "", "label": label})
    script = ScriptedAgent() if isinstance(agent.browser, MiniWoBBrowser) else None
    while True:
        text = (script(agent.page) if script else None) or action
        out = await agent.step({"observation_text": "", "action_text": text, "label": label})
        if out["done"]:
            return out


async def main(labels: list[str]) -> list[dict]:
    finals = await asyncio.gather(*(drive(label) for label in labels))
    return [
        {
            "label": label,
            "reward": float(out["rewards"][0]),
            "failed": float(out["extra_logs"]["keyshot_failed"][0]),
        }
        for label, out in zip(labels, finals, strict=True)
    ]


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(
            "usage: KEYSHOT_REWARD_CONFIG=CONFIG python examples/reward/openrlhf_agent.py LABEL [LABEL ...]"
            " (a trajectory folder, or miniwob:TASK:SEED)"
        )
    try:
        print(json.dumps(asyncio.run(main(sys.argv[1:]))))
    except KeyshotError as exc:
        sys.exit(f"error: {exc}")
