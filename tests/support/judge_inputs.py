"""The fixture trajectories a judge test runs on (paths, counts) and its judge: overrides, argv, client."""

from __future__ import annotations

import asyncio
from pathlib import Path

from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.testing.fake_openai import FakeOpenAI
from tests.support import paths

FIXTURES = paths.FIXTURES
TRAJ = FIXTURES / "trajectories"
ALL_PATHS = [
    TRAJ / "agentlab",
    FIXTURES / "agentlab_small",
    TRAJ / "online_mind2web_v1",
    TRAJ / "online_mind2web_v2",
    TRAJ / "jsonl" / "trajectories.jsonl",
]
N_TRAJECTORIES = 7
N_SCREENSHOTS = 24
AGENTLAB_DIRS = [TRAJ / "agentlab", FIXTURES / "agentlab_small"]
TINY_CPU = str(paths.REPO / "configs/judge/tiny_cpu.yaml")  # the scorer's max_tokens is 64
VERBOSE = 200  # words of reasoning before the score: ~400 tokens


def agentlab_trajectories() -> list[Trajectory]:
    return [t for d in AGENTLAB_DIRS for t in load_trajectories(d)]


def judge_overrides(base_url: str, out: Path, **extra: str) -> list[str]:
    items = [
        f"judge.base_url={base_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        "judge.backoff_base_s=0.01",
        "judge.timeout_s=10",
        f"out={out}",
    ]
    return items + [f"{k}={v}" for k, v in extra.items()]


def judge_argv(server: FakeOpenAI, out: Path, **extra: str) -> list[str]:
    """keyshot judge over the fixtures with the shipped CPU config; judge and scorer are ``server``."""
    argv = ["judge", *map(str, ALL_PATHS), "--config", TINY_CPU, "--no-progress"]
    return argv + judge_overrides(
        server.base_url,
        out,
        **{"scorer.endpoint.base_url": server.base_url, "scorer.endpoint.model": "fake-scorer"},
        **extra,
    )


def judge_client(server: FakeOpenAI, **overrides) -> JudgeClient:
    values = {
        "base_url": server.base_url,
        "model": "fake-judge",
        "api_key_env": None,
        "timeout_s": 5,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
    }
    values.update(overrides)
    return JudgeClient(EndpointConfig(**values))


def judge_all(webjudge: WebJudge, trajectories: list[Trajectory]) -> list[Verdict]:
    async def go():
        try:
            return [await webjudge.judge(t) for t in trajectories]
        finally:
            await webjudge.aclose()

    return asyncio.run(go())
