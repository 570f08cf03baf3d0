"""Sharded judge runs: two agents' inputs, the faked 7B config, what shards and one process must share."""

from __future__ import annotations

from pathlib import Path

from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.worlds import synthetic_trajectories


def agent_inputs(tmp_path: Path, n: int = 12, shots: int = 3) -> list[str]:
    """Two agents on the same tasks with the same start pages: calls shared across trajectories."""
    return [
        str(synthetic_trajectories(tmp_path / "in" / agent, n, shots, seed=1, size=(96, 64), agent=agent))
        for agent in ("agent-a", "agent-b")
    ]


def judge_config(tmp_path: Path, scorer: dict, name: str = "cfg.yaml") -> str:
    """The shipped 7B judge config with the judge and the scorer (or a pool, ``scorer["scorer"]``) faked."""
    section = scorer.get("scorer") or {
        "endpoint": {"base_url": scorer["base_url"], "model": "webjudge-7b", "api_key_env": None}
    }
    return str(
        fake_judge_config(tmp_path / name, scorer["base_url"], section, judge={"backoff_base_s": 0.01})
    )


def comparable(v) -> tuple:
    """What a verdict says, without timing and without which of two identical calls paid."""
    return (
        v.key,
        v.success,
        v.key_points,
        v.outcome_text,
        tuple(v.kept),
        tuple((s.score, s.raw) for s in v.screenshots),
    )


def totals(summary: dict) -> dict:
    return {
        role: (u["calls"], u["prompt_tokens"], u["completion_tokens"]) for role, u in summary["usage"].items()
    }
