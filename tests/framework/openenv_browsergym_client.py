"""OpenEnv's BrowserGym client (``browsergym_env.BrowserGymEnv``, what TRL's example uses) playing one episode
on ``keyshot reward env``, with whichever OpenEnv client generation the venv holds: ``openenv`` 0.10 (a
call resolves when its result is read) or ``openenv-core`` 0.2.x/0.3 (coroutines; its ``.sync()``
wrapper). Run by tests/env/test_openenv_server.py in .venv-openenv and .venv-openenv-core.

    python tests/framework/openenv_browsergym_client.py URL SEED

Prints one JSON line: the client package and version, whether a bare ``reset()`` returned a coroutine
(what TRL's example would get), the rewards of every step, the final observation's type and metadata,
``StepResult.metadata``, and the state.
"""

from __future__ import annotations

import importlib.metadata as md
import inspect
import json
import sys
from pathlib import Path

from browsergym_env import BrowserGymAction, BrowserGymEnv
from browsergym_env.models import BrowserGymObservation


def version() -> tuple[str, str]:
    """The distribution (``openenv`` or ``openenv-core``: both install the module ``openenv``) whose
    module this process imported, and its version."""
    import openenv

    site = Path(openenv.__file__).resolve().parents[1]
    for name in ("openenv", "openenv-core"):
        try:
            found = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        if Path(found.locate_file("")).resolve() == site:
            return name, found.version
    return "?", "?"


def main() -> None:
    url, seed = sys.argv[1], int(sys.argv[2])
    client = BrowserGymEnv(base_url=url)
    # TRL's example calls reset/step bare: openenv 0.10 resolves them when read, openenv-core's are
    # coroutines (its .sync() wrapper is the way to call them from synchronous code)
    coroutine = inspect.iscoroutinefunction(client.reset)
    env = client.sync() if coroutine else client
    try:
        result = env.reset(seed=seed, task_name="click-test")
        rewards = [result.reward]
        while not result.done:
            result = env.step(BrowserGymAction(action_str="click('13')"))
            rewards.append(result.reward)
        state = env.state()
    finally:
        env.close()
    package, number = version()
    summary = {
        "package": package,
        "version": number,
        "bare_reset_is_coroutine": coroutine,
        "rewards": rewards,
        "is_openenv_model": isinstance(result.observation, BrowserGymObservation),
        "observation_metadata": result.observation.metadata,
        "result_metadata": getattr(result, "metadata", None),
        "task_id": state.task_id,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
