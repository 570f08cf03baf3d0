"""Browser environments for TRL's ``GRPOTrainer(environment_factory=...)``, each recording the
:class:`~keyshot.reward.episode.Episode` keyshot's reward scores (``keyshot.frameworks.trl.reward.environment_reward``
reads ``env.episode``).

The tools the policy calls (``click``, ``fill``, ``send_keys``, ``scroll``, ``noop``) are TRL's BrowserGym
example's; each returns the page after the action, its screenshot and text. Settings are constructor
arguments, so ``functools.partial(MiniWoBEnv, pool=pool, max_steps=5)`` is the factory (TRL calls it
with no argument, and offers every public method of the class as a tool: everything else here starts
with ``_``)::

    pool = BrowserPool(BrowserBudget.for_machine(), "click-button")
    GRPOTrainer(..., environment_factory=functools.partial(MiniWoBEnv, pool=pool),
                reward_funcs=[with_miniwob_reward(environment_reward("configs/reward/trl.yaml"))])

- :class:`MiniWoBEnv`: a live MiniWoB page leased from a :class:`~keyshot.env.miniwob.pool.BrowserPool`
  at each reset and given back when the episode ends (the dataset row names ``miniwob_task`` and ``seed``);
- :class:`ReplayEnv`: a recorded trajectory replayed (the row's ``trajectory``), no browser needed;
- :class:`BrowserGymWebEnv`: OpenEnv's BrowserGym server (``BrowserGymEnv`` client, ``space_url``), such
  as ``keyshot reward env`` or the Hugging Face Space.

A page whose browser failed ends its episode and fails it (reward None with the reason, counted in
``keyshot/failed``); the run goes on.
"""

from __future__ import annotations

import io
import os
import statistics
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.page import Page
from keyshot.env.replay import ReplayBrowser
from keyshot.infer.common.errors import KeyshotError
from keyshot.reward.episode import EpisodeRecorder

if TYPE_CHECKING:
    from keyshot.env.miniwob.client import MiniWoBBrowser
    from keyshot.env.miniwob.pool import BrowserPool

SYSTEM_PROMPT = """You are an agent in a web browser, and you have a task to do on the page in front of you.

Each turn you get the page's text, where every element you can act on carries its id in brackets, e.g.
[42] link 'Sign in' is the link with bid '42', and, after each action, a screenshot of the page.

Act with the tools: click(bid), fill(bid, text), send_keys(text), scroll(direction) and noop() to look again.
Take as few actions as the task needs; when it is done, answer in plain text."""


def prompt(task: str) -> list[dict]:
    """A dataset row's conversational prompt: the system prompt and ``task``."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task}]


def miniwob_rows(tasks: list[str], size: int) -> list[dict]:
    """``size`` dataset rows for :class:`MiniWoBEnv`: the tasks in turn, each row its own seed (the
    instance: its goal and page)."""
    return [
        {
            "prompt": prompt(f"Complete the web task ({tasks[i % len(tasks)]})."),
            "miniwob_task": tasks[i % len(tasks)],
            "seed": i,
        }
        for i in range(size)
    ]


class WebEnv(EpisodeRecorder, ABC):
    """The tools the policy calls; a subclass connects them to a browser (``_open`` and ``_do``, each
    giving a :class:`~keyshot.env.page.Page`). An :class:`~keyshot.reward.episode.EpisodeRecorder`: every
    page the policy is shown is recorded in ``episode``, the first with no action, then each action with
    the page it led to. ``max_steps`` actions end an episode (default: the session settings',
    :class:`~keyshot.env.miniwob.settings.SessionSettings`); ``image_size`` shrinks screenshots for the
    policy (0: keep); ``keep_dir`` keeps every episode there (``keyshot judge`` reads it)."""

    def __init__(
        self,
        *,
        max_steps: int | None = None,
        image_size: int = 512,
        keep_dir: str | os.PathLike | None = None,
    ):
        super().__init__(keep_dir=keep_dir)
        self.max_steps = SessionSettings().max_steps if max_steps is None else max_steps
        self.image_size = image_size
        self.step_count = 0
        self.done = False

    def reset(self, **row) -> str:
        (task, start_url, task_id), page = self._open(row)
        self._start_episode(task, start_url, task_id)
        self.step_count = 0
        self.done = False
        self._show(page)
        return page.text

    def click(self, bid: str) -> list:
        """Click one element of the page.

        Args:
            bid: the element's id, as the page's text shows it (BrowserGym's bid).

        Returns:
            The page after the click: its text, and its screenshot.
        """
        return self._act(f"click('{bid}')")

    def fill(self, bid: str, text: str) -> list:
        """Type text into one input of the page, replacing what it held.

        Args:
            bid: the input's id, as the page's text shows it (BrowserGym's bid).
            text: what to type.

        Returns:
            The page after typing: its text, and its screenshot.
        """
        return self._act(f"fill('{bid}', '{text}')")

    def send_keys(self, text: str) -> list:
        """Press keys on the page where its focus is (Enter, Tab, letters...).

        Args:
            text: the keys to press.

        Returns:
            The page after the keys: its text, and its screenshot.
        """
        return self._act(f"send_keys('{text}')")

    def scroll(self, direction: str) -> list:
        """Move the page's view up or down.

        Args:
            direction: 'up' or 'down'.

        Returns:
            The page after scrolling: its text, and its screenshot.
        """
        return self._act(f"scroll('{direction}')")

    def noop(self) -> list:
        """Look at the page again without acting.

        Returns:
            The page as it is now: its text, and its screenshot.
        """
        return self._act("noop()")

    def _act(self, action: str) -> list:
        if self.done:
            raise ValueError("The episode is over: reply with your final answer.")
        self.step_count += 1
        page = self._do(action)
        content: list[dict[str, Any]] = [{"type": "text", "text": page.text}]
        if page.screenshot is not None:
            content.insert(0, {"type": "image", "image": page.image(self.image_size)})
        self._show(page, action)
        return content

    def _show(self, page: Page, action: str | None = None) -> None:
        """Record ``action`` and the page it led to (the action is kept without a screenshot too); a failed
        page fails the episode; a last page ends it."""
        self._record(page.screenshot, action=action)
        if page.error:
            self.episode.fail(page.error)
        self.done = page.done or page.error is not None or self.step_count >= self.max_steps
        if self.done:
            self._episode_over()

    def _episode_over(self) -> None:  # noqa: B027  (optional: an environment holding nothing needs none)
        """The episode ended (its last page was shown, or its reward is computed): give back what it held.
        Idempotent."""

    @abstractmethod
    def _open(self, row: dict) -> tuple[tuple[str, str | None, str | None], Page]:
        """Open the page of a dataset row: (task, start URL, task id) and the first page."""

    @abstractmethod
    def _do(self, action: str) -> Page:
        """Carry out an action: the page after it."""


class ReplayEnv(WebEnv):
    """A recorded trajectory replayed, one screenshot per action (the dataset row's ``trajectory``)."""

    def _open(self, row: dict):
        self._browser = ReplayBrowser(row["trajectory"])
        page = self._browser.reset()
        b = self._browser
        page.text = f"Goal: {b.task}\n\n{page.text}"
        return (b.task, b.start_url, b.task_id), page

    def _do(self, action: str) -> Page:
        return self._browser.act(action)


class MiniWoBEnv(WebEnv):
    """A live MiniWoB page (the row's ``miniwob_task`` at its ``seed``), a session leased from ``pool`` at
    each reset and given back when the episode ends (MiniWoB ends it, ``max_steps``, or the reward is
    computed): a trainer's pages are the pool's, within its budget. A page that does not open, or a
    browser that dies, fails that episode (reward None with the reason); the run goes on.
    ``miniwob_reward`` is MiniWoB's own reward of the last episode (None when it failed)."""

    def __init__(self, *, pool: BrowserPool, max_steps: int | None = None, **settings):
        super().__init__(max_steps=pool.settings.max_steps if max_steps is None else max_steps, **settings)
        self._pool = pool
        self._browser: MiniWoBBrowser | None = None
        self.miniwob_reward: float | None = None

    def _open(self, row: dict):
        task, seed = row["miniwob_task"], row["seed"]
        self._episode_over()
        self.miniwob_reward = None
        try:
            self._browser = self._pool.lease(task)
            page = self._browser.reset(seed=seed, task=task)
        except KeyshotError as exc:  # this episode fails with the reason (a budget refusal included)
            self._episode_over()
            failure = str(exc)
            return (f"MiniWoB {task} (seed {seed})", None, f"miniwob.{task}.{seed}"), Page(
                f"Error: {failure}", None, 0, True, error=failure
            )
        b = self._browser
        return (b.task, b.start_url, b.task_id), page

    def _do(self, action: str) -> Page:
        return self._browser.act(action)

    def _episode_over(self) -> None:
        """MiniWoB's reward kept; the session given back to the pool."""
        browser, self._browser = self._browser, None
        if browser is not None:
            self.miniwob_reward = browser.reward
            browser.close()


class BrowserGymWebEnv(WebEnv):
    """OpenEnv's BrowserGym server at ``space_url`` (as in TRL's example: ``keyshot reward env`` or the
    Hugging Face Space): the server picks the ``task_name`` instance, its goal is the task keyshot judges.
    Needs OpenEnv's BrowserGym client (``browsergym_env``)."""

    def __init__(self, *, space_url: str, task_name: str = "click-test", **settings):
        from browsergym_env import BrowserGymEnv

        super().__init__(**settings)
        self.task_name = task_name
        self._client = BrowserGymEnv(base_url=space_url)

    def _open(self, row: dict):
        obs = self._client.reset(task_name=self.task_name).observation
        task = obs.goal or row["prompt"][-1]["content"]
        return (task, obs.url or None, None), self._page(obs, False)

    def _do(self, action: str) -> Page:
        from browsergym_env import BrowserGymAction

        result = self._client.step(BrowserGymAction(action_str=action))
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


def with_miniwob_reward(keyshot_reward):
    """keyshot's environment reward, also logging MiniWoB's own reward of each episode (``miniwob/reward``,
    per sample ``miniwob_reward``) and the fraction of episodes with a keyshot verdict where that verdict
    (``keyshot_success``) equals MiniWoB's success (``miniwob/agreement``; ``miniwob/compared``: how
    many). Every episode of the batch is over then: each environment gives its page back to the pool."""

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
        truth = [getattr(env, "miniwob_reward", None) for env in environments]
        verdicts, failed = (
            fields["keyshot_success"],
            fields["keyshot_failed"],
        )  # the reward's per-sample fields
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
