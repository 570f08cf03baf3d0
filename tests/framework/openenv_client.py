"""OpenEnv's own client (``GenericEnvClient``, WebSocket) playing episodes on ``keyshot reward env``; run in
the OpenEnv venv by tests/env/test_openenv_server.py (openenv is not installed in .venv).

    python tests/framework/openenv_client.py URL CLIENTS

Opens CLIENTS clients (one server session each, kept open between episodes, so a session's browser
serves its next episode), then reads requests from stdin, one JSON line each:
``[{"client": 0, "seed": 1, "agent": "scripted" | "stopping" | "looping" | "noop"}, ...]``: those episodes are played at once,
each until the server says ``done``, and one JSON line answers them: per episode, the rewards of every
step, the last observation's metadata (top-level and inside the observation), the first observation's
fields (beside those of OpenEnv's own BrowserGym model, which reads it) and screenshot shape, the state, and what the server says to a step after the end. When stdin
closes, the clients close and the driver exits.
"""

from __future__ import annotations

import contextlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from browsergym_env.models import BrowserGymObservation
from openenv.core.generic_client import GenericEnvClient

from keyshot.env.miniwob.agents import LoopingAgent, ScriptedAgent, StoppingAgent
from keyshot.env.page import Page

AGENTS = {"scripted": ScriptedAgent, "stopping": StoppingAgent, "looping": LoopingAgent}


def agent_of(kind: str):
    """``scripted``: keyshot's scripted MiniWoB agent, reading the page as keyshot's browser shows it
    (``stopping``: the same, stopping before it submits; ``looping``: its first action again and again);
    ``noop``: never acts on the page (the server's max_steps ends the episode)."""
    if kind == "noop":
        return lambda observation: "noop()"
    scripted = AGENTS[kind]()

    def act(observation: dict) -> str:
        page = Page(
            f"Goal: {observation['goal']}\n\nPage structure:\n{observation['axtree_txt']}", None, 0, False
        )
        return scripted(page) or "noop()"

    return act


def play(client, episode: dict) -> dict:
    agent = agent_of(episode.get("agent", "scripted"))
    result = client.reset(seed=episode["seed"])
    first = result.observation
    rewards = [result.reward]
    while not result.done:
        result = client.step({"action_str": agent(result.observation)})
        rewards.append(result.reward)
    try:
        client.step({"action_str": "noop()"})
        after_done = None
    except RuntimeError as exc:  # the episode is over: the server says so
        after_done = str(exc)
    # OpenEnv's own BrowserGym observation model (browsergym_env, installed in this venv) reads the answer
    own = sorted(set(BrowserGymObservation.model_fields) - {"done", "reward", "metadata"})
    BrowserGymObservation.model_validate({**first, "done": False, "reward": None})
    return {
        "fields": sorted(set(first) - {"metadata"}),
        "model_fields": own,
        "shape": list(np.asarray(first["screenshot"]).shape) if first["screenshot"] is not None else None,
        "goal": first["goal"],
        "first_text": first["text"][:200],
        "pruned_html": first["pruned_html"],
        "rewards": rewards,
        "steps": len(rewards) - 1,
        "metadata": result.metadata or {},
        "observation_metadata": result.observation.get("metadata", {}),
        "state": client.state(),
        "after_done": after_done,
    }


def main() -> None:
    url, count = sys.argv[1], int(sys.argv[2])
    clients = [GenericEnvClient(base_url=url).sync() for _ in range(count)]
    try:
        with ThreadPoolExecutor(count) as pool:
            for line in sys.stdin:
                episodes = json.loads(line)
                summaries = pool.map(lambda e: play(clients[e["client"]], e), episodes)
                print(json.dumps(list(summaries)), flush=True)
    finally:
        for client in clients:
            with contextlib.suppress(Exception):  # the server may be gone (the SIGTERM test)
                client.close()


if __name__ == "__main__":
    main()
