"""Live MiniWoB pages as an OpenEnv environment on OpenEnv's own server (``create_app``), in OpenEnv's
BrowserGym wire format, scored by an OpenEnv rubric (keyshot's: ``keyshot.reward.openenv.KeyshotRubric``).

- action ``{"action_str": "click('13')"}`` (a BrowserGym action);
- observation ``text, url, screenshot, goal, axtree_txt, pruned_html, error, last_action_error, done,
  reward, metadata`` (:mod:`keyshot.env.openenv.wire`); ``reward`` is the rubric's: None until the
  episode ends, then keyshot's reward (None when no verdict could be had: ``metadata.keyshot_error`` says
  why); ``metadata.miniwob_reward`` is MiniWoB's own (1.0 once the task is done right), beside it;
- ``reset(seed=None, episode_id=None, task_name=None)``: a new episode of ``task_name`` (default: the
  server's task) at ``seed`` (default: a fresh one); the rubric sees its first page as ``(None, page)``;
- an episode ends when MiniWoB ends it or after ``max_steps`` actions, on the server: a client that stops
  earlier (TRL's BrowserGym example counts its own steps) never ends the episode, so give the server its
  number (``--max-steps``).

Each session (one WebSocket of OpenEnv's client) has its own environment and rubric, and a browser of
the server's :class:`~keyshot.env.miniwob.pool.BrowserPool` from its first reset to its end (then back to
the pool, for the next session: no new Chromium); the sessions' rubrics share the process's reward
model. Closing the pool closes every browser, in use or not (the command does when the server stops,
SIGTERM included).
"""

from __future__ import annotations

import functools
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.rubrics import Rubric
from pydantic import Field

from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.setup import MiniWoBError
from keyshot.env.openenv.wire import wire_fields
from keyshot.env.page import Page

ENV_NAME = "keyshot_miniwob"


class BrowserGymAction(Action):
    """One BrowserGym action, as OpenEnv's BrowserGym environment takes it."""

    action_str: str = Field(..., description="a BrowserGym action, e.g. click('13') or fill('15', 'text')")


class BrowserGymObservation(Observation):
    """One page, in OpenEnv's BrowserGym wire format."""

    text: str = Field(default="", description="the page's accessibility tree (as axtree_txt)")
    url: str = Field(default="", description="the task page's URL")
    screenshot: list[list[list[int]]] | None = Field(
        default=None, description="the page's screenshot: height x width x 3 integers 0-255"
    )
    goal: str = Field(default="", description="the task the agent is given")
    axtree_txt: str = Field(default="", description="the accessibility tree with BrowserGym ids")
    pruned_html: str = Field(default="", description="not read by keyshot's browser: always empty")
    error: str = Field(default="", description="the last action's error, or why the browser failed")
    last_action_error: bool = Field(default=False, description="whether error is set")


class MiniWoBState(State):
    """The session's episode."""

    benchmark: str = "miniwob"
    task_name: str = ""
    task_id: str | None = None
    seed: int | None = None
    goal: str = ""
    current_url: str = ""
    max_steps: int | None = None
    cum_reward: float = Field(default=0.0, description="MiniWoB's own reward so far")


@dataclass(frozen=True)
class EnvSettings:
    """What every session's environment is made of: the default MiniWoB ``task``, the ``pool`` its
    browsers come from (their ``max_steps`` ends an episode) and the ``rubric`` factory (one a session)."""

    task: str
    pool: BrowserPool
    rubric: Callable[[], Rubric] | None = None

    @property
    def max_steps(self) -> int:
        return self.pool.max_steps


class MiniWoBEnvironment(Environment[BrowserGymAction, BrowserGymObservation, MiniWoBState]):
    """One session's live MiniWoB page (a browser of the pool from its first reset to the session's end)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, settings: EnvSettings):
        super().__init__(rubric=settings.rubric() if settings.rubric is not None else None)
        self.settings = settings
        self.browser: MiniWoBBrowser | None = None
        self._state = MiniWoBState(max_steps=settings.max_steps)
        self._seeds = random.Random()

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        task_name: str | None = None,
        **unknown: Any,
    ) -> BrowserGymObservation:
        if unknown:
            raise ValueError(
                f"reset: unknown parameter(s) {sorted(unknown)}; this environment takes seed, episode_id, task_name"
            )
        self._reset_rubric()
        task = (task_name or self.settings.task).removeprefix("miniwob.")
        seed = self._seeds.randrange(2**31) if seed is None else seed
        if self.browser is None:
            self.browser = self.settings.pool.acquire()
        page = self.browser.reset(seed=seed, task=task)
        self._state = MiniWoBState(
            episode_id=episode_id or str(uuid.uuid4()),
            task_name=task,
            task_id=self.browser.task_id,
            seed=seed,
            goal=self.browser.task,
            current_url=self.browser.url or "",
            max_steps=self.settings.max_steps,
        )
        observation = self._observation(page)
        observation.reward = self._apply_rubric(None, observation)
        return observation

    def step(
        self, action: BrowserGymAction, timeout_s: float | None = None, **unknown: Any
    ) -> BrowserGymObservation:
        """Carry out ``action`` (``timeout_s`` is the browser's own, set by the server)."""
        if unknown:
            raise ValueError(f"step: unknown parameter(s) {sorted(unknown)}")
        if self.browser is None or self.browser.goal is None:
            raise MiniWoBError("step before reset: call reset() first (it opens the task's page)")
        page = self.browser.act(action.action_str)
        self._state.step_count += 1
        self._state.cum_reward = float(self.browser.reward or 0.0)
        observation = self._observation(page)
        observation.reward = self._apply_rubric(action, observation)
        return observation

    def _observation(self, page: Page) -> BrowserGymObservation:
        metadata = {
            "miniwob_reward": page.reward,
            "task_id": self._state.task_id,
            "seed": self._state.seed,
            "step": page.step,
            "max_steps": self.settings.max_steps,
        }
        if page.error:
            metadata["browser_error"] = page.error
        return BrowserGymObservation(
            **wire_fields(page, self._state.goal),
            url=self._state.current_url,
            done=page.done,
            reward=None,
            metadata=metadata,
        )

    @property
    def state(self) -> MiniWoBState:
        return self._state

    def close(self) -> None:
        """Give the browser back to the pool and drop the rubric's unscored episode. Idempotent."""
        if self.rubric is not None:
            self.rubric.reset()
        browser, self.browser = self.browser, None
        if browser is not None:
            self.settings.pool.release(browser)


def build_app(settings: EnvSettings, max_sessions: int):
    """OpenEnv's server app over :class:`MiniWoBEnvironment`: one environment per WebSocket session, at
    most ``max_sessions`` at once."""
    return create_app(
        functools.partial(MiniWoBEnvironment, settings),
        BrowserGymAction,
        BrowserGymObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions,
        state_cls=MiniWoBState,
    )
