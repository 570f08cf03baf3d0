"""Helpers for the data_synth tests: fixture trajectory sources, teacher sets on fake servers, configs.

Two teachers with different deterministic scoring rules (``keyshot.infer.testing.fake_openai``): the first
also answers the key-point step, so it doubles as the key-point judge.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import statistics
from collections import Counter
from pathlib import Path

import yaml
from PIL import Image

from keyshot.data_synth.synth_config import SynthConfig, load_synth_config
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.testing.fake_openai import FakeOpenAI, score_image
from tests.support import paths

FIXTURES = paths.FIXTURES
TRAJECTORIES = FIXTURES / "trajectories"

#: 6 trajectories, 20 screenshots, 4 agents (SeeAct twice: an Online-Mind2Web folder and a JSONL line)
SOURCES = [
    {"path": str(TRAJECTORIES / "online_mind2web_v1"), "agent": "SeeAct"},
    {"path": str(TRAJECTORIES / "online_mind2web_v2"), "agent": "Agent-E"},
    {"path": str(TRAJECTORIES / "jsonl" / "trajectories.jsonl")},
    {"path": str(TRAJECTORIES / "agentlab")},
]
#: The Online-Mind2Web fixtures of SeeAct, Agent-E and Operator share screenshot files, so they must
#: share a split (a screenshot is never in two splits); the AgentLab run stands alone.
SPLITS = {
    "train": ["SeeAct", "Agent-E", "Operator"],
    "test": ["DemoAgent-gpt-4o"],
}
#: The lists these tests used before: they put shared screenshots in three splits.
LEAKY_SPLITS = {"train": ["SeeAct", "DemoAgent-gpt-4o"], "validation": ["Agent-E"], "test": ["Operator"]}
RULES = {"bright": "brightness", "dark": "darkness"}
#: Two real AgentLab WorkArena runs (Apache-2.0, from ServiceNow/BrowserGym PR #301)
AGENTLAB_RUNS = [TRAJECTORIES / "agentlab", FIXTURES / "agentlab_small"]


def endpoint(name: str, base_url: str, **overrides: object) -> dict:
    """A fast-failing local endpoint: tiny backoff, short timeout, no API key."""
    ep = {
        "name": name,
        "base_url": base_url,
        "model": f"fake-{name}",
        "api_key_env": None,
        "timeout_s": 5.0,
        "max_concurrency": 4,
        "max_retries": 2,
        "max_invalid_retries": 1,
        "backoff_base_s": 0.01,
        "backoff_max_s": 0.05,
    }
    ep.update(overrides)
    return ep


def teacher_set(urls: dict[str, str], **per_teacher: dict) -> dict:
    """``{"key_points_judge": ..., "teachers": [...]}`` with the first teacher as the judge."""
    names = list(urls)
    teachers = [
        {
            "endpoint": endpoint(n, urls[n], **per_teacher.get(n, {})),
            "image_tokens": "qwen",
            "est_output_tokens": 50,
        }
        for n in names
    ]
    judge = {"endpoint": endpoint("judge", urls[names[0]]), "image_tokens": "qwen"}
    return {"key_points_judge": judge, "teachers": teachers}


def write_config(
    path: Path, run_dir: Path, teachers: dict, *, sources: list[dict] | None = None, **extra: object
) -> Path:
    data = {
        "run_dir": str(run_dir),
        "teachers": teachers,
        "sources": sources if sources is not None else SOURCES,
        "trajectories_in_flight": 2,
        "images_in_flight": 4,
        "build": {"splits": {"agents": SPLITS}},
    }
    data.update(extra)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def synth_config(path: Path, run_dir: Path, teachers: dict, **extra: object) -> SynthConfig:
    return load_synth_config(write_config(path, run_dir, teachers, **extra))


def fixture_trajectories(sources: list[dict] | None = None) -> list[Trajectory]:
    out = []
    for src in sources if sources is not None else SOURCES:
        out.extend(load_trajectories(src["path"], agent=src.get("agent")))
    return out


def expected_scores(traj: Trajectory, rule: str, policy=DEFAULT_POLICY) -> list[int]:
    """The score a fake teacher with ``rule`` gives each screenshot (it sees the prepared JPEG)."""
    return [score_image(rule, shot.prepare(policy).pil()) for shot in traj.screenshots]


def median_low(scores: list[int]) -> int:
    return statistics.median_low(scores)


def agentlab_runs(root: Path) -> Path:
    """The runs of :data:`AGENTLAB_RUNS` copied into ``root``; returns the one whose agent got stuck on a
    page (the knowledge-base search), for a test to repeat its screenshots."""
    for folder in AGENTLAB_RUNS:
        for run in folder.iterdir():
            shutil.copytree(run, root / run.name)
    return next(root.glob("*knowledge-base-search*"))


def as_online_mind2web(agentlab: Path, root: Path, *, resave: bool = False) -> Path:
    """The episodes of ``agentlab`` as Online-Mind2Web v1 folders in ``root`` (task, actions, thoughts;
    another task id and benchmark, no agent), each screenshot copied, or with ``resave`` saved again
    (other bytes, the same pixels)."""
    for traj in load_trajectories(agentlab):
        task_dir = root / traj.task_id
        (task_dir / "trajectory").mkdir(parents=True)
        for shot in traj.screenshots:
            target = task_dir / "trajectory" / f"{shot.index}.png"
            if resave:
                Image.open(shot.path).save(target, compress_level=9)
            else:
                shutil.copyfile(shot.path, target)
        result = {"task": traj.task, "action_history": traj.actions, "thoughts": traj.thoughts}
        (task_dir / "result.json").write_text(json.dumps(result), encoding="utf-8")
    return root


def request_bodies(*servers: FakeOpenAI) -> Counter:
    """How often each request body (by the hash of its JSON) reached ``servers``."""
    return Counter(
        hashlib.sha256(json.dumps(r, sort_keys=True).encode()).hexdigest()
        for s in servers
        for r in s.requests
    )
