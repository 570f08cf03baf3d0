"""keyshot's reward inside an OpenEnv environment: :class:`KeyshotRubric`, an OpenEnv ``TrajectoryRubric``.

In OpenEnv the reward lives in the environment, as a rubric its ``step()`` applies to each ``(action,
observation)`` pair. KeyshotRubric records the pairs of an episode as keyshot's :class:`Episode` (each
page's screenshot with the action taken on it) and, on the pair whose observation is ``done``, scores it
with keyshot's reward through the process-wide batched model of its config
(:func:`keyshot.reward.shared.score_shared_sync`): the sessions of one server that end together are judged
as one batch and share one key-point call per task. Its return value is the reward: None until the
episode ends (``intermediate_reward``), then keyshot's reward, or None when no verdict could be had. The
final observation's ``metadata`` gets the result (:func:`result_metadata`): ``keyshot_reward``,
``keyshot_error`` (why there is no verdict; None with one), the key points, the scorer's step scores and
the per-sample log fields of :func:`keyshot.reward.logs.sample_logs` (``keyshot_failed``, ...). A failed
call is never a silent 0: the reward is None with the reason there, or, with ``reward.on_failure: zero``,
0.0 with ``keyshot_failed`` 1.0.

The pairs are BrowserGym-style observations (OpenEnv's BrowserGym wire format; a pydantic observation or
its dict): ``goal`` (the task judged), ``url``, ``screenshot`` (a nested H×W×C list of 0-255 integers as
OpenEnv sends it, PNG/JPEG bytes, base64 or a PIL image), ``metadata.task_id`` (optional); the action is
BrowserGym's action string (``action_str`` of the action, or the string itself). An environment passes
its reset observation as ``(None, observation)``, so the page the episode starts on is judged too
(``keyshot.frameworks.openenv`` does); each later pair is an action with the page it led to, the order
:meth:`Episode.add_step` records. A step without a screenshot (a browser that
failed) leaves the episode without a verdict, saying so.

The task's key points depend only on the task: they are asked when an episode's first pair arrives (its
reset), in the background, so the end of an episode waits only for the scorer and the outcome call (the
episode's own key-point call is then answered from the call cache). An environment that must answer its
client by a deadline (OpenEnv's client waits 60 s for each answer) gives the rubric ``answer_by``: a
verdict not ready by then leaves the episode without a reward (``keyshot_error``: ``deadline: no
verdict within ...``), counted in :data:`DEADLINES`, and its judging goes on to the end, so its calls land
in the call cache and none is paid twice.

Screenshots are written to disk as they arrive (nothing decoded stays in memory); the pairs kept in
``trajectory`` leave the screenshot out. Runs where OpenEnv is installed (``make setup-openenv``)::

    from keyshot.frameworks.openenv.rubric import KeyshotRubric
    env = MyBrowserEnvironment(rubric=KeyshotRubric("configs/reward/trl.yaml"))
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from openenv.core.rubrics import TrajectoryRubric
from PIL import Image

from keyshot.infer.judge.calls import ask_key_points
from keyshot.infer.protocol.decode import ImageError, decoded, read_header
from keyshot.reward import shared
from keyshot.reward.episode import Episode
from keyshot.reward.logs import sample_logs
from keyshot.reward.model import RewardResult
from keyshot.reward.rollouts import RolloutError

__all__ = [
    "DEADLINES",
    "DeadlineCounts",
    "KeyshotRubric",
    "action_string",
    "image_of_pixels",
    "result_metadata",
    "screenshot_of",
]

logger = logging.getLogger(__name__)

_CHANNELS = (1, 3, 4)  # gray, RGB, RGBA


class DeadlineCounts:
    """Episodes of this process whose verdict was not ready by their environment's deadline (``late``) and,
    of them, those whose judging has since ended (``finished``: its calls are in the call cache)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.late = 0
        self.finished = 0

    def add_late(self) -> int:
        with self._lock:
            self.late += 1
            return self.late

    def add_finished(self) -> None:
        with self._lock:
            self.finished += 1


#: This process's count of verdicts past their deadline.
DEADLINES = DeadlineCounts()


def _field(observation: Any, name: str, default: Any = None) -> Any:
    if isinstance(observation, dict):
        return observation.get(name, default)
    return getattr(observation, name, default)


def action_string(action: Any) -> str | None:
    """BrowserGym's action string of an OpenEnv action (``action_str``), a dict of one, or a string."""
    if action is None or isinstance(action, str):
        return action
    text = _field(action, "action_str")
    return None if text is None else str(text)


def image_of_pixels(pixels: Any) -> Image.Image:
    """An H×W×C array (or nested list) of 0-255 integers, C = 1, 3 or 4 (H×W: gray), as an RGB image under
    keyshot's image policy (:func:`~keyshot.infer.protocol.decode.decoded`: its size limit, alpha on
    white). Raises RolloutError saying what is wrong with the array, ImageTooLarge for one beyond any
    screenshot."""
    try:
        array = np.asarray(pixels)
    except ValueError:
        raise RolloutError("screenshot: not an H×W×C array of pixels (its rows differ in length)") from None
    if array.ndim == 2:
        array = array[..., None]
    if array.ndim != 3 or array.shape[2] not in _CHANNELS or not array.shape[0] or not array.shape[1]:
        raise RolloutError(f"screenshot: an array of shape {array.shape} is not H×W×C pixels (C = 1, 3 or 4)")
    if array.dtype.kind not in "iu":
        raise RolloutError(f"screenshot: pixels must be integers 0-255 (got {array.dtype} values)")
    if array.min() < 0 or array.max() > 255:
        raise RolloutError(f"screenshot: pixels must be 0-255 (got {array.min()} to {array.max()})")
    data = array.astype(np.uint8)
    # the protocol's one guard (its size limit and pixel budget; alpha on white), as for any screenshot
    header = read_header(Image.fromarray(data[..., 0] if data.shape[2] == 1 else data))
    with decoded(header, header.size, header.size) as rgb:
        return Image.fromarray(rgb)


def screenshot_of(value: Any) -> Image.Image | bytes | str:
    """A screenshot as OpenEnv sends it, in a form :meth:`Episode.add_step` records: encoded bytes, base64
    text and PIL images as they are (Episode checks them; the scorer decodes them under the image policy),
    pixel arrays as an image (:func:`image_of_pixels`)."""
    if isinstance(value, Image.Image):
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value
    return image_of_pixels(value)


def result_metadata(result: RewardResult) -> dict[str, Any]:
    """What an observation's metadata says of keyshot's reward: the reward (None: no verdict), why there
    is none, the key points, the scorer's step scores, the per-sample log fields and, with
    ``pipeline.step_rewards``, the rewards per step (one per screenshot: the first page's, then each
    action's), the progress at each step and the screenshot each key point was first met at (else None)."""
    logs = {key: values[0] for key, values in sample_logs([result]).items()}
    return {
        "keyshot_reward": result.reward,
        "keyshot_error": result.error,
        "keyshot_key_points": result.key_points,
        "keyshot_step_scores": result.step_scores,
        "keyshot_step_rewards": result.step_rewards,
        "keyshot_step_progress": result.step_progress,
        "keyshot_key_point_steps": result.key_point_steps,
        **logs,
    }


class _Recorder:
    """The pairs of one episode written into an :class:`Episode` as they arrive, in the order an
    environment shows them: each pair's action (none for the reset's) with the page it led to."""

    def __init__(self, keep_dir: str | os.PathLike | None):
        self.keep_dir = keep_dir
        self.episode: Episode | None = None
        self.steps = 0

    def add(self, action: Any, observation: Any) -> None:
        step, self.steps = self.steps, self.steps + 1
        if self.episode is None:
            metadata = _field(observation, "metadata") or {}
            self.episode = Episode(
                str(_field(observation, "goal") or ""),
                start_url=_field(observation, "url") or None,
                task_id=metadata.get("task_id"),
                keep_dir=self.keep_dir,
            )
        screenshot = _field(observation, "screenshot")
        image = None
        if screenshot is None:
            error = _field(observation, "error")
            self.episode.fail(f"step {step} has no screenshot" + (f" ({error})" if error else ""))
        else:
            try:
                image = screenshot_of(screenshot)
            except (RolloutError, ImageError) as exc:
                self.episode.fail(f"step {step}: {exc}")
        # an action whose page could not be shown is recorded all the same: the judge reads every action
        self.episode.add_step(image, action=action_string(action))

    def finish(self) -> Episode:
        if self.episode is None:
            self.episode = Episode("", keep_dir=self.keep_dir)
        self.episode.finish(None)
        return self.episode

    def discard(self) -> None:
        if self.episode is not None and not self.episode.finished:
            self.episode.discard()


def _without_pixels(observation: Any) -> Any:
    """The observation as the trajectory keeps it: its screenshot is on disk, in the episode."""
    if isinstance(observation, dict):
        return {**observation, "screenshot": None}
    if hasattr(observation, "model_copy") and _field(observation, "screenshot") is not None:
        return observation.model_copy(update={"screenshot": None})
    return observation


class KeyshotRubric(TrajectoryRubric):
    """keyshot's reward as an OpenEnv rubric (see the module's docstring).

    Args:
        config: a ``keyshot judge`` config (default ``$KEYSHOT_REWARD_CONFIG``); its model is built now,
            once per process and config, so a config that cannot be used fails here.
        keep_dir: keep each scored episode there (a folder ``keyshot judge`` reads).
        intermediate_reward: the reward of a step before the episode ends (None: not known yet).
        answer_by: the environment's deadline: a callable giving the ``time.monotonic()`` by which the
            step being answered must be sent (None from it, or no callable: wait for the verdict).
    """

    def __init__(
        self,
        config: str | os.PathLike | None = None,
        *,
        keep_dir: str | os.PathLike | None = None,
        intermediate_reward: float | None = None,
        answer_by: Callable[[], float | None] | None = None,
    ):
        super().__init__(intermediate_reward=intermediate_reward)
        self.config = shared.config_path(config)
        shared.shared_model(self.config)
        self.keep_dir = keep_dir
        self.answer_by = answer_by
        self.result: RewardResult | None = None
        self._recorder = _Recorder(keep_dir)

    def forward(self, action: Any, observation: Any) -> float | None:
        """Record the pair (the first of an episode asks its task's key points); score the episode when
        ``observation`` is done."""
        first = self._recorder.episode is None
        self._recorder.add(action, observation)
        self._trajectory.append((action, _without_pixels(observation)))
        if first:
            self._ask_key_points(self._recorder.episode.task)
        if not _field(observation, "done", False):
            return self.intermediate_reward
        return self._score(self._recorder, observation)

    def _ask_key_points(self, task: str) -> None:
        """Ask ``task``'s key points now, in the background, exactly as the verdict will ask them: the
        episode's own call is then answered from the call cache (or joins this one in flight)."""
        if not task:
            return
        model = shared.shared_model(self.config)

        async def ask() -> None:
            webjudge = model.pipeline()
            await ask_key_points(
                webjudge.judge_client,
                webjudge.protocol,
                task,
                max_tokens=webjudge.config.key_points_max_tokens,
            )

        def done(future: concurrent.futures.Future) -> None:
            if not future.cancelled() and future.exception() is not None:  # the verdict's own call says it
                logger.debug("key points of %r asked at reset: %s", task, future.exception())

        model.loop.submit(ask()).add_done_callback(done)

    def score_trajectory(self, trajectory: Sequence[tuple[Any, Any]]) -> float | None:
        """keyshot's reward of a whole trajectory given at once (pairs with their screenshots); the final
        observation's metadata gets the result."""
        recorder = _Recorder(self.keep_dir)
        for action, observation in trajectory:
            recorder.add(action, observation)
        return self._score(recorder, trajectory[-1][1] if trajectory else None)

    def _score(self, recorder: _Recorder, final: Any) -> float | None:
        episode = recorder.finish()
        batcher = shared.shared_batcher(self.config)
        verdict = batcher.model.loop.submit(batcher.score(episode))
        at = self.answer_by() if self.answer_by is not None else None
        wait_s = None if at is None else max(0.0, at - time.monotonic())
        try:
            result = verdict.result(wait_s)
        except concurrent.futures.TimeoutError:
            result = self._late(batcher.model, episode, verdict, wait_s)
        self.result = result
        if isinstance(final, dict):
            final.setdefault("metadata", {}).update(result_metadata(result))
        elif final is not None:
            final.metadata.update(result_metadata(result))
        return result.reward

    def _late(
        self, model, episode: Episode, verdict: concurrent.futures.Future, wait_s: float
    ) -> RewardResult:
        """The result of an episode whose verdict was not ready in ``wait_s``: no reward, the reason said and
        counted; the judging goes on (its calls land in the call cache), and its end is logged."""
        DEADLINES.add_late()
        started = time.monotonic()
        rid = episode.id
        problem = (
            f"no verdict within {wait_s:.1f} s, the time left before the environment's deadline (its "
            "judging goes on into the call cache, so nothing is paid twice)"
        )

        def finished(future: concurrent.futures.Future) -> None:
            DEADLINES.add_finished()
            if not future.cancelled() and future.exception() is None:
                late_result = future.result()
                logger.warning(
                    "reward %s: the verdict past the deadline came %.1f s later (reward %s%s; %d of %d past "
                    "the deadline in this process finished)",
                    rid,
                    time.monotonic() - started,
                    late_result.reward,
                    f", {late_result.error}" if late_result.error else "",
                    DEADLINES.finished,
                    DEADLINES.late,
                )

        verdict.add_done_callback(finished)
        return model.settle(RewardResult.failure(rid, "deadline", problem, task_id=episode.task_id))

    def compute_step_rewards(self) -> list[float | None]:
        """Once the episode is scored with ``pipeline.step_rewards``: each step's own reward (r_t = P_t -
        P_(t-1), the reset's page first; they sum to the episode's progress, docs/reward.md "Rewards per
        step"). Without them, the episode's reward for every step (the verdict is about the whole episode);
        before the end, the intermediate reward."""
        steps = len(self._trajectory)
        if self.result is not None and self.result.step_rewards is not None:
            if len(self.result.step_rewards) == steps:
                return list(self.result.step_rewards)
            logger.warning(
                "reward %s: %d step rewards for %d steps (a step without a screenshot); the episode's reward "
                "stands for every step",
                self.result.id,
                len(self.result.step_rewards),
                steps,
            )
        value = self.result.reward if self.result is not None else self.intermediate_reward
        return [value] * steps

    def reset(self) -> None:
        """A new episode: an unscored one's files are removed."""
        self._recorder.discard()
        self._recorder = _Recorder(self.keep_dir)
        self.result = None
        super().reset()
