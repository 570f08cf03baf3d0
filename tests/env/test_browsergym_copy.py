"""env/miniwob/worker.py writes BrowserGym's ``BrowserEnv`` reset/step/observation per browser context (its
own launches a Chromium, and one more for its chat window, per environment). This pins the copy to the
BrowserGym keyshot pins: the version installed is pyproject.toml's, the source of every method the worker
copies is the one it was written from (a new release that changes one fails here, naming it), and a live
episode played both ways (BrowserGym's own environment, keyshot's session) shows the same goal, page
text, screenshot size, reward and end."""

from __future__ import annotations

import hashlib
import inspect
import re

import pytest

from tests.support import paths

REPO = paths.REPO
#: sha256 (16 hex) of the source of what worker.py copies, in browsergym-core 0.14.3
COPIED = {
    "BrowserEnv.reset": "3251c80a8ba05683",
    "BrowserEnv.pre_step": "6020cbe52d5feec9",
    "BrowserEnv.step": "e182c7687b45ff8a",
    "BrowserEnv.post_step": "9f0b5af7320b47e9",
    "BrowserEnv._task_validate": "f244ddd4d5d874f9",
    "BrowserEnv._wait_dom_loaded": "16c2cecc5a25ed68",
    "BrowserEnv._activate_page_from_js": "f793c960d94121d4",
    "BrowserEnv._active_page_check": "9d0f1afd940fedb6",
    "BrowserEnv._get_obs": "56e090fb0981ff2f",
    "Chat.add_message": "560575ea3cbcb302",
}
COPIED_FROM = "0.14.3"


def test_the_browsergym_installed_is_the_one_the_worker_copies():
    core = pytest.importorskip("browsergym.core", reason="the browser extra: make setup-browser")
    from browsergym.core.chat import Chat
    from browsergym.core.env import BrowserEnv

    pinned = re.search(r'"browsergym-core==([^"]+)"', (REPO / "pyproject.toml").read_text())[1]
    assert pinned == COPIED_FROM, (
        f"pyproject.toml pins browsergym-core {pinned}; env/miniwob/worker.py copies {COPIED_FROM}: re-read "
        "BrowserEnv's reset/step/_get_obs there, update the copy, then COPIED here"
    )
    assert core.__version__ == pinned, f"browsergym-core {core.__version__} is installed, {pinned} is pinned"
    owners = {"BrowserEnv": BrowserEnv, "Chat": Chat}
    found = {}
    for name in COPIED:
        owner, method = name.split(".")
        found[name] = hashlib.sha256(inspect.getsource(getattr(owners[owner], method)).encode()).hexdigest()[
            :16
        ]
    changed = [name for name in COPIED if found[name] != COPIED[name]]
    assert changed == [], f"BrowserGym changed {changed}: env/miniwob/worker.py copies them; update the copy"


@pytest.mark.slow
@pytest.mark.parametrize(("task", "seed"), [("click-button", 3), ("enter-text", 5)])
def test_an_episode_is_the_same_in_browsergyms_environment_and_in_a_keyshot_session(task, seed):
    pytest.importorskip("browsergym.miniwob", reason="the browser extra: make setup-browser")
    import gymnasium as gym
    from browsergym.utils.obs import flatten_axtree_to_str

    from keyshot.env.miniwob.agents import ScriptedAgent
    from keyshot.env.miniwob.client import MiniWoBBrowser
    from keyshot.env.miniwob.settings import SessionSettings
    from keyshot.env.miniwob.setup import MiniWoBError, prepare_browser

    try:
        setup = prepare_browser()  # BrowserGym's own environment runs in this process
    except MiniWoBError as exc:
        pytest.skip(str(exc))
    theirs = gym.make(
        f"browsergym/miniwob.{task}",
        disable_env_checker=True,
        timeout=round(
            SessionSettings().page_timeout_s * 1000
        ),  # the page timeout keyshot's sessions run with
        pw_chromium_kwargs={"executable_path": str(setup.chromium)},
    )
    try:
        with MiniWoBBrowser(task, seed=seed, setup=setup) as ours:
            obs, _ = theirs.reset(seed=seed)
            page = ours.reset()
            assert ours.task == obs["goal"]
            tree = flatten_axtree_to_str(obs["axtree_object"])
            assert page.text.endswith(tree[:4000]) and page.image().size == obs["screenshot"].shape[1::-1]
            agent, steps = ScriptedAgent(), 0
            while not page.done and (action := agent(page)) is not None:
                obs, reward, terminated, truncated, _ = theirs.step(action)
                page = ours.act(action)
                steps += 1
                assert (ours.reward, page.done) == (float(reward), bool(terminated or truncated))
                assert page.text.endswith(flatten_axtree_to_str(obs["axtree_object"])[:4000])
            assert steps >= 1 and ours.reward == 1.0  # the scripted agent does these tasks right, both ways
    finally:
        theirs.close()
        _stop_browsergyms_playwright()


def _stop_browsergyms_playwright() -> None:
    """BrowserGym starts one sync playwright for the process and never stops it: its event loop stays the
    thread's running loop, and every later ``asyncio.run`` in this pytest worker would fail."""
    import browsergym.core as core

    if core._PLAYWRIGHT is not None:
        core._PLAYWRIGHT.stop()
        core._set_global_playwright(None)
