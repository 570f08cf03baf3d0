"""A sweep of released judge records shows the judge what the records' own outcome prompts showed: every
AgentRewardBench dev record of the released WebJudge runs (WebJudge-7B, o4-mini, GPT-4o), asked again by
``keyshot sweep`` at its own δ (3), sends the record's own ``input_text``: its task without the goal's
image notes, and each kept screenshot's description read by the rule of the prompt set that answered it.

The 215 records' fields that make the prompt are in ``tests/fixtures/arb_parsing`` (tests/fixtures/LICENSES.md);
the released files themselves, where ../shared/data is beside the repository, also give the system prompt."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.runs.verdict_sources import read_reference_records
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from tests.support import paths

ROWS = paths.FIXTURES / "arb_parsing" / "dev_responses.jsonl.gz"
RELEASED = paths.REPO.parent / "shared" / "data" / "arb_webjudge" / "dev"
JUDGES = ("webjudge_7B", "webjudge_o4_mini", "webjudge_gpt4o")
OWN_DELTA = 3  # the reference's δ, with which the released runs kept their screenshots


def _rows() -> list[dict]:
    with gzip.open(ROWS, "rt", encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def _write_records(root: Path, judge: str) -> Path:
    """The fixture's rows of ``judge`` as AgentRewardBench record files (the fields a sweep reads)."""
    for row in _rows():
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


def _sent(folder: Path, out: Path) -> list[dict]:
    """The outcome requests ``keyshot sweep`` sends for ``folder`` at the records' own δ."""
    with FakeOpenAI(make_judge("task_hash")) as server:
        argv = ["sweep", str(folder), "--out", str(out), "--deltas", str(OWN_DELTA), "--no-progress"]
        argv += [f"judge.base_url={server.base_url}", "judge.model=fake-judge", "judge.api_key_env=null"]
        assert keyshot(argv) == 0
        return [r for r in server.requests if identify_step(r) == "outcome"]


def _compare(folder: Path, sent: list[dict]) -> None:
    texts = {r["messages"][1]["content"][0]["text"] for r in sent}
    records = {f: json.loads(f.read_text(encoding="utf-8")) for f in sorted(folder.rglob("*.json"))}
    differ = [str(f.relative_to(folder)) for f, r in records.items() if r["input_text"] not in texts]
    assert not differ, f"{len(differ)} of {len(records)} records' own outcome prompts were not sent: {differ}"
    assert len(texts) == len({r["input_text"] for r in records.values()})


@pytest.mark.parametrize("judge", JUDGES)
def test_every_released_record_is_asked_with_its_own_prompt(judge, tmp_path):
    folder = _write_records(tmp_path / "records", judge)
    # its own δ: the screenshots the record's outcome call showed are the ones kept at δ=3
    for v in read_reference_records(folder, threshold=OWN_DELTA):
        assert len(v.kept) == json.loads(Path(v.source).read_text())["n_outcome_images"], v.source
    _compare(folder, _sent(folder, tmp_path / "sweep"))


@pytest.mark.skipif(not RELEASED.is_dir(), reason=f"no released records at {RELEASED} (../shared/data)")
@pytest.mark.parametrize("judge", JUDGES)
def test_the_released_files_are_asked_with_their_own_prompts(judge, tmp_path):
    """The released files themselves: their own user text and their own system prompt (the ``general``
    prompt set's outcome system prompt, in all three runs)."""
    folder = RELEASED / judge
    sent = _sent(folder, tmp_path / "sweep")
    _compare(folder, sent)
    systems = {json.loads(f.read_text(encoding="utf-8"))["system_msg"] for f in folder.rglob("*.json")}
    assert {r["messages"][0]["content"] for r in sent} == systems
