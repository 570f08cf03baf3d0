"""The released AgentRewardBench WebJudge dev records (tests/fixtures/arb_parsing: the fields that make a
record's prompts) written back as record files, and the outcome requests ``keyshot sweep`` sends for them."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from keyshot.infer.cli import main as keyshot
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from tests.support import paths

ROWS = paths.FIXTURES / "arb_parsing" / "dev_responses.jsonl.gz"
JUDGES = ("webjudge_7B", "webjudge_o4_mini", "webjudge_gpt4o")
OWN_DELTA = 3  # the reference's δ, with which the released runs kept their screenshots


def released_rows() -> list[dict]:
    with gzip.open(ROWS, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def write_records(root: Path, judge: str) -> Path:
    """The fixture's rows of ``judge`` as AgentRewardBench record files under ``root/<judge>`` (the fields
    a sweep and ``keyshot synth import-arb`` read); that folder."""
    for row in released_rows():
        if row["judge"] != judge:
            continue
        _, _, _, benchmark, agent, name = Path(row["path"]).parts
        record = {
            "benchmark": benchmark,
            "goal": row["goal"],
            "agent": agent,
            "judge_model_name": judge,
            "key_points": row["key_points"],
            "image_judge_record": row["image_judge_record"],
            "input_text": row["input_text"],
            "response": {"choices": [{"message": {"content": row["outcome_response"]}}]},
            "n_outcome_images": row["n_outcome_images"],
        }
        path = root / judge / benchmark / agent / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record), encoding="utf-8")
    return root / judge


def swept_outcomes(folder: Path, out: Path) -> list[dict]:
    """The outcome requests ``keyshot sweep`` sends for the records in ``folder`` at their own δ."""
    with FakeOpenAI(make_judge("task_hash")) as server:
        argv = ["sweep", str(folder), "--out", str(out), "--deltas", str(OWN_DELTA), "--no-progress"]
        argv += [f"judge.base_url={server.base_url}", "judge.model=fake-judge", "judge.api_key_env=null"]
        assert keyshot(argv) == 0
        return [r for r in server.requests if identify_step(r) == "outcome"]
