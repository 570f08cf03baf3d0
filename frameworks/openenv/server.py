"""Live MiniWoB pages as an OpenEnv environment on OpenEnv's own server (``create_app``), in OpenEnv's
BrowserGym wire format, scored by an OpenEnv rubric (keyshot's: ``keyshot.frameworks.openenv.rubric.KeyshotRubric``).

The action, observation and state are OpenEnv's own BrowserGym models (``browsergym_env.models``, the
package TRL's OpenEnv example imports), not copies:

- action ``{"action_str": "click('13')"}`` (a BrowserGym action);
- observation ``text, url, screenshot, goal, axtree_txt, pruned_html, error, last_action_error, done,
  reward, metadata`` (:mod:`keyshot.frameworks.openenv.wire`), filled as OpenEnv's BrowserGym server fills them;
  ``reward`` is the rubric's: None until the episode ends, then keyshot's reward (None when no verdict
  could be had: ``metadata.keyshot_error`` says why); ``metadata.miniwob_reward`` is MiniWoB's own (1.0
  once the task is done right), beside it;
- ``reset(seed=None, episode_id=None, task_name=None)``: a new episode of ``task_name`` (default: the
  server's task) at ``seed`` (default: a fresh one); the rubric sees its first page as ``(None, page)``;
- an episode ends when MiniWoB ends it or after ``max_steps`` actions, on the server: a client that stops
  earlier (TRL's BrowserGym example counts its own steps) never ends the episode, so give the server its
  number (``--max-steps``);
- every step answers within the session settings' ``answer_within_s`` of its request (OpenEnv's client
  gives up after 60 s): the rubric is told the deadline (``answer_by``), and a verdict not ready by then
  leaves that episode without a reward, saying why.

Each session (one WebSocket of OpenEnv's client) has its own environment and rubric, and a page of the
server's :class:`~keyshot.env.miniwob.pool.BrowserPool` (a browser context in one of its shared Chromium
processes) leased at its first reset and given back at its end; the sessions' rubrics share the
process's reward model. Closing the pool closes every Chromium, in use or not (the command does when the
server stops, SIGTERM included).
"""

from __future__ import annotations

import functools
import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from browsergym_env.models import BrowserGymAction, BrowserGymObservation, BrowserGymState
from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.rubrics import Rubric
from pydantic import SerializerFunctionWrapHandler, field_serializer

from keyshot.env.miniwob.client import MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.settings import SessionSettings
from keyshot.env.miniwob.setup import MiniWoBError
from keyshot.env.page import Page
from keyshot.frameworks.openenv.wire import Pixels, split_text, wire_fields

ENV_NAME = "keyshot_miniwob"


class EpisodeCounts:
    """The server's episodes so far: ended, of them ended with a reward, and without one (no verdict)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ended = self.rewarded = 0

    def add(self, reward: float | None) -> None:
        with self._lock:
            self.ended += 1
            self.rewarded += reward is not None

    def __str__(self) -> str:
        return f"{self.ended} episode(s) ended, {self.rewarded} with a reward, {self.ended - self.rewarded} without"


@dataclass(frozen=True)
class EnvSettings:
    """What every session's environment is made of: the ``pool`` its browsers come from (its
    :class:`~keyshot.env.miniwob.settings.SessionSettings` say the default task, the steps that end an
    episode and the seconds within which a step answers), the ``rubric`` factory (one a session, called
    with ``answer_by``), and the server's counts."""

    pool: BrowserPool
    rubric: Callable[..., Rubric] | None = None
    counts: EpisodeCounts = field(default_factory=EpisodeCounts)

    @property
    def session(self) -> SessionSettings:
        return self.pool.settings


class PixelObservation(BrowserGymObservation):
    """OpenEnv's BrowserGym observation whose ``screenshot`` may be held as :class:`Pixels` (its array),
    written as the same nested lists on the wire: OpenEnv's server keeps every session's last
    observation, which as nested lists is 77 MiB at 1280x720 (:mod:`keyshot.frameworks.openenv.wire`)."""

    @field_serializer("screenshot", mode="wrap")
    def _screenshot(self, value: Any, handler: SerializerFunctionWrapHandler) -> Any:
        return value if isinstance(value, Pixels) else handler(value)


class MiniWoBEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """One session's live MiniWoB page (a browser of the pool from its first reset to the session's end)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, settings: EnvSettings):
        rubric = settings.rubric(answer_by=self.answer_by) if settings.rubric is not None else None
        super().__init__(rubric=rubric)
        self.settings = settings
        self.browser: MiniWoBBrowser | None = None
        self._state = BrowserGymState(benchmark="miniwob", max_steps=settings.session.max_steps)
        self._seeds = random.Random()
        self._seed: int | None = None
        self._answer_by: float | None = None

    def answer_by(self) -> float | None:
        """The ``time.monotonic()`` by which the request being served must be answered (None between
        requests)."""
        return self._answer_by

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
        self._answer_by = time.monotonic() + self.settings.session.answer_within_s
        try:
            self._reset_rubric()
            task = (task_name or self.settings.session.task).removeprefix("miniwob.")
            seed = self._seeds.randrange(2**31) if seed is None else seed
            if self.browser is None:
                self.browser = self.settings.pool.lease(task)
            page = self.browser.reset(seed=seed, task=task)
            self._state = BrowserGymState(
                episode_id=episode_id or str(uuid.uuid4()),
                benchmark="miniwob",
                task_name=task,
                task_id=self.browser.task_id,
                goal=self.browser.task,
                current_url=self.browser.url or "",
                max_steps=self.settings.session.max_steps,
            )
            self._seed = seed
            observation = self._observation(page)
            observation.reward = self._apply_rubric(None, observation)
            return observation
        finally:
            self._answer_by = None

    def step(
        self, action: BrowserGymAction, timeout_s: float | None = None, **unknown: Any
    ) -> BrowserGymObservation:
        """Carry out ``action`` (``timeout_s`` is the browser's own, set by the server)."""
        if unknown:
            raise ValueError(f"step: unknown parameter(s) {sorted(unknown)}")
        if self.browser is None or self.browser.goal is None:
            raise MiniWoBError("step before reset: call reset() first (it opens the task's page)")
        self._answer_by = time.monotonic() + self.settings.session.answer_within_s
        try:
            page = self.browser.act(action.action_str)
            self._state.step_count += 1
            self._state.cum_reward = float(self.browser.reward or 0.0)
            observation = self._observation(page)
            observation.reward = self._apply_rubric(action, observation)
        finally:
            self._answer_by = None
        if observation.done:
            self.settings.counts.add(observation.reward)
        return observation

    def _observation(self, page: Page) -> BrowserGymObservation:
        metadata = {
            "miniwob_reward": page.reward,
            "task_id": self._state.task_id,
            "seed": self._seed,
            "step": page.step,
            "max_steps": self.settings.session.max_steps,
        }
        if page.error:
            metadata["browser_error"] = page.error
        action_error = split_text(page.text)[0]
        if action_error:  # OpenEnv's server leaves ``error`` empty for an action's own error; said here
            metadata["action_error"] = action_error
        # built from fields of known types, not validated again (OpenEnv's client validates what it reads)
        return PixelObservation.model_construct(
            **wire_fields(page, self._state.goal),
            url=self._state.current_url,
            done=page.done,
            reward=None,
            metadata=metadata,
        )

    @property
    def state(self) -> BrowserGymState:
        return self._state

    def close(self) -> None:
        """Give the session's page back to the pool and drop the rubric's unscored episode. Idempotent."""
        if self.rubric is not None:
            self.rubric.reset()
        browser, self.browser = self.browser, None
        if browser is not None:
            browser.close()


def build_app(settings: EnvSettings, max_sessions: int):
    """OpenEnv's server app over :class:`MiniWoBEnvironment`: one environment per WebSocket session, at
    most ``max_sessions`` at once."""
    return create_app(
        functools.partial(MiniWoBEnvironment, settings),
        BrowserGymAction,
        BrowserGymObservation,
        env_name=ENV_NAME,
        max_concurrent_envs=max_sessions,
        state_cls=BrowserGymState,
    )
