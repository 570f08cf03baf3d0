"""AgentRewardBench's index and records have one reader (infer/loaders/judge_records.py): metrics and
synthesis's import see the same labels under the same identity, and refuse the same bad file alike."""

from __future__ import annotations

import shutil

import pytest

from keyshot.data_synth.arb_import import import_arb
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.infer.loaders.judge_records import outcome_text, read_arb_index
from keyshot.infer.metrics.compute import MetricsInputError, arb_records, load_arb_index
from tests.support import paths

ARB = paths.FIXTURES / "arb_records"


def test_metrics_and_import_read_the_same_labels_with_agents_compared_loosely(tmp_path):
    records = tmp_path / "records"
    shutil.copytree(ARB, records)
    index = records / "index.csv"
    rows = read_arb_index(index)
    judged = {r.task_id: r.human for r in arb_records(index, judge="webjudge_7B")}
    # the agent spelt another way in the index: both readers still match it to the records' agent
    index.write_text(
        index.read_text().replace(",GenericAgent-gpt-4o-2024-11-20,", ",genericagent gpt 4o 2024 11 20,")
    )
    relabelled = read_arb_index(index)
    assert [r.key for r in relabelled] == [r.key for r in rows]
    assert [r.human for r in relabelled] == [r.human for r in rows]

    import_arb(records, tmp_path / "run", judges=["webjudge_7B"])
    imported = {
        t.task_id: t.human_label for t in read_store(tmp_path / "run" / LABELS_FILE).trajectories.values()
    }
    seven_b = {r.task_id: r.human for r in relabelled if r.judge == "webjudge_7B"}
    assert imported and imported == {task: seven_b[task] for task in imported}
    assert judged == seven_b


def test_a_bad_label_is_refused_naming_the_line_by_both(tmp_path):
    records = tmp_path / "records"
    shutil.copytree(ARB, records)
    index = records / "index.csv"
    lines = index.read_text().splitlines()
    lines[2] = lines[2].rsplit(",", 1)[0] + ",Maybe"
    index.write_text("\n".join(lines) + "\n")
    with pytest.raises(MetricsInputError, match=r"index\.csv:3: unknown human label 'Maybe'"):
        load_arb_index(index)
    with pytest.raises(SynthError, match=r"index\.csv:3: unknown human label 'Maybe'"):
        import_arb(records, tmp_path / "run")


def test_outcome_text_of_every_record_format():
    answer = "Thoughts: fine\nStatus: success"
    assert outcome_text({"evaluation_details": {"response": answer}}) == answer  # src/run.py output
    assert outcome_text({"response": answer}) == answer
    assert outcome_text({"response": {"choices": [{"message": {"content": answer}}]}}) == answer  # ARB
    assert outcome_text({"response": {"choices": []}}) is None
    assert outcome_text({"response": {"choices": [{"message": {"content": None}}]}}) is None
