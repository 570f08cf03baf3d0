"""GRPO on open-web tasks with keyshot's WebJudge as the reward, in TRL's ``environment_factory`` form.

Modeled on TRL's ``examples/scripts/openenv/browsergym.py``: one environment per rollout whose tool
methods (click, fill, send_keys, scroll, noop) return the page's screenshot with its text. Open-web tasks
have no programmatic reward, so the reward is keyshot's: every environment records its episode
(``EpisodeRecorder``) and ``keyshot.reward.trl.environment_reward`` scores the whole batch at once
(key points once per task, all scorer calls in flight together) instead of one ``get_reward`` after another.

On a cluster (BrowserGym through OpenEnv, a judge API and a served keyshot scorer; docs/reward.md)::

    pip install 'keyshot[reward]' trl "openenv-browsergym-env @ git+https://huggingface.co/spaces/openenv/browsergym_env"
    python examples/reward/trl_browsergym_grpo.py --keyshot-config configs/reward/trl.yaml \\
        --space-url https://YOUR-BROWSERGYM-SERVER --task-name TASK --use-vllm

Here, on live pages and no GPU (MiniWoB in headless Chromium, ``make setup-browser``; the tiny random
policy; docs/reward.md). The trainer's log has MiniWoB's own reward beside keyshot's each step
(``miniwob/reward``) and how often keyshot's verdict agrees with it (``miniwob/agreement``)::

    python examples/reward/trl_browsergym_grpo.py --keyshot-config configs/reward/local.yaml \\
        --miniwob click-button --tiny-model --train-steps 1

With no browser, a recorded trajectory replayed stands in for the pages::

    python examples/reward/trl_browsergym_grpo.py --keyshot-config configs/reward/local.yaml \\
        --replay tests/fixtures/trajectories/online_mind2web_v1 --tiny-model --train-steps 1
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import statistics
import sys
from abc import ABC, abstractmethod
from datetime import datetime
from pathlib import Path

from datasets import Dataset

from keyshot.env.miniwob.budget import BrowserBudget
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.setup import browser_setup
from keyshot.env.page import Page
from keyshot.env.replay import ReplayBrowser
from keyshot.infer.common.errors import KeyshotError
from keyshot.reward import shared_model
from keyshot.reward.trl import EpisodeRecorder, environment_reward

SYSTEM_PROMPT = """You control a web browser to complete tasks.

The page structure shows elements as: [bid] element_type 'element_text'
For example: [13] button 'Click Me!' means the element has bid='13'.

You will see a screenshot of the page after each action. Use the visual information
along with the page structure to decide your next action.

Use the available tools to interact with the page:
- click: Click an element by its bid
- fill: Fill an input field with text
- send_keys: Send keyboard input
- scroll: Scroll the page
- noop: Do nothing

Complete the given task as efficiently as possible, then reply with your final answer."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="GRPO on web tasks with keyshot's WebJudge as the reward.")
    parser.add_argument(
        "--keyshot-config", required=True, help="a keyshot judge config (configs/reward/trl.yaml)"
    )
    parser.add_argument(
        "--model-id", default="Qwen/Qwen3.5-2B", help="the policy (a VLM with a tool-calling template)"
    )
    parser.add_argument(
        "--tiny-model", action="store_true", help="the tiny random Qwen2.5-VL as the policy (CPU)"
    )
    parser.add_argument(
        "--replay", default=None, help="replay recorded trajectories (a folder of them) instead of BrowserGym"
    )
    parser.add_argument(
        "--miniwob",
        default=None,
        help="live MiniWoB pages in headless Chromium instead of a BrowserGym server: task names, comma-separated "
        "(e.g. click-button,enter-text); the dataset's rows are their seeds",
    )
    parser.add_argument(
        "--max-browsers",
        type=int,
        default=None,
        help="with --miniwob: live pages this machine may hold at once (default: half the memory available "
        "at start, at 512 MiB per browser); a generation batch needing more refuses at start",
    )
    parser.add_argument(
        "--space-url", default="https://openenv-browsergym-env.hf.space", help="OpenEnv BrowserGym server"
    )
    parser.add_argument("--task-name", default="click-test", help="BrowserGym task name passed to reset()")
    parser.add_argument("--dataset-prompt", default="Complete the web task successfully.")
    parser.add_argument("--dataset-size", type=int, default=1000)
    parser.add_argument(
        "--keep-episodes", default=None, help="keep every episode there (keyshot judge reads it)"
    )
    parser.add_argument("--max-steps", type=int, default=10, help="actions per episode")
    parser.add_argument("--max-completion-length", type=int, default=1024)
    parser.add_argument("--max-tool-calling-iterations", type=int, default=None)
    parser.add_argument(
        "--image-size", type=int, default=512, help="resize screenshots for the policy; 0: keep"
    )
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--per-device-train-batch-size", type=int, default=None)
    parser.add_argument("--gradient-accumulation-steps", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-6)
    parser.add_argument("--num-epochs", type=int, default=1)
    parser.add_argument("--train-steps", type=int, default=-1, help="stop after this many optimizer steps")
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--output-dir", default=None)
    parser.add_argument("--report-to", default="none")
    parser.add_argument("--use-vllm", action="store_true", help="generate with vLLM")
    parser.add_argument("--vllm-mode", choices=("colocate", "server"), default="colocate")
    parser.add_argument("--vllm-server-url", default="http://localhost:8000")
    return parser.parse_args(argv)


class WebEnv(EpisodeRecorder, ABC):
    """The tools the policy calls; a subclass connects them to a browser (``_open`` and ``_do``, each
    giving a :class:`keyshot.env.page.Page`). Each page the policy is shown is recorded into the episode
    keyshot scores; a page with an ``error`` (the browser failed) ends the episode and fails it: its
    reward is None with that reason, counted in ``keyshot/failed``."""

    max_steps = 10
    image_size = 512

    def reset(self, **row) -> str:
        (task, start_url, task_id), page = self._open(row)
        self._start_episode(task, start_url=start_url, task_id=task_id)
        self.step_count = 0
        self.done = False
        self._show(page)
        return page.text

    def click(self, bid: str) -> list:
        """Click an element on the page.

        Args:
            bid: The BrowserGym ID of the element to click.

        Returns:
            The updated page observation with screenshot.
        """
        return self._act(f"click('{bid}')")

    def fill(self, bid: str, text: str) -> list:
        """Fill an input field with text.

        Args:
            bid: The BrowserGym ID of the input field.
            text: The text to type into the field.

        Returns:
            The updated page observation with screenshot.
        """
        return self._act(f"fill('{bid}', '{text}')")

    def send_keys(self, text: str) -> list:
        """Send keyboard input to the page.

        Args:
            text: The keyboard input to send.

        Returns:
            The updated page observation with screenshot.
        """
        return self._act(f"send_keys('{text}')")

    def scroll(self, direction: str) -> list:
        """Scroll the page.

        Args:
            direction: Direction to scroll, either 'up' or 'down'.

        Returns:
            The updated page observation with screenshot.
        """
        return self._act(f"scroll('{direction}')")

    def noop(self) -> list:
        """Do nothing and observe the current page state.

        Returns:
            The current page observation with screenshot.
        """
        return self._act("noop()")

    def _act(self, action: str) -> list:
        if self.done:
            raise ValueError("The episode is over: reply with your final answer.")
        self.step_count += 1
        page = self._do(action)
        content = [{"type": "text", "text": page.text}]
        if page.screenshot is not None:
            content.insert(0, {"type": "image", "image": page.image(self.image_size)})
        self._show(page, action)
        return content

    def _show(self, page: Page, action: str | None = None) -> None:
        """Record the page (its screenshot, after ``action``); a failed page fails the episode; a last
        page ends it."""
        self._record(page.screenshot, action=action)  # the action is kept without a screenshot too
        if page.error:
            self.episode.fail(page.error)
        self.done = page.done or page.error is not None or self.step_count >= self.max_steps
        if self.done:
            self._episode_over()

    def _episode_over(self) -> None:
        """The episode ended (its last page was shown): give back what it held."""

    @abstractmethod
    def _open(self, row: dict) -> tuple[tuple[str, str | None, str | None], Page]:
        """Open the page of a dataset row: (task, start URL, task id) and the first page."""

    @abstractmethod
    def _do(self, action: str) -> Page:
        """Carry out an action: the page after it."""


class ReplayEnv(WebEnv):
    """A recorded trajectory replayed, one screenshot per action (the dataset's ``trajectory`` column)."""

    def _open(self, row: dict):
        self.browser = ReplayBrowser(row["trajectory"])
        page = self.browser.reset()
        b = self.browser
        page.text = f"Goal: {b.task}\n\n{page.text}"
        return (b.task, b.start_url, b.task_id), page

    def _do(self, action: str) -> Page:
        return self.browser.act(action)


class MiniWoBEnv(WebEnv):
    """A live MiniWoB page in headless Chromium (keyshot.env.miniwob): the dataset row names the task and
    its seed. The run's browsers are a :class:`~keyshot.env.miniwob.pool.BrowserPool` (``pool``, set by
    ``main`` within the machine's browser budget, opened ahead): an environment takes one at its first
    reset, keeps it while its episodes follow one another (each reset a new MiniWoB episode in the same
    page) and gives it back when an episode ends (MiniWoB ends it, or the reward is computed), so no more
    browsers are open than a generation batch needs at once. A page that does not open, or a browser
    that dies, fails that episode (reward None with the reason) and the pool replaces the browser; the run
    goes on. ``miniwob_reward`` is MiniWoB's own reward of the last episode (None when it failed)."""

    pool: BrowserPool | None = None

    def __init__(self, *, keep_dir: str | None = None):
        super().__init__(keep_dir=keep_dir)
        self.browser = None
        self.miniwob_reward: float | None = None

    def _open(self, row: dict):
        task, seed = row["miniwob_task"], row["seed"]
        self.miniwob_reward = None
        try:
            if self.browser is None:
                self.browser = self.pool.acquire()
            page = self.browser.reset(seed=seed, task=task)
        except KeyshotError as exc:  # this episode fails with the reason; the pool replaces the browser
            self._episode_over()
            failure = str(exc)
            return (f"MiniWoB {task} (seed {seed})", None, f"miniwob.{task}.{seed}"), Page(
                f"Error: {failure}", None, 0, True, error=failure
            )
        b = self.browser
        return (b.task, b.start_url, b.task_id), page

    def _do(self, action: str) -> Page:
        return self.browser.act(action)

    def _episode_over(self) -> None:
        """MiniWoB's reward kept; the browser back to the pool (closed and replaced there if it failed)."""
        if self.browser is not None:
            self.miniwob_reward = self.browser.reward
            self.pool.release(self.browser)
            self.browser = None


class BrowserGymWebEnv(WebEnv):
    """OpenEnv's BrowserGym (as in TRL's example): the server picks the task, its goal is the task keyshot
    judges; a server of open-web tasks has no programmatic reward, which is what keyshot is for."""

    space_url = "https://openenv-browsergym-env.hf.space"
    task_name = "click-test"

    def __init__(self, *, keep_dir: str | None = None):
        from browsergym_env import BrowserGymEnv

        super().__init__(keep_dir=keep_dir)

        self.client = BrowserGymEnv(base_url=self.space_url)

    def _open(self, row: dict):
        obs = self.client.reset(task_name=self.task_name).observation
        task = obs.goal or row["prompt"][-1]["content"]
        return (task, obs.url or None, None), self._page(obs, False)

    def _do(self, action: str) -> Page:
        from browsergym_env import BrowserGymAction

        result = self.client.step(BrowserGymAction(action_str=action))
        return self._page(result.observation, result.done)

    @staticmethod
    def _page(obs, done: bool) -> Page:
        import numpy as np
        from PIL import Image

        screenshot = None
        if obs.screenshot is not None:
            buffer = io.BytesIO()
            Image.fromarray(np.array(obs.screenshot, dtype=np.uint8)).save(
                buffer, format="PNG", compress_level=1
            )
            screenshot = buffer.getvalue()
        parts = [f"Goal: {obs.goal}"] if obs.goal else []
        if obs.last_action_error and obs.error:
            parts.append(f"Error: {obs.error}")
        if obs.axtree_txt:
            parts.append(f"Page structure:\n{obs.axtree_txt[:2000]}")
        return Page("\n\n".join(parts) or "No observation available.", screenshot, 0, done)


def prompt(task: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]


def replay_dataset(root: Path) -> Dataset:
    """One row per recorded trajectory under ``root`` (itself one, or a folder of them)."""
    folders = (
        [root]
        if (root / "result.json").exists() or root.suffix == ".jsonl"
        else sorted(p for p in root.iterdir() if not p.name.startswith("."))
    )
    rows = [{"trajectory": str(f), "prompt": prompt(ReplayBrowser(f).task)} for f in folders]
    return Dataset.from_list(rows)


def miniwob_dataset(tasks: list[str], size: int) -> Dataset:
    """``size`` rows: the tasks in turn, each row its own seed (the instance: its goal and page)."""
    rows = [
        {
            "prompt": prompt(f"Complete the web task ({tasks[i % len(tasks)]})."),
            "miniwob_task": tasks[i % len(tasks)],
            "seed": i,
        }
        for i in range(size)
    ]
    return Dataset.from_list(rows)


def with_miniwob_reward(keyshot_reward):
    """keyshot's environment reward, also logging MiniWoB's own reward of each episode (``miniwob/reward``,
    per sample ``miniwob_reward``) and the fraction of episodes with a keyshot verdict where that verdict
    (``keyshot_success``) equals MiniWoB's success (``miniwob/agreement``; ``miniwob/compared``: how many).
    Every episode of the batch is over then: each environment gives its browser back to the pool."""

    async def reward(environments, log_metric=None, log_extra=None, **kwargs):
        fields: dict[str, list] = {}

        def keep(key, values):
            fields[key] = values
            if log_extra is not None:
                log_extra(key, values)

        rewards = await keyshot_reward(
            environments=environments, log_metric=log_metric, log_extra=keep, **kwargs
        )
        for env in environments:
            env._episode_over()
        truth = [env.miniwob_reward for env in environments]
        verdicts, failed = fields["keyshot_success"], fields["keyshot_failed"]  # logs.sample_logs' fields
        pairs = [(v, t) for v, t, f in zip(verdicts, truth, failed, strict=True) if t is not None and not f]
        if log_metric is not None:
            known = [t for t in truth if t is not None]
            log_metric("miniwob/reward", statistics.fmean(known) if known else 0.0)
            log_metric("miniwob/agreement", statistics.fmean(v == t for v, t in pairs) if pairs else 0.0)
            log_metric("miniwob/compared", float(len(pairs)))
        if log_extra is not None:
            log_extra("miniwob_reward", truth)
        return rewards

    reward.__name__ = keyshot_reward.__name__  # the trainer logs rewards/<name>/mean
    return reward


def tiny_policy(out: Path):
    """The tiny random Qwen2.5-VL, with TRL's Qwen3-VL chat template (the same special tokens; Qwen2.5-VL's
    own template renders no tool calls, which environment_factory needs)."""
    from transformers import AutoProcessor
    from trl.chat_template_utils import qwen3_vl_chat_template

    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    folder = build_tiny_qwen25vl(out)
    processor = AutoProcessor.from_pretrained(folder)
    processor.chat_template = qwen3_vl_chat_template
    return str(folder), processor


def live_pages_needed(config) -> int:
    """Live pages a generation batch holds at once in this process: TRL's environment pool grows to one
    environment per rollout of a generation batch (per-device batch × steps per generation, which is the
    gradient accumulation steps unless set), resets them all before the first generation and scores them
    together at the end."""
    return config.per_device_train_batch_size * config.steps_per_generation


def require_browsers(budget: BrowserBudget, config, args: argparse.Namespace) -> int:
    """The live pages the run needs at once; refuses (BrowserBudgetError, one line) beyond the budget."""
    needed = live_pages_needed(config)
    batch = "--per-device-train-batch-size" if args.per_device_train_batch_size else "--num-generations"
    budget.require(
        needed,
        f"a generation batch of {needed} rollouts ({batch} {config.per_device_train_batch_size} × "
        f"--gradient-accumulation-steps {config.steps_per_generation})",
        f"lower {batch} or --gradient-accumulation-steps until their product is at most {budget.max_browsers}, "
        "set --max-browsers where more memory is free, or serve the pages from another machine (keyshot "
        f"reward env --miniwob {args.miniwob} there) and pass its URL as --space-url",
    )
    return needed


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from trl import GRPOConfig, GRPOTrainer

    output_dir = Path(args.output_dir or f"outputs/keyshot-grpo-{datetime.now():%Y-%m-%d_%H-%M-%S}")
    config = GRPOConfig(
        output_dir=str(output_dir),
        use_vllm=args.use_vllm,
        vllm_mode=args.vllm_mode,
        vllm_server_base_url=args.vllm_server_url if args.use_vllm and args.vllm_mode == "server" else None,
        num_train_epochs=args.num_epochs,
        max_steps=args.train_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size or args.num_generations,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        num_generations=args.num_generations,
        max_completion_length=args.max_completion_length,
        max_tool_calling_iterations=args.max_tool_calling_iterations,
        logging_steps=args.logging_steps,
        log_completions=True,
        report_to=args.report_to,
        use_cpu=args.tiny_model,
        save_strategy="no",
        chat_template_kwargs={"enable_thinking": False},
    )
    if args.miniwob:  # a missing piece, or a batch beyond the machine's browsers, stops here: nothing opened
        tasks = [t.strip() for t in args.miniwob.split(",") if t.strip()]
        setup = browser_setup()
        budget = BrowserBudget.for_machine(args.max_browsers)
        needed = require_browsers(budget, config, args)
    reward_model = shared_model(
        args.keyshot_config
    )  # the reward's model, built now so a bad config stops here
    WebEnv.max_steps, WebEnv.image_size = args.max_steps, args.image_size
    reward = environment_reward(args.keyshot_config)
    pool = None
    try:
        if args.replay:
            dataset, env = replay_dataset(Path(args.replay)), ReplayEnv
        elif args.miniwob:
            MiniWoBEnv.pool = pool = BrowserPool(budget, tasks[0], setup=setup, max_steps=args.max_steps)
            pool.warm(needed)  # opened ahead, in parallel, while the policy loads
            dataset, env = miniwob_dataset(tasks, args.dataset_size), MiniWoBEnv
            reward = with_miniwob_reward(reward)
        else:
            BrowserGymWebEnv.space_url, BrowserGymWebEnv.task_name = args.space_url, args.task_name
            dataset = Dataset.from_dict({"prompt": [prompt(args.dataset_prompt)] * args.dataset_size})
            env = BrowserGymWebEnv
        model, processor = (
            tiny_policy(output_dir / "tiny-policy") if args.tiny_model else (args.model_id, None)
        )
        trainer = GRPOTrainer(
            model=model,
            processing_class=processor,
            reward_funcs=[reward],
            train_dataset=dataset,
            args=config,
            environment_factory=functools.partial(env, keep_dir=args.keep_episodes),
        )
        trainer.train()
    finally:
        if pool is not None:
            pool.close()
        reward_model.close()
    summary = {"steps": trainer.state.global_step, "log": trainer.state.log_history}
    if pool is not None:
        summary["browsers"] = {
            "budget": budget.max_browsers,
            "opened": pool.opened,
            "most_open": pool.max_alive,
            "replaced": pool.replaced,
            "failed_opens": pool.failed_opens,
        }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyshotError as exc:
        if os.environ.get("KEYSHOT_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
