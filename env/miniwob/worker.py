"""One MiniWoB browser in a process of its own (started by :class:`keyshot.env.miniwob.browser.MiniWoBBrowser`):

    python -I env/miniwob/worker.py TASK CHROMIUM MAX_TEXT_CHARS

Why a process: playwright reads the Python call stack at every call it makes (``inspect.stack()``), which
costs seconds per page in a trainer's process holding thousands of modules (torch, transformers, trl); here
it holds a few hundred. It also lets browsers run side by side. It ends with the process that started
it: that process's end closes the worker's stdin, and the worker then closes its browsers and exits.

Requests are JSON lines on stdin, answers JSON lines on the stdout it was given (anything the libraries
print goes to stderr): ``{"op": "reset", "seed": N}``, ``{"op": "step", "action": "click('12')"}``,
``{"op": "close"}``. An answer holds the goal, URL, the page's text (goal, last action's error,
accessibility tree), its screenshot (PNG, base64), MiniWoB's reward and whether the task is over, or
``{"error": "..."}`` when the browser failed. Imports nothing of keyshot (it runs by path).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import sys


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
    def __init__(self, task: str, chromium: str, text_chars: int):
        import browsergym.miniwob  # noqa: F401  (registers the browsergym/miniwob.* environments)
        import gymnasium as gym

        self.task = task
        self.text_chars = text_chars
        self.env = gym.make(
            f"browsergym/miniwob.{task}",
            disable_env_checker=True,
            pw_chromium_kwargs={"executable_path": chromium},
        )

    def reset(self, seed: int) -> dict:
        obs, _ = self.env.reset(seed=seed)
        core = self.env.unwrapped
        pids = [pid for pid in (_browser_pid(core.browser), _browser_pid(core.chat.browser)) if pid]
        return {**self._page(obs, reward=0.0, done=False), "pids": pids}

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
        with contextlib.suppress(Exception):  # a dead browser's close raises; its processes are gone
            self.env.close()


def main(argv: list[str]) -> int:
    task, chromium, text_chars = argv[0], argv[1], int(argv[2])
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    sys.stdout = sys.stderr  # what the libraries print stays out of the answers

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")

    try:
        worker = Worker(task, chromium, text_chars)
    except Exception as exc:
        answer({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    answer({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "close":
            break
        try:
            answer(
                worker.reset(request["seed"]) if request["op"] == "reset" else worker.step(request["action"])
            )
        except Exception as exc:  # the browser died or stopped answering: said, not raised
            answer(
                {
                    "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                }
            )
    worker.close()
    answer({"closed": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
