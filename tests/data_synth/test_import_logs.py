"""Importing existing WebJudge logs as teacher labels: AgentRewardBench records and reference output."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from keyshot.data_synth.arb_import import import_arb
from keyshot.data_synth.dataset import BuildConfig, SplitConfig, build_dataset
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.importers import kept_steps
from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.data_synth.reference_import import import_reference, teacher_from_filename
from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.images import DEFAULT_POLICY, prepare_image
from tests.support import paths

FIXTURES = paths.FIXTURES
ARB = FIXTURES / "arb_records"
REFERENCE = (
    FIXTURES
    / "reference_outputs"
    / "WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json"
)
GPT4O_AGENT = "GenericAgent-gpt-4o-2024-11-20"
QWEN_AGENT = "GenericAgent-Qwen_Qwen2.5-VL-72B-Instruct"
UID_344 = f"webarena/{GPT4O_AGENT}/webarena.344"
SPLITS = SplitConfig(agents={"train": [GPT4O_AGENT], "test": [QWEN_AGENT]})


def _records() -> list[tuple[Path, dict]]:
    return [(p, json.loads(p.read_text(encoding="utf-8"))) for p in sorted(ARB.rglob("*.json"))]


def _uid(path: Path, record: dict) -> str:
    return f"{record['benchmark']}/{record['agent']}/{path.stem}"


def test_imported_scores_equal_the_recorded_ones(tmp_path):
    report = import_arb(ARB, tmp_path / "run")
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    records = _records()
    assert report.records == len(records) == 7 and not report.errors
    assert report.labels == sum(len(r["image_judge_record"]) for _, r in records)
    for path, record in records:
        uid, teacher = _uid(path, record), record["judge_model_name"]
        for step, entry in enumerate(record["image_judge_record"]):
            label = contents.labels[(uid, step, teacher)]
            assert label.text == entry["Response"]
            if entry["Score"] == 0:  # the original run could not read a score
                assert not label.valid and label.score is None and "recorded score 0" in label.error
            else:
                assert label.valid and label.score == entry["Score"]
        assert contents.key_points[(uid, teacher)].key_points == record["key_points"]
    assert report.labels_invalid == 1  # o4-mini, assistantbench.improved.validation.25, step 26


def test_kept_screenshots_get_the_embedded_pixels(tmp_path):
    report = import_arb(ARB, tmp_path / "run")
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    path = ARB / "webjudge_7B" / "webarena" / GPT4O_AGENT / "webarena.344.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    scores = [e["Score"] for e in record["image_judge_record"]]
    kept = kept_steps(scores)
    assert kept == [i for i, s in enumerate(scores) if s >= 3] == [2, 3]
    urls = [p["image_url"]["url"] for p in record["chat_messages"][1]["content"] if p["type"] == "image_url"]
    shots = contents.trajectories[UID_344].screenshots
    assert [s is not None for s in shots] == [i in kept for i in range(len(scores))]
    for step, url in zip(kept, urls, strict=True):
        assert Path(shots[step]).read_bytes() == base64.b64decode(url.split(",", 1)[1])
        assert prepare_image(Path(shots[step])).source_width == 1280
    # the o4-mini and GPT-4o records of this task had their images removed: counted, not guessed
    assert len(report.image_count_mismatches) == 2
    assert all("0 embedded images for 2 kept" in m for m in report.image_count_mismatches)
    assert report.steps_with_pixels == 2


def test_human_labels_and_teacher_verdicts_are_imported(tmp_path):
    import_arb(ARB, tmp_path / "run")
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    assert contents.trajectories[UID_344].human_label == "unsure"
    assert contents.trajectories[f"webarena/{GPT4O_AGENT}/webarena.427"].human_label == "failure"
    for path, record in _records():
        outcome = contents.outcomes[(_uid(path, record), record["judge_model_name"])]
        text = record["response"]["choices"][0]["message"]["content"]
        assert outcome.valid and outcome.success == ('Status: "success"' in text or "Status: success" in text)


def test_dataset_rows_carry_the_recorded_scores(tmp_path):
    import_arb(ARB, tmp_path / "run", judges=["webjudge-7B"])
    result = build_dataset(tmp_path / "run", BuildConfig(splits=SPLITS))
    from datasets import load_from_disk

    ds = load_from_disk(str(result.path))
    record = json.loads((ARB / "webjudge_7B" / "webarena" / GPT4O_AGENT / "webarena.344.json").read_text())
    rows = list(ds["train"])
    # the two kept screenshots of webarena.344 are the same bytes (the agent stayed on the page) and the
    # same request: one row, counted twice
    assert [(r["uid"], r["step"], r["count"]) for r in rows] == [(UID_344, 2, 2)]
    assert result.meta.duplicates == {"rows_collapsed": 1, "score_conflicts": 0}
    for row in rows:
        assert row["score"] == record["image_judge_record"][row["step"]]["Score"]
        assert row["teacher"] == "webjudge-7B" and row["source"].startswith("import:arb:webjudge_7B/")
        assert row["key_points"] == record["key_points"] and row["task"] == record["goal"]
        assert row["image"].size == (1288, 728)  # the 1280x720 screenshot under the default policy
    assert result.report.dropped["no pixels for the screenshot"] == 4 + 4 - 2  # webarena.344 and .427


def test_all_judges_become_teachers_of_one_row(tmp_path):
    import_arb(ARB, tmp_path / "run")
    result = build_dataset(tmp_path / "run", BuildConfig(splits=SPLITS))
    from datasets import load_from_disk

    rows = list(load_from_disk(str(result.path))["train"])
    recorded = {
        r["judge_model_name"]: [e["Score"] for e in r["image_judge_record"]]
        for p, r in _records()
        if p.stem == "webarena.344"
    }
    for row in rows:
        got = {t["teacher"]: t["score"] for t in row["teacher_scores"]}
        assert got == {teacher: scores[row["step"]] for teacher, scores in recorded.items()}
    assert "gpt-4o-2024-11-20 | o4-mini" in (result.path / "README.md").read_text()


def test_reimport_adds_nothing(tmp_path):
    first = import_arb(ARB, tmp_path / "run")
    size = (tmp_path / "run" / LABELS_FILE).stat().st_size
    second = import_arb(ARB, tmp_path / "run")
    assert second.labels == 0 and second.labels_already_present == first.labels
    assert (tmp_path / "run" / LABELS_FILE).stat().st_size == size


def test_trajectory_folder_fills_the_screenshots_no_judge_kept(tmp_path):
    # stands in for the AgentLab run of webarena.344: any AgentLab folder with as many screenshots
    folder = tmp_path / "trajectories" / "webarena" / GPT4O_AGENT / "webarena.344"
    shutil.copytree(next((FIXTURES / "agentlab_small").iterdir()), folder)
    report = import_arb(ARB, tmp_path / "run", trajectories_dir=tmp_path / "trajectories")
    assert report.joined_trajectory_folders == 1
    shots = read_store(tmp_path / "run" / LABELS_FILE).trajectories[UID_344].screenshots
    assert shots == [str((folder / f"screenshot_step_{i}.png").resolve()) for i in range(4)]


def test_bad_records_are_skipped_and_named(tmp_path):
    records = tmp_path / "records"
    shutil.copytree(ARB, records)
    broken = records / "webjudge_7B" / "webarena" / GPT4O_AGENT / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    partial = records / "webjudge_7B" / "webarena" / GPT4O_AGENT / "partial.json"
    partial.write_text(json.dumps({"judge_model_name": "x", "goal": "g", "agent": "a", "benchmark": "b"}))
    report = import_arb(records, tmp_path / "run")
    assert len(report.errors) == 2
    assert any("broken.json: not a readable JSON record" in e for e in report.errors)
    assert any(
        "partial.json: field 'image_judge_record' must be a list, found missing" in e for e in report.errors
    )
    assert report.labels == sum(len(r["image_judge_record"]) for _, r in _records())
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SynthError, match="no \\*.json WebJudge records"):
        import_arb(empty, tmp_path / "run3")


def _reference_trajectories(root: Path, counts: dict[str, int]) -> Path:
    """Online-Mind2Web v1 folders for the reference-output fixture's task ids, from fixture screenshots."""
    pool = sorted((FIXTURES / "trajectories" / "online_mind2web_v2").rglob("*.jpg"))
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        folder = root / record["task_id"]
        (folder / "trajectory").mkdir(parents=True)
        result = {"task": record["task"], "action_history": record["action_history"]}
        (folder / "result.json").write_text(json.dumps(result), encoding="utf-8")
        for i in range(counts.get(record["task_id"], len(record["image_judge_record"]))):
            shutil.copy(pool[i % len(pool)], folder / "trajectory" / f"{i}.jpg")
    return root


def test_reference_output_joined_with_its_trajectories(tmp_path):
    trajs = _reference_trajectories(tmp_path / "trajs", {})
    report = import_reference(REFERENCE, trajs, tmp_path / "run", agent="SeeAct")
    assert not report.errors and report.trajectories == 2
    contents = read_store(tmp_path / "run" / LABELS_FILE)
    assert teacher_from_filename(REFERENCE) == "gpt-4o" and contents.teachers() == ["gpt-4o"]
    for line in REFERENCE.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        uid = f"online_mind2web/SeeAct/{record['task_id']}"
        got = [contents.labels[(uid, i, "gpt-4o")].score for i in range(len(record["image_judge_record"]))]
        assert got == [e["Score"] for e in record["image_judge_record"]]
        assert contents.outcomes[(uid, "gpt-4o")].success == bool(record["predicted_label"])
        assert all(Path(s).is_file() for s in contents.trajectories[uid].screenshots)
    result = build_dataset(tmp_path / "run", BuildConfig(splits=SplitConfig(agents={"train": ["SeeAct"]})))
    # 8 screenshots from a pool of 4 files: the 6-step task repeats 2 of them with the same request
    assert result.meta.rows == {"train": 6} and result.meta.duplicates["rows_collapsed"] == 2


def test_an_unknown_trajectory_format_is_one_line(tmp_path, capsys):
    trajs = _reference_trajectories(tmp_path / "trajs", {})
    argv = ["synth", "import-reference", str(REFERENCE), "--trajectories", str(trajs)]
    assert keyshot([*argv, "--run", str(tmp_path / "run"), "--format", "xyz"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "keyshot synth: error: unknown trajectory format 'xyz' (format); known: auto, agentlab, "
        "online-mind2web-v1, online-mind2web-v2, online-mind2web, jsonl"
    ]


def test_reference_output_with_a_mismatched_folder_is_skipped(tmp_path):
    trajs = _reference_trajectories(tmp_path / "trajs", {"om2w-task-b": 3})
    report = import_reference(REFERENCE, trajs, tmp_path / "run", teacher="my-judge")
    assert report.trajectories == 1 and len(report.errors) == 1
    assert "has 3 screenshots but the record scores 2" in report.errors[0]
    with pytest.raises(SynthError, match="cannot tell the teacher"):
        renamed = tmp_path / "results.jsonl"
        shutil.copy(REFERENCE, renamed)
        import_reference(renamed, trajs, tmp_path / "run")


def test_cli_import_then_build(tmp_path, capsys):
    run = tmp_path / "run"
    assert keyshot(["synth", "import-arb", str(ARB), "--run", str(run)]) == 0
    assert "labels: 55 new (1 invalid)" in capsys.readouterr().out
    out = tmp_path / "ds"
    rc = keyshot(
        [
            "synth",
            "build",
            "aggregation.consensus=majority",  # overrides and the run folder in any order
            str(run),
            "--config",
            str(FIXTURES.parent.parent / "configs/synth/arb_import.yaml"),
        ]
        + ["--out", str(out)]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"dataset written to {out}" in printed and "dropped, no pixels for the screenshot: 37" in printed
    assert json.loads((out / "keyshot_dataset.json").read_text())["aggregation"]["consensus"] == "majority"
    assert keyshot(["synth", "build", str(tmp_path / "nothing")]) == 2
    assert "no label store" in capsys.readouterr().err
    assert keyshot(["synth", "build", str(run), str(tmp_path / "other")]) == 2
    assert "one run folder, not 2" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one override syntax: the old --set is refused with the right one
        keyshot(["synth", "build", str(run), "--set", "aggregation.consensus=mean"])
    assert "overrides are written key=value, without --set" in capsys.readouterr().err


def test_default_policy_is_what_the_rows_hold(tmp_path):
    import_arb(ARB, tmp_path / "run", judges=["webjudge_7B"])  # the judge folder name works too
    result = build_dataset(tmp_path / "run", BuildConfig(splits=SPLITS))
    assert result.meta.image_policy == DEFAULT_POLICY.to_dict() and result.meta.teachers == ["webjudge-7B"]


def test_an_unreadable_screenshot_is_left_out_and_reported(tmp_path):
    import_arb(ARB, tmp_path / "run", judges=["webjudge-7B"])
    shots = read_store(tmp_path / "run" / LABELS_FILE).trajectories[UID_344].screenshots
    Path(shots[3]).write_bytes(Path(shots[3]).read_bytes()[:2000])  # truncated PNG
    result = build_dataset(tmp_path / "run", BuildConfig(splits=SPLITS))
    assert result.meta.rows == {"train": 1} and len(result.unreadable) == 1
    assert shots[3] in result.unreadable[0]
    assert "dropped, unreadable screenshot: 1" in (result.path / "README.md").read_text()
