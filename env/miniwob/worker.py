"""One MiniWoB browser in a process of its own (started by :class:`keyshot.env.miniwob.client.MiniWoBBrowser`
with the set-up's variables in its environment):

    python -I env/miniwob/worker.py TASK CHROMIUM MAX_TEXT_CHARS PAGE_TIMEOUT_MS

Why a process: playwright reads the Python call stack at every call it makes (``inspect.stack()``), which
costs seconds per page in a trainer's process holding thousands of modules (torch, transformers, trl); here
it holds a few hundred. It also lets browsers run side by side. It ends with the process that started
it: that process's end closes the worker's stdin, and the worker then kills its browsers and exits at once,
even in the middle of a request (a thread reads the requests).

Requests are JSON lines on stdin, answers JSON lines on the stdout it was given (anything the libraries
print goes to stderr): ``{"op": "reset", "seed": N, "task": "click-button"}`` (``task`` optional: the
last one), ``{"op": "step", "action": "click('12')"}``, ``{"op": "close"}``. An answer holds the goal, URL,
the page's text (goal, last action's error, accessibility tree), its screenshot (PNG, base64), MiniWoB's
reward and whether the task is over, or ``{"error": "..."}`` when the browser failed. A reset's answer
also holds the browsers' process ids and whether they were launched for it (``relaunched``).

The first reset launches BrowserGym's browsers (the page's and its chat window's Chromium); every later
one starts a new MiniWoB episode in the same page (the task's page loaded again with the new seed, as
BrowserGym's own reset sets a task up), so a browser serves episode after episode without a launch. A
browser found dead (a crashed or killed Chromium) is closed, its processes killed, and launched again.
A page may take PAGE_TIMEOUT_MS to load (MiniWoB's own 5 s fails launches on a busy machine: a goto
timed out there with 8 browsers on 2 loaded cores); BrowserGym's actions keep their own 0.5 s.
Imports nothing of keyshot (it runs by path).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import signal
import sys
import threading
import time


def _browser_pid(browser) -> int | None:
    """The main process of a playwright Browser (Chrome DevTools' SystemInfo.getProcessInfo)."""
    try:
        session = browser.new_browser_cdp_session()
        info = session.send("SystemInfo.getProcessInfo")["processInfo"]
        session.detach()
    except Exception:  # an unreachable browser has no pid to report
        return None
    return next((p["id"] for p in info if p["type"] == "browser"), None)


class Worker:
    def __init__(self, task: str, chromium: str, text_chars: int, page_timeout_ms: int):
        import browsergym.miniwob  # noqa: F401  (registers the browsergym/miniwob.* environments)

        self.chromium = chromium
        self.text_chars = text_chars
        self.page_timeout_ms = page_timeout_ms
        self.task = task
        self.entrypoints: dict[str, object] = {}
        self.env = self._make(task)
        self.pids: list[int] = []

    def _make(self, task: str):
        """BrowserGym's environment of ``task`` (nothing launched until its reset)."""
        import gymnasium as gym

        env = gym.make(
            f"browsergym/miniwob.{task}",
            disable_env_checker=True,
            timeout=self.page_timeout_ms,
            pw_chromium_kwargs={"executable_path": self.chromium},
        )
        self.entrypoints[task] = env.unwrapped.task_entrypoint
        return env

    def _entrypoint(self, task: str):
        if task not in self.entrypoints:
            self._make(task).close()  # nothing was launched: closes nothing
        return self.entrypoints[task]

    def reset(self, seed: int, task: str | None) -> dict:
        task = task or self.task
        entrypoint = self._entrypoint(task)  # an unknown task fails here, before anything is touched
        core = self.env.unwrapped
        relaunched = core.task is None
        if not relaunched:
            try:
                obs = self._new_episode(core, entrypoint, seed)
            except Exception:  # the browser died since the last episode: launch it again
                self._discard()
                relaunched = True
                self.env = self._make(task)
        elif task != self.task:  # nothing launched yet: the environment of the task asked for
            self.env = self._make(task)
        if relaunched:
            obs, _ = self.env.reset(seed=seed)
            core = self.env.unwrapped
            self.pids = [p for p in (_browser_pid(core.browser), _browser_pid(core.chat.browser)) if p]
        self.task = task
        return {**self._page(obs, reward=0.0, done=False), "pids": self.pids, "relaunched": relaunched}

    @staticmethod
    def _new_episode(core, entrypoint, seed: int) -> dict:
        """A new MiniWoB episode in the page BrowserGym opened (what its reset does after the launch)."""
        if len(core.context.pages) != 1 or core.page.is_closed() or not core.chat.browser.is_connected():
            raise RuntimeError("the page is not the one BrowserGym opened")
        core.task.teardown()
        core.task_entrypoint = entrypoint
        core.task = entrypoint(seed=seed, **core.task_kwargs)
        goal, _ = core.task.setup(page=core.page)
        core.goal_object = [{"type": "text", "text": goal}] if isinstance(goal, str) else list(goal)
        core.chat.messages.clear()
        for message in core.goal_object:
            if message["type"] == "text":
                core.chat.add_message(role="user", msg=message["text"])
        core._wait_dom_loaded()
        core._active_page_check()
        core.start_time = time.time()
        core.last_action, core.last_action_error, core.infeasible_message_received = "", "", False
        return core._get_obs()

    def _discard(self) -> None:
        """Close a broken environment as far as it closes, then kill what is left of its browsers."""
        with contextlib.suppress(Exception):
            self.env.close()
        self.kill_browsers()

    def kill_browsers(self) -> None:
        """Kill the browsers' main processes (their helpers end with them)."""
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.pids = []

    def step(self, action: str) -> dict:
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return self._page(obs, reward=float(reward), done=bool(terminated or truncated))

    def _page(self, obs: dict, reward: float, done: bool) -> dict:
        from browsergym.utils.obs import flatten_axtree_to_str
        from PIL import Image

        parts = [f"Goal: {obs['goal']}"]
        if obs.get("last_action_error"):
            parts.append(f"Error: {obs['last_action_error']}")
        parts.append(f"Page structure:\n{flatten_axtree_to_str(obs['axtree_object'])[: self.text_chars]}")
        buffer = io.BytesIO()
        Image.fromarray(obs["screenshot"]).save(buffer, format="PNG", compress_level=1)
        return {
            "goal": obs["goal"],
            "url": obs["url"],
            "text": "\n\n".join(parts),
            "png": base64.b64encode(buffer.getvalue()).decode("ascii"),
            "reward": reward,
            "done": done,
        }

    def close(self) -> None:
        self._discard()  # a dead browser's close raises; its processes are killed


def _read_requests(requests: queue.Queue, worker: Worker) -> None:
    """Hand stdin's lines to the main thread; at its end (the process that started this one is gone, or
    closed it) end at once, even in the middle of a request: the browsers killed, then this process."""
    for line in sys.stdin:
        requests.put(line)
    worker.kill_browsers()
    os._exit(0)


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def main(argv: list[str]) -> int:
    task, chromium, text_chars, page_timeout_ms = argv[0], argv[1], int(argv[2]), int(argv[3])
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # what the libraries print stays out of the answers

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")

    try:
        worker = Worker(task, chromium, text_chars, page_timeout_ms)
    except Exception as exc:
        answer({"error": _first_line(exc)})
        return 1
    answer({"ready": True})
    requests: queue.Queue = queue.Queue()
    threading.Thread(target=_read_requests, args=(requests, worker), daemon=True).start()
    while (line := requests.get()) is not None:
        request = json.loads(line)
        if request["op"] == "close":
            break
        try:
            if request["op"] == "reset":
                answer(worker.reset(request["seed"], request.get("task")))
            else:
                answer(worker.step(request["action"]))
        except Exception as exc:  # the browser died or stopped answering: said, not raised
            answer({"error": _first_line(exc)})
    worker.close()
    answer({"closed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
