"""One Chromium holding many MiniWoB pages, each in a browser context of its own (a *session*), in a
process of its own (started by :class:`keyshot.env.miniwob.client.BrowserProcess` with the set-up's
variables in its environment)::

    python -I env/miniwob/worker.py CHROMIUM PAGE_TIMEOUT_MS DOM_WAIT_MS

(the deadlines of the session settings, :meth:`keyshot.env.miniwob.settings.SessionSettings.worker_arguments`:
playwright's timeout for a call on a page, and the wait for a page's DOM after an action; its first line,
``{"ready": true, "pid": ..., "deadlines": {...}}``, says them back).

Why a process: playwright reads the Python call stack at every call it makes (``inspect.stack()``), which
costs seconds per page in a trainer's process holding thousands of modules (torch, transformers, trl); here
it holds a few hundred. It ends with the process that started it: that process's end closes the worker's
stdin, and the worker then kills its Chromium and exits at once, even in the middle of a request (a
thread reads the requests).

Requests are JSON lines on stdin, answers JSON lines on the stdout it was given (anything the libraries
print goes to stderr). Every request but ``close`` carries an ``id`` its answer repeats, and a
``session`` (any string the client picks):

- ``{"op": "reset", "session": S, "task": "click-button", "seed": N, "viewport": [W, H] | null, "html":
  false}``: a new MiniWoB episode in a fresh browser context (the session's previous one closed); with
  ``html``, every answer of the episode also carries the page's pruned HTML;
- ``{"op": "step", "session": S, "action": "click('12')"}``: a BrowserGym action;
- ``{"op": "end", "session": S}``: the session's context closed (its memory given back);
- ``{"op": "close"}``: everything closed, then the process ends.

An answer holds the goal, URL, the page's text (goal, last action's error, accessibility tree), its
screenshot (PNG, base64), MiniWoB's reward and whether the task is over, or ``{"error": "..."}`` when that
session's page failed (a crashed page fails its own session only, at once: its page is closed when its
renderer ends, so no call waits on it). Answers may come in another order than
the requests: a step waits BrowserGym's 0.5 s for the page's events before its observation, and the worker
serves the other sessions meanwhile. When Chromium itself is gone the worker answers the pending requests
with the reason and exits (code 3): the client then fails that browser's sessions only.

An episode is BrowserGym's, page for page: the task is BrowserGym's MiniWoB task class (its ``setup``
loads the miniwob package's HTML and starts the episode, its ``validate`` reads reward and done from the
task's JavaScript), actions go through BrowserGym's ``HighLevelActionSet`` and ``execute_python_code``, and
the observation through its extractors. What :class:`browsergym.core.env.BrowserEnv` does around them
(its context set-up, the active-page tracking, the waits, the chat messages ``validate`` reads) is written
here per context, because ``BrowserEnv`` launches a Chromium (and a second one for its chat window) per
environment; ``tests/env/test_browsergym_copy.py`` pins this copy to the BrowserGym version keyshot pins (the
source of every copied method is hashed) and plays the same episodes both ways. Not copied: the chat
window's browser (its messages are kept as a list, which is all MiniWoB's ``validate`` reads), video
recording, the element properties (no field keyshot sends; the DOM snapshot is taken for ``html`` only), and the task's ``slow_mo``
(a launch option of the whole browser, which here serves many pages).

Imports nothing of keyshot (it runs by path).
"""

from __future__ import annotations

import base64
import contextlib
import heapq
import io
import itertools
import json
import os
import queue
import re
import signal
import sys
import threading
import time

#: BrowserGym's wait for the page's JavaScript events after an action (BrowserEnv's pre_observation_delay)
PRE_OBSERVATION_DELAY_S = 0.5
#: BrowserEnv's tries at extracting the observation (browsergym.core.constants.EXTRACT_OBS_MAX_TRIES)
RETRYABLE = (
    "Frame was detached",
    "Frame with the given frameId is not found",
    "Execution context was destroyed",
    "Frame has been detached",
    "Cannot mark a child frame without a bid",
    "Cannot read properties of undefined",
)
#: BrowserEnv's script that reports the page the agent is on (playwright has no notion of an active page)
ACTIVE_PAGE_SCRIPT = "\n".join(
    ["window.browsergym_page_activated();"]
    + [
        f'window.addEventListener("{event}", () => {{window.browsergym_page_activated();}}, {{capture: true}});'
        for event in (
            "focus focusin load pageshow mousemove mouseup mousedown wheel keyup keydown input touchstart "
            "touchend"
        ).split()
    ]
    + [
        'document.addEventListener("visibilitychange", () => {',
        '    if (document.visibilityState === "visible") {',
        "        window.browsergym_page_activated();",
        "    }",
        "}, {capture: true});",
    ]
)


class Session:
    """One MiniWoB page in a browser context of its own: BrowserGym's reset, step and observation for it."""

    def __init__(self, worker: Worker, name: str):
        self.worker = worker
        self.name = name
        self.context = None
        self.page = None
        self.task = None
        self.page_history: dict = {}
        self.messages: list[dict] = []  # BrowserGym's chat messages (what validate reads)
        self.goal = ""
        self.last_action_error = ""
        self.infeasible = False
        self.html = False  # send the page's pruned HTML (BrowserGym's prune_html of its DOM) too
        self.crashed = False  # a page of the context crashed (its renderer ended): the episode is over
        self.start_time = time.time()

    # --- BrowserEnv.reset, for one context of the shared browser
    def reset(self, task: str, seed: int, viewport: list[int] | None, html: bool = False) -> dict:
        self.end()
        self.html = html
        entrypoint = self.worker.entrypoint(task)  # an unknown task fails here, before anything is opened
        self.task = entrypoint(seed=seed)
        size = {"width": viewport[0], "height": viewport[1]} if viewport else self.task.viewport
        self.context = self.worker.browser.new_context(
            viewport=size, locale=self.task.locale, timezone_id=self.task.timezone_id
        )
        self.context.set_default_timeout(self.worker.page_timeout_ms)  # BrowserEnv's timeout= override
        self.crashed = False
        self.context.on("page", lambda page: page.on("crash", self._crashed))
        self.page_history = {}
        self.context.expose_binding(
            "browsergym_page_activated", lambda source: self._activated(source["page"])
        )
        self.context.add_init_script(ACTIVE_PAGE_SCRIPT)
        self.messages = []
        self.page = self.context.new_page()
        goal, _ = self.task.setup(page=self.page)
        goal_object = [{"type": "text", "text": goal}] if isinstance(goal, str) else list(goal or [])
        self.goal = "\n".join(m["text"] for m in goal_object if m["type"] == "text")
        self._say(
            "assistant",
            "Hi! I am your UI assistant, I can perform web tasks for you. What can I help you with?",
        )
        for message in goal_object:
            if message["type"] == "text":
                self._say("user", message["text"])
        self._wait_dom_loaded()
        self._active_page_check()
        self.start_time = time.time()
        self.last_action_error, self.infeasible = "", False
        return self._observation(reward=0.0, done=False)

    # --- BrowserEnv.step: the action now, the observation after BrowserGym's wait (other sessions meanwhile)
    def act(self, action: str) -> None:
        from browsergym.core.action.base import execute_python_code

        if self.task is None:
            raise RuntimeError("step before reset")
        self._check_not_crashed()
        try:
            code = self.worker.actions.to_python_code(action)
            execute_python_code(
                code,
                self.page,
                send_message_to_user=self._send_message_to_user,
                report_infeasible_instructions=self._report_infeasible,
            )
            self.last_action_error = ""
        except Exception as exc:
            self.last_action_error = f"{type(exc).__name__}: {exc}"

    def after_action(self) -> dict:
        self._check_not_crashed()
        self.context.cookies()  # BrowserGym's way to run playwright's waiting callbacks
        self._wait_dom_loaded()
        self._active_page_check()
        page, history = self.page, self.page_history.copy()
        reward, done, user_message, _ = self.task.validate(self.page, self.messages)
        self.page, self.page_history = page, history  # as BrowserEnv._task_validate restores them
        if user_message:
            self._say("user", user_message)
        return self._observation(reward=float(reward), done=bool(done or self.infeasible))

    def end(self) -> None:
        """Close the session's context (its pages and their renderer)."""
        task, context, self.task, self.context, self.page = self.task, self.context, None, None, None
        if task is not None:
            with contextlib.suppress(Exception):
                task.teardown()
        if context is not None:
            with contextlib.suppress(Exception):
                context.close()

    def _crashed(self, page) -> None:
        """A page's renderer ended: the page is closed now, so a call waiting on it (BrowserGym's
        ``wait_for_function`` in MiniWoB's setup waits out its timeout on a crashed page, and meanwhile the
        worker's other sessions wait) fails at once."""
        self.crashed = True
        with contextlib.suppress(Exception):
            page.close()

    def _check_not_crashed(self) -> None:
        if self.crashed:
            raise RuntimeError("no page to act on: reset the session")  # _failed says why: the page crashed

    def _say(self, role: str, text: str) -> None:
        self.messages.append({"role": role, "timestamp": time.time(), "message": text})

    def _send_message_to_user(self, text: str) -> None:
        if not isinstance(text, str):
            raise ValueError(f"Forbidden value: {text} is not a string")
        self._say("assistant", text)

    def _report_infeasible(self, reason: str) -> None:
        if not isinstance(reason, str):
            raise ValueError(f"Forbidden value: {reason} is not a string")
        self._say("infeasible", reason)
        self.infeasible = True

    def _activated(self, page) -> None:
        if page.context != self.context:
            raise RuntimeError(
                f"Unexpected: activating a page that belongs to a different browser context ({page})."
            )
        self.page_history.pop(page, None)
        self.page_history[page] = None
        self.page = page

    def _wait_dom_loaded(self) -> None:
        import playwright.sync_api

        for page in self.context.pages:
            with contextlib.suppress(playwright.sync_api.Error):
                page.wait_for_load_state("domcontentloaded", timeout=self.worker.dom_wait_ms)
            for frame in page.frames:
                with contextlib.suppress(playwright.sync_api.Error):
                    frame.wait_for_load_state("domcontentloaded", timeout=self.worker.dom_wait_ms)

    def _active_page_check(self) -> None:
        if len(self.context.pages) == 0:
            self.page = self.context.new_page()
        while self.page_history and (self.page.is_closed() or self.page not in self.context.pages):
            self.page_history.pop(self.page)
            self.page = list(self.page_history.keys())[-1]
        if self.page not in self.context.pages:
            raise RuntimeError(
                f"Unexpected: active page is not part of the browser context's open pages ({self.page})."
            )
        if self.page.is_closed():
            raise RuntimeError(f"Unexpected: active page has been closed ({self.page}).")

    # --- BrowserEnv._get_obs: the fields keyshot sends
    def _observation(self, reward: float, done: bool) -> dict:
        import playwright.sync_api
        from browsergym.core.constants import EXTRACT_OBS_MAX_TRIES
        from browsergym.core.observation import (
            MarkingError,
            _post_extract,
            _pre_extract,
            extract_dom_snapshot,
            extract_merged_axtree,
            extract_screenshot,
        )
        from browsergym.utils.obs import flatten_axtree_to_str, flatten_dom_to_str, prune_html
        from PIL import Image

        for retries_left in reversed(range(EXTRACT_OBS_MAX_TRIES)):
            try:
                _pre_extract(self.page, tags_to_mark="standard_html", lenient=(retries_left == 0))
                axtree = extract_merged_axtree(self.page)
                dom = extract_dom_snapshot(self.page) if self.html else None
            except (playwright.sync_api.Error, MarkingError) as exc:
                if retries_left > 0 and any(known in str(exc) for known in RETRYABLE):
                    _post_extract(self.page)
                    time.sleep(0.5)
                    continue
                raise
            break
        _post_extract(self.page)
        screenshot = extract_screenshot(self.page)
        parts = [f"Goal: {self.goal}"]
        if self.last_action_error:
            parts.append(f"Error: {self.last_action_error}")
        tree = flatten_axtree_to_str(axtree)
        parts.append(f"Page structure:\n{tree[: self.worker.text_chars]}")
        buffer = io.BytesIO()
        Image.fromarray(screenshot).save(buffer, format="PNG", compress_level=1)
        observation = {
            "goal": self.goal,
            "url": self.page.url,
            "text": "\n\n".join(parts),
            "axtree": tree,
            "last_action_error": self.last_action_error,
            "png": base64.b64encode(buffer.getvalue()).decode("ascii"),
            "reward": reward,
            "done": done,
        }
        if dom is not None:  # as OpenEnv's BrowserGym server makes its pruned_html
            observation["html"] = prune_html(flatten_dom_to_str(dom))
        return observation


class Worker:
    """The Chromium (launched as BrowserEnv launches it) and its sessions, served from one thread (playwright's
    sync API), with BrowserGym's waits after actions scheduled rather than slept."""

    def __init__(self, chromium: str, page_timeout_ms: int, dom_wait_ms: int, text_chars: int = 4000):
        import browsergym.miniwob  # noqa: F401  (registers the browsergym/miniwob.* environments)
        from browsergym.core import _get_global_playwright
        from browsergym.core.action.highlevel import HighLevelActionSet
        from browsergym.core.constants import BROWSERGYM_ID_ATTRIBUTE

        self.page_timeout_ms = page_timeout_ms
        self.dom_wait_ms = dom_wait_ms
        self.text_chars = text_chars
        self.actions = HighLevelActionSet()  # BrowserEnv's default action_mapping
        self.entrypoints: dict[str, object] = {}
        playwright = _get_global_playwright()  # BrowserGym's own playwright instance
        playwright.selectors.set_test_id_attribute(BROWSERGYM_ID_ATTRIBUTE)
        self.browser = playwright.chromium.launch(
            headless=True,
            args=["--disable-features=OverlayScrollbars,ExtendedOverlayScrollbars"],
            ignore_default_args=["--hide-scrollbars"],
            executable_path=chromium,
        )
        self.pid = _browser_pid(self.browser)
        self.sessions: dict[str, Session] = {}
        self._due: list = []  # (time, order, callback): steps waiting for BrowserGym's delay
        self._order = itertools.count()

    def entrypoint(self, task: str):
        """BrowserGym's task class of ``browsergym/miniwob.TASK`` (as gym.make builds it; nothing launched)."""
        if task not in self.entrypoints:
            import gymnasium as gym

            env = gym.make(f"browsergym/miniwob.{task}", disable_env_checker=True)
            self.entrypoints[task] = env.unwrapped.task_entrypoint
            env.close()  # nothing was launched: closes nothing
        return self.entrypoints[task]

    def session(self, name: str) -> Session:
        if name not in self.sessions:
            self.sessions[name] = Session(self, name)
        return self.sessions[name]

    def handle(self, request: dict, answer) -> None:
        """Serve one request; a step's answer comes after BrowserGym's delay (:meth:`run_due`)."""
        op, rid, name = request["op"], request.get("id"), request.get("session", "")
        try:
            if op == "reset":
                answer(
                    {
                        "id": rid,
                        **self.session(name).reset(
                            request["task"],
                            request["seed"],
                            request.get("viewport"),
                            request.get("html", False),
                        ),
                    }
                )
            elif op == "step":
                session = self.session(name)
                session.act(request["action"])
                due = time.monotonic() + PRE_OBSERVATION_DELAY_S
                heapq.heappush(self._due, (due, next(self._order), rid, session))
            elif op == "end":
                session = self.sessions.pop(name, None)
                if session is not None:
                    session.end()
                answer({"id": rid, "ended": True})
            else:
                answer({"id": rid, "error": f"unknown op {op!r}"})
        except Exception as exc:  # that session's page failed (or Chromium died: ``dead``): said, not raised
            answer(self._failed(rid, self.sessions.get(name), exc))

    def next_due_s(self) -> float | None:
        return max(0.0, self._due[0][0] - time.monotonic()) if self._due else None

    def run_due(self, answer) -> None:
        while self._due and self._due[0][0] <= time.monotonic():
            _, _, rid, session = heapq.heappop(self._due)
            try:
                answer({"id": rid, **session.after_action()})
            except Exception as exc:
                answer(self._failed(rid, session, exc))

    def _failed(self, rid, session: Session | None, exc: Exception) -> dict:
        """The answer to a request whose page failed: why (a crashed page says so), and whether Chromium
        itself is gone."""
        error = _first_line(exc)
        if session is not None and session.crashed:
            error = f"the page crashed (its renderer ended): {error}"
        return {"id": rid, "error": error, "dead": not self.connected}

    @property
    def connected(self) -> bool:
        return self.browser.is_connected()

    def kill(self) -> None:
        """Kill Chromium's main process (its helpers end with it)."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        for session in self.sessions.values():
            session.end()
        with contextlib.suppress(Exception):
            self.browser.close()
        self.kill()


def _browser_pid(browser) -> int | None:
    """The main process of a playwright Browser (Chrome DevTools' SystemInfo.getProcessInfo)."""
    try:
        session = browser.new_browser_cdp_session()
        info = session.send("SystemInfo.getProcessInfo")["processInfo"]
        session.detach()
    except Exception:  # an unreachable browser has no pid to report
        return None
    return next((p["id"] for p in info if p["type"] == "browser"), None)


def _read_requests(requests: queue.Queue, worker_pid: list) -> None:
    """Hand stdin's lines to the main thread; at its end (the process that started this one is gone, or
    closed it) end at once, even in the middle of a request: Chromium killed, then this process."""
    for line in sys.stdin:
        requests.put(line)
    for pid in worker_pid:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    os._exit(0)


def _first_line(exc: Exception) -> str:
    text = re.sub(r"\s+", " ", str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    return f"{type(exc).__name__}: {text}"


def main(argv: list[str]) -> int:
    chromium, page_timeout_ms, dom_wait_ms = argv[0], int(argv[1]), int(argv[2])
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # what the libraries print stays out of the answers
    lock = threading.Lock()

    def answer(message: dict) -> None:
        with lock:
            answers.write(json.dumps(message) + "\n")

    chromium_pid: list[int] = []  # filled once launched, for the reader thread's kill
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=_read_requests, args=(requests, chromium_pid), daemon=True).start()
    try:
        worker = Worker(chromium, page_timeout_ms, dom_wait_ms)
    except Exception as exc:
        answer({"error": _first_line(exc)})
        return 1
    chromium_pid.extend([worker.pid] if worker.pid else [])
    deadlines = {"page_timeout_ms": worker.page_timeout_ms, "dom_wait_ms": worker.dom_wait_ms}
    answer({"ready": True, "pid": worker.pid, "deadlines": deadlines})
    while True:
        try:
            line = requests.get(timeout=worker.next_due_s())
        except queue.Empty:
            line = None
        if line is not None:
            request = json.loads(line)
            if request["op"] == "close":
                break
            worker.handle(request, answer)
        worker.run_due(answer)
        if not worker.connected:  # Chromium is gone: every session of it fails, the client starts another
            answer({"gone": "the browser (Chromium) died"})
            worker.kill()
            return 3
    worker.close()
    answer({"closed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
