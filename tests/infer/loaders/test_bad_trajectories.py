"""Bad trajectory input gives a TrajectoryError naming the file (or a documented warning), never a traceback."""

from __future__ import annotations

import codecs
import json
import logging
import shutil
from pathlib import Path

import pytest

from keyshot.infer.loaders import load_trajectories, load_trajectory, read_human_labels
from keyshot.infer.loaders.trajectory import SkippedEntry, TrajectoryError
from tests.support import paths

FIXTURES = paths.FIXTURES
TRAJ = FIXTURES / "trajectories"
PNG = (
    TRAJ
    / "agentlab/2024-12-18_12-51-50_DemoAgentArgs_on_workarena.servicenow.knowledge-base-search_5/screenshot_step_0.png"
)
ANALYSIS = PNG.parent / "experiment_analysis.md"


def _v1_task(root: Path, name: str = "task1", shots: int = 2, actions: int = 2, **result) -> Path:
    task = root / name
    (task / "trajectory").mkdir(parents=True)
    for i in range(shots):
        shutil.copy(PNG, task / "trajectory" / f"{i}.png")
    data = {
        "task": "Find the cheapest flight.",
        "action_history": [f"CLICK {i}" for i in range(actions)],
        **result,
    }
    (task / "result.json").write_text(json.dumps(data))
    return task


def _v2_task(root: Path, steps: list[dict], **result) -> Path:
    task = root / "task_v2"
    (task / "trajectory").mkdir(parents=True)
    shutil.copy(PNG, task / "trajectory" / "0000.png")
    data = {
        "schema_version": "online-mind2web-v2",
        "task": "Find a hotel.",
        "action_history": steps,
        **result,
    }
    (task / "result.json").write_text(json.dumps(data))
    return task


def test_missing_path():
    with pytest.raises(TrajectoryError, match=r"nowhere: no such file or folder"):
        load_trajectories("/nowhere")


def test_missing_result_json(tmp_path):
    task = _v1_task(tmp_path)
    (task / "result.json").unlink()
    with pytest.raises(TrajectoryError, match=r"task1: no result\.json"):
        list(load_trajectories(task))
    with pytest.raises(TrajectoryError, match=r"task1: no result\.json"):  # inside a folder of tasks too
        list(load_trajectories(tmp_path))


def test_unreadable_json(tmp_path):
    task = _v1_task(tmp_path)
    (task / "result.json").write_text('{"task": "x", "action_history": [}')
    with pytest.raises(TrajectoryError, match=r"task1/result\.json: invalid JSON: .*line 1, column"):
        load_trajectory(task)
    (task / "result.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(TrajectoryError, match=r"result\.json: not UTF-8"):
        load_trajectory(task)
    (task / "result.json").write_text("[1, 2]")
    with pytest.raises(TrajectoryError, match=r"result\.json: expected a JSON object, found a list"):
        load_trajectory(task)


def test_unknown_schema(tmp_path):
    task = _v1_task(tmp_path, schema_version="online-mind2web-v9")
    with pytest.raises(TrajectoryError, match=r"result\.json: unknown schema_version 'online-mind2web-v9'"):
        load_trajectory(task)


def test_missing_or_mistyped_fields(tmp_path):
    task = _v1_task(tmp_path)
    (task / "result.json").write_text(json.dumps({"action_history": []}))
    with pytest.raises(TrajectoryError, match=r"result\.json: field 'task' must be a string, found missing"):
        load_trajectory(task)
    (task / "result.json").write_text(json.dumps({"task": "x", "action_history": ["ok", 3]}))
    with pytest.raises(
        TrajectoryError, match=r"result\.json: action_history\[1\] must be a string, found a int"
    ):
        load_trajectory(task)


@pytest.mark.parametrize("fmt", ["v1", "v2", "jsonl", "agentlab"])
def test_trajectory_without_screenshots(tmp_path, fmt):
    if fmt == "v1":
        path = _v1_task(tmp_path, shots=0)
        expected = r"task1/trajectory: trajectory has no screenshots"
    elif fmt == "v2":
        path = _v2_task(tmp_path, [{"step": 0, "screenshot": None, "action": "x", "thought": None}])
        expected = r"task_v2/result\.json: trajectory has no screenshots"
    elif fmt == "jsonl":
        path = tmp_path / "t.jsonl"
        path.write_text(json.dumps({"task_id": "a", "task": "x", "actions": [], "screenshots": []}) + "\n")
        expected = r"t\.jsonl:1: trajectory has no screenshots"
    else:
        path = tmp_path / "2025-01-01_00-00-00_DemoAgentArgs_on_workarena.x_1"
        path.mkdir()
        shutil.copy(ANALYSIS, path / "experiment_analysis.md")
        expected = r"workarena\.x_1: trajectory has no screenshots"
    with pytest.raises(TrajectoryError, match=expected):
        list(load_trajectories(path))


def test_ds_store_and_text_files_are_skipped_with_a_warning(tmp_path, caplog):
    task = _v1_task(tmp_path)
    (task / "trajectory" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    (task / "trajectory" / "notes.txt").write_text("step 3 was slow")
    with caplog.at_level(logging.WARNING):
        trajectory = load_trajectory(task)
    assert [s.path.name for s in trajectory.screenshots] == ["0.png", "1.png"]
    assert "'.DS_Store', not an image file" in caplog.text and "'notes.txt', not an image file" in caplog.text
    assert str(task / "trajectory") in caplog.text


def test_image_name_without_digits(tmp_path):
    task = _v1_task(tmp_path)
    shutil.copy(PNG, task / "trajectory" / "final.png")
    with pytest.raises(TrajectoryError, match=r"trajectory/final\.png: screenshot name has no number"):
        load_trajectory(task)


def test_corrupt_truncated_and_empty_screenshots(tmp_path):
    task = _v1_task(tmp_path, shots=3, actions=3)
    shots = task / "trajectory"
    (shots / "0.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 50)  # PNG signature, broken chunks
    (shots / "1.png").write_bytes(PNG.read_bytes()[:4000])  # truncated mid-stream
    trajectory = load_trajectory(task)
    with pytest.raises(TrajectoryError, match=r"trajectory/0\.png: "):
        trajectory.screenshots[0].load()
    with pytest.raises(TrajectoryError, match=r"trajectory/1\.png: corrupt or truncated image"):
        trajectory.screenshots[1].load()
    with pytest.raises(TrajectoryError, match=r"trajectory/1\.png: corrupt or truncated image"):
        trajectory.screenshots[1].prepare()
    assert trajectory.screenshots[2].load().size == (1282, 713)
    (shots / "2.png").write_bytes(b"")
    with pytest.raises(TrajectoryError, match=r"trajectory/2\.png: screenshot file is empty \(0 bytes\)"):
        load_trajectory(task)


def test_mismatched_counts_warn_and_still_load(tmp_path, caplog):
    """Documented policy: equal counts or one extra screenshot are normal; a larger gap warns, naming the file."""
    with caplog.at_level(logging.WARNING):
        ok = load_trajectory(_v1_task(tmp_path, "ok", shots=3, actions=2))
    assert len(ok.actions) == 2 and "actions but" not in caplog.text
    with caplog.at_level(logging.WARNING):
        gap = load_trajectory(_v1_task(tmp_path, "gap", shots=2, actions=5))
    assert len(gap.actions) == 5 and len(gap.screenshots) == 2
    assert "gap/result.json: 5 actions but 2 screenshots" in caplog.text


def test_misaligned_v1_thoughts_are_aligned_with_a_warning(tmp_path, caplog):
    task = _v1_task(tmp_path, actions=3, thoughts=["first", None])
    with caplog.at_level(logging.WARNING):
        trajectory = load_trajectory(task)
    assert trajectory.thoughts == ["first", "", ""]
    assert "result.json: 2 thoughts for 3 actions" in caplog.text


def test_v2_bad_steps(tmp_path):
    step = {"step": 0, "screenshot": "0000.png", "action": "CLICK", "thought": None}
    task = _v2_task(tmp_path, [step, {**step, "step": 1, "screenshot": "0007.png"}])
    with pytest.raises(TrajectoryError, match=r"result\.json: screenshot 1 not found: '0007\.png'"):
        load_trajectory(task)
    shutil.rmtree(task)
    task = _v2_task(tmp_path, [step, dict(step)])
    with pytest.raises(TrajectoryError, match="duplicate step numbers"):
        load_trajectory(task)
    shutil.rmtree(task)
    task = _v2_task(tmp_path, [{**step, "screenshot": "https://example.com/0.png"}])
    with pytest.raises(TrajectoryError, match="is a remote URL"):
        load_trajectory(task)
    shutil.rmtree(task)
    task = _v2_task(tmp_path, [])
    with pytest.raises(TrajectoryError, match="'action_history' must be a non-empty list"):
        load_trajectory(task)


def _jsonl(tmp_path: Path, lines: list[str]) -> Path:
    shutil.copy(PNG, tmp_path / "s0.png")
    path = tmp_path / "trajs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


GOOD = {"task_id": "t1", "task": "Buy milk.", "actions": ["CLICK"], "screenshots": ["s0.png"]}


def test_bad_jsonl_lines_name_file_and_line(tmp_path, caplog):
    lines = [
        json.dumps(GOOD),
        '{"task_id": "t2", "task": ',  # line 2: broken JSON
        json.dumps({**GOOD, "task_id": "t3", "screenshot": ["s0.png"]}),  # line 3: typo'd key
        json.dumps({**GOOD, "task_id": "t4", "human_label": "yes"}),  # line 4
        json.dumps({**GOOD, "task_id": "t5", "screenshots": ["missing.png"]}),  # line 5
        json.dumps({**GOOD, "task_id": "t6", "screenshots": ["empty.png"]}),  # line 6
        "",
        json.dumps({**GOOD, "task_id": "t8", "thoughts": ["a", "b"]}),  # line 8
        json.dumps([1, 2]),  # line 9
        json.dumps({**GOOD, "task_id": "t10"}),
    ]
    path = _jsonl(tmp_path, lines)
    (tmp_path / "empty.png").write_bytes(b"")
    with pytest.raises(TrajectoryError, match=r"trajs\.jsonl:2: invalid JSON"):
        list(load_trajectories(path))
    errors: list[TrajectoryError] = []
    with caplog.at_level(logging.WARNING):
        loaded = list(load_trajectories(path, on_error="skip", errors=errors))
    assert [t.task_id for t in loaded] == ["t1", "t10"]
    messages = [str(e) for e in errors]
    assert [e.line for e in errors] == [2, 3, 4, 5, 6, 8, 9]
    assert "trajs.jsonl:3: unknown field(s) ['screenshot']" in messages[1]
    assert "trajs.jsonl:4: human_label must be one of" in messages[2]
    assert "trajs.jsonl:5: screenshot 0 not found: 'missing.png'" in messages[3]
    assert (
        "trajs.jsonl:6: screenshot 0 (" in messages[4]
        and "empty.png): screenshot file is empty" in messages[4]
    )
    assert "trajs.jsonl:8: 2 thoughts for 1 actions" in messages[5]
    assert "trajs.jsonl:9: expected a JSON object, found a list" in messages[6]
    assert "skipping a trajectory" not in caplog.text  # the caller that collects them says them, once
    with caplog.at_level(logging.WARNING):
        assert len(list(load_trajectories(path, on_error="skip"))) == 2
    assert caplog.text.count("skipping a trajectory") == 7  # no one collects them: each is warned of


def test_jsonl_reward_and_missing_fields(tmp_path):
    path = _jsonl(tmp_path, [json.dumps({"task_id": "a", "task": "x"})])
    with pytest.raises(
        TrajectoryError, match=r"trajs\.jsonl:1: missing required field\(s\) \['actions', 'screenshots'\]"
    ):
        list(load_trajectories(path))
    path = _jsonl(tmp_path, [json.dumps({**GOOD, "reward": "high"})])
    with pytest.raises(TrajectoryError, match=r"trajs\.jsonl:1: reward must be a number"):
        list(load_trajectories(path))


def test_not_a_trajectory(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(TrajectoryError, match=r"notes\.txt: not a trajectory file"):
        list(load_trajectories(tmp_path / "notes.txt"))
    (tmp_path / "stray").mkdir()
    with pytest.raises(TrajectoryError, match=r"stray: not a trajectory folder"):
        list(load_trajectories(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "stray").rmdir()
    with pytest.raises(TrajectoryError, match=r"empty: no trajectories found"):
        list(load_trajectories(empty))


def test_agentlab_unreadable_step_record_without_analysis_is_named(tmp_path):
    run = tmp_path / "2025-01-01_00-00-00_GenericAgentArgs_on_webarena.1"
    run.mkdir()
    shutil.copy(PNG, run / "screenshot_step_0.png")
    (run / "step_0.pkl.gz").write_bytes(b"\x1f\x8b not read")
    with pytest.raises(TrajectoryError, match=r"webarena\.1/step_0\.pkl\.gz: cannot read the step record"):
        load_trajectory(run)
    (run / "step_0.pkl.gz").unlink()
    with pytest.raises(
        TrajectoryError, match=r"webarena\.1: no experiment_analysis\.md and no step_N\.pkl\.gz"
    ):
        load_trajectory(run)


def test_agentlab_analysis_without_goal(tmp_path):
    run = tmp_path / "2025-01-01_00-00-00_GenericAgentArgs_on_webarena.2"
    run.mkdir()
    shutil.copy(PNG, run / "screenshot_step_0.png")
    (run / "experiment_analysis.md").write_text(
        "# 1 - Global Parameters\n\n## InstanceStep000\n\n### Next Action\n\nx\n"
    )
    with pytest.raises(TrajectoryError, match=r"experiment_analysis\.md: no task goal found"):
        load_trajectory(run)


def test_bad_human_label_file(tmp_path):
    path = tmp_path / "human_label.json"
    path.write_text(json.dumps([{"task_id": "a", "SeeAct_human_label": "7"}]))
    with pytest.raises(
        TrajectoryError, match=r"human_label\.json: entry 0 \(task a\): SeeAct_human_label is '7'"
    ):
        read_human_labels(path)
    path.write_text(json.dumps({"a": 1}))
    with pytest.raises(TrajectoryError, match=r"human_label\.json: expected a JSON list"):
        read_human_labels(path)


def test_entries_that_hold_no_trajectory_are_listed_as_skipped(tmp_path, caplog):
    """Files of an input folder (and of its agent folders) that are not trajectories are reported as
    skipped entries with the reason; with on_error="raise" they are warned of, not raised."""
    root = tmp_path / "release"
    _v1_task(root / "SeeAct", "task1")
    (root / "SeeAct" / "notes.txt").write_text("slow network")
    (root / "part2.zip").write_bytes(b"PK\x03\x04")
    (root / "human_label.json").write_text("[]")
    (root / ".DS_Store").write_bytes(b"\0")  # hidden: not an entry
    errors: list[TrajectoryError] = []
    found = list(load_trajectories(root, on_error="skip", errors=errors))
    assert [(t.agent, t.task_id) for t in found] == [("SeeAct", "task1")]
    assert all(isinstance(e, SkippedEntry) for e in errors)
    reasons = {e.path.name: e.problem for e in errors}
    assert sorted(reasons) == ["human_label.json", "notes.txt", "part2.zip"]
    assert "unpack it" in reasons["part2.zip"] and "not a trajectory file" in reasons["notes.txt"]
    with caplog.at_level(logging.WARNING):
        assert len(list(load_trajectories(root))) == 1
    assert "part2.zip: an archive" in caplog.text


def test_a_loose_result_json_does_not_hide_the_task_folders_beside_it(tmp_path):
    _v1_task(tmp_path, "task1")
    _v1_task(tmp_path, "task2")
    shutil.copy(tmp_path / "task1" / "result.json", tmp_path / "result.json")
    errors: list[TrajectoryError] = []
    found = list(load_trajectories(tmp_path, on_error="skip", errors=errors))
    assert sorted(t.task_id for t in found) == ["task1", "task2"]
    assert [str(e) for e in errors] == [
        f"{tmp_path / 'result.json'}: a result.json outside a task folder: an Online-Mind2Web task folder "
        "holds result.json and trajectory/; move it into its task folder"
    ]
    assert load_trajectory(tmp_path / "task1").task_id == "task1"  # a task folder is still one trajectory


def test_jsonl_bad_bytes_and_deep_nesting_skip_one_line_each(tmp_path):
    def good(n: int) -> bytes:
        return json.dumps({"task_id": f"t{n}", "task": "x", "actions": [], "screenshots": ["s.png"]}).encode()

    shutil.copy(PNG, tmp_path / "s.png")
    deep = "[" * 50_000 + "]" * 50_000
    data = b"\n".join([good(1), b'{"task": "\xff"}', deep.encode(), good(4)])
    path = tmp_path / "trajs.jsonl"
    path.write_bytes(codecs.BOM_UTF8 + data + b"\n")
    errors: list[TrajectoryError] = []
    found = list(load_trajectories(path, on_error="skip", errors=errors))
    assert [t.task_id for t in found] == ["t1", "t4"]
    assert [(e.line, e.problem.split(" (")[0]) for e in errors] == [
        (2, "not UTF-8 text"),
        (3, "JSON nested too deeply to read"),
    ]
    with pytest.raises(TrajectoryError, match=r"trajs\.jsonl:2: not UTF-8 text"):
        list(load_trajectories(path))
