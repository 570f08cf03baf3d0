"""A sweep of released judge records shows the judge what the records' own outcome prompts showed: every
AgentRewardBench dev record of the released WebJudge runs (WebJudge-7B, o4-mini, GPT-4o), asked again by
``keyshot sweep`` at its own δ (3), sends the record's own ``input_text``: its task without the goal's
image notes, and each kept screenshot's description read by the rule of the prompt set that answered it.

The 215 records' fields that make the prompt are in ``tests/fixtures/arb_parsing`` (tests/fixtures/LICENSES.md);
the released files themselves, where ../shared/data is beside the repository, also give the system prompt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyshot.infer.runs.verdict_sources import read_reference_records
from tests.support import paths
from tests.support.released_records import JUDGES, OWN_DELTA, swept_outcomes, write_records

RELEASED = paths.REPO.parent / "shared" / "data" / "arb_webjudge" / "dev"


def _compare(folder: Path, sent: list[dict]) -> None:
    texts = {r["messages"][1]["content"][0]["text"] for r in sent}
    records = {f: json.loads(f.read_text(encoding="utf-8")) for f in sorted(folder.rglob("*.json"))}
    differ = [str(f.relative_to(folder)) for f, r in records.items() if r["input_text"] not in texts]
    assert not differ, f"{len(differ)} of {len(records)} records' own outcome prompts were not sent: {differ}"
    assert len(texts) == len({r["input_text"] for r in records.values()})


@pytest.mark.parametrize("judge", JUDGES)
def test_every_released_record_is_asked_with_its_own_prompt(judge, tmp_path):
    folder = write_records(tmp_path / "records", judge)
    # its own δ: the screenshots the record's outcome call showed are the ones kept at δ=3
    for v in read_reference_records(folder, threshold=OWN_DELTA):
        assert len(v.kept) == json.loads(Path(v.source).read_text())["n_outcome_images"], v.source
    _compare(folder, swept_outcomes(folder, tmp_path / "sweep"))


@pytest.mark.skipif(not RELEASED.is_dir(), reason=f"no released records at {RELEASED} (../shared/data)")
@pytest.mark.parametrize("judge", JUDGES)
def test_the_released_files_are_asked_with_their_own_prompts(judge, tmp_path):
    """The released files themselves: their own user text and their own system prompt (the ``general``
    prompt set's outcome system prompt, in all three runs)."""
    folder = RELEASED / judge
    sent = swept_outcomes(folder, tmp_path / "sweep")
    _compare(folder, sent)
    systems = {json.loads(f.read_text(encoding="utf-8"))["system_msg"] for f in folder.rglob("*.json")}
    assert {r["messages"][0]["content"] for r in sent} == systems
