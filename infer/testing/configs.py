"""Judge configs that point the shipped WebJudge-7B recipe at local fake servers (tests and benchmarks)."""

from __future__ import annotations

from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
WEBJUDGE7B = REPO / "configs" / "judge" / "webjudge7b.yaml"


def fake_judge_config(
    path: Path, judge_url: str, scorer: dict, *, concurrency: int = 4, judge: dict | None = None
) -> Path:
    """Write ``configs/judge/webjudge7b.yaml`` with the judge at ``judge_url`` (no key, no budget) and the
    scorer section updated by ``scorer`` (an ``endpoint`` or ``endpoints``), without logprobs."""
    cfg = yaml.safe_load(WEBJUDGE7B.read_text(encoding="utf-8"))
    cfg["judge"].update(base_url=judge_url, api_key_env=None, budget_usd=None, **(judge or {}))
    cfg["scorer"].pop("endpoint")
    cfg["scorer"].update(scorer, logprobs=None)
    cfg["concurrency"] = concurrency
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path
