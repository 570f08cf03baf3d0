"""``keyshot synth import-arb`` reads a released judge record as judging reads it: the task its own outcome
prompt showed (without AgentLab's note of the goal's images, which names a path of the recording machine)
and each screenshot's description by the rule of the prompt set that answered it. So the outcome prompt
rebuilt from the imported labels is the one ``keyshot sweep`` sends for the same record: the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyshot.data_synth.importers import kept_steps
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders.judge_records import recorded_actions
from keyshot.infer.protocol.messages import outcome_messages
from keyshot.infer.protocol.prompts import load_prompt_set
from tests.support.released_records import JUDGES, swept_outcomes, write_records


def _imported(folder: Path, run: Path):
    assert keyshot(["synth", "import-arb", str(folder), "--run", str(run)]) == 0
    return read_store(run / LABELS_FILE)


@pytest.mark.parametrize("judge", JUDGES)
def test_imported_labels_rebuild_the_outcome_prompt_a_sweep_sends(judge, tmp_path):
    folder = write_records(tmp_path / "records", judge)
    contents = _imported(folder, tmp_path / "run")
    sent = {r["messages"][1]["content"][0]["text"] for r in swept_outcomes(folder, tmp_path / "sweep")}
    prompts = load_prompt_set("general")  # the outcome prompt set of all three released runs
    differ = []
    for path in sorted(folder.rglob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        uid = f"{record['benchmark']}/{record['agent']}/{path.stem}"
        labels = [contents.labels[(uid, step, judge)] for step in range(len(record["image_judge_record"]))]
        kept = kept_steps([label.score for label in labels])
        messages = outcome_messages(
            prompts,
            contents.trajectories[uid].task,
            contents.key_points[(uid, judge)].key_points,
            recorded_actions(record),
            None,
            None,  # released records: the descriptions without the images, as the sweep sends them
            [labels[step].thought for step in kept],
        )
        if messages[1]["content"][0]["text"] not in sent:
            differ.append(uid)
    assert not differ, (
        f"{len(differ)} records' imported labels rebuild another prompt than the sweep's: {differ}"
    )


def test_the_imported_task_carries_no_local_path(tmp_path):
    for judge in JUDGES:
        write_records(tmp_path / "records", judge)
    tasks = {t.uid: t.task for t in _imported(tmp_path / "records", tmp_path / "run").trajectories.values()}
    noted = [
        (f"{r['benchmark']}/{r['agent']}/{p.stem}", r["goal"])
        for p in (tmp_path / "records").rglob("*.json")
        if "local path" in (r := json.loads(p.read_text(encoding="utf-8")))["goal"]
    ]
    assert len(noted) == 5  # the VisualWebArena records whose goal holds an input image
    for uid, goal in noted:
        assert "local path" not in tasks[uid] and "Input image" not in tasks[uid]
        assert goal.startswith(tasks[uid]) and tasks[uid].strip()


def test_a_general_answer_keeps_its_whole_reasoning(tmp_path):
    """A ``general`` answer's description is its whole reasoning (the general rule), not its first
    paragraph (the online_mind2web rule, which keyshot's import applied to every record)."""
    folder = write_records(tmp_path / "records", "webjudge_gpt4o")
    labels = _imported(folder, tmp_path / "run").labels.values()
    paragraphs = [lb for lb in labels if "\n\n" in lb.text.split("### Score")[0].strip()]
    assert paragraphs, "the fixture holds GPT-4o answers whose reasoning has several paragraphs"
    for label in paragraphs:
        second = label.text.split("### Score")[0].strip().split("\n\n")[1].strip()
        assert " ".join(second.split()[:6]) in " ".join(label.thought.split()), label.text
