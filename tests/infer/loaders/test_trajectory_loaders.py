"""Every loader on real trajectories (tests/fixtures/trajectories), detection, JSONL round trip, human labels."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import pytest

from keyshot.infer.loaders import (
    FORMATS,
    attach_human_labels,
    detect_format,
    load_trajectories,
    load_trajectory,
    parse_experiment_analysis,
    read_human_labels,
    write_jsonl,
)
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from tests.support import paths

FIXTURES = paths.FIXTURES
TRAJ = FIXTURES / "trajectories"
LABELS = FIXTURES / "online_mind2web" / "human_label.json"
AGENTLAB_RUN = (
    TRAJ / "agentlab" / "2024-12-18_12-51-50_DemoAgentArgs_on_workarena.servicenow.knowledge-base-search_5"
)
CRASHED_RUN = (
    TRAJ
    / "agentlab_crashed"
    / "2024-12-18_12-43-14_DemoAgentArgs_on_workarena.servicenow.filter-asset-list_27"
)
V1_TASK = "fb7b4f784cfde003e2548fdf4e8d6b4f"
V2_TASK = "005be9dd91c95669d6ddde9ae667125c"


def _label_file() -> list[dict]:
    return json.loads(LABELS.read_text())


def _confirmed_task(task_id: str) -> str:
    return next(entry["confirmed_task"] for entry in _label_file() if entry["task_id"] == task_id)


def test_online_mind2web_v1_folder_of_tasks():
    trajectories = list(load_trajectories(TRAJ / "online_mind2web_v1", agent="SeeAct"))
    assert [t.task_id for t in trajectories] == ["48c73f3f53e2611c4a1052457c1033db", V1_TASK]
    first, second = trajectories
    assert first.task_id == "48c73f3f53e2611c4a1052457c1033db"  # from the folder name (no task_id key)
    assert first.thoughts is None and first.final_answer == ""
    assert second.format == "online-mind2web-v1" and second.benchmark == "online_mind2web"
    assert second.agent == "SeeAct" and second.uid == f"online_mind2web/SeeAct/{V1_TASK}"
    assert second.task == _confirmed_task(V1_TASK)
    assert second.actions[0] == "<a> Help -> CLICK" and len(second.actions) == 3
    assert second.thoughts is not None and len(second.thoughts) == 3
    assert [s.path.name for s in second.screenshots] == [f"{i}_full_screenshot.jpg" for i in range(3)]
    assert [s.index for s in second.screenshots] == [0, 1, 2]
    image = second.screenshots[2].load()
    assert image.size == (1282, 713)


def test_v1_screenshots_are_ordered_by_number_not_by_name(tmp_path):
    task = tmp_path / "t1"
    shutil.copytree(TRAJ / "online_mind2web_v1" / V1_TASK, task)
    shots = task / "trajectory"
    for old, new in [
        ("0_full_screenshot.jpg", "2.jpg"),
        ("1_full_screenshot.jpg", "10.jpg"),
        ("2_full_screenshot.jpg", "step_1.jpg"),
    ]:
        (shots / old).rename(shots / new)
    trajectory = load_trajectory(task)
    assert [s.path.name for s in trajectory.screenshots] == ["step_1.jpg", "2.jpg", "10.jpg"]
    assert trajectory.task_id == V1_TASK  # the task_id key wins over the folder name


def test_online_mind2web_v2_drops_the_answer_step():
    trajectory = load_trajectory(TRAJ / "online_mind2web_v2" / V2_TASK)
    assert trajectory.format == "online-mind2web-v2"
    assert trajectory.task == _confirmed_task(V2_TASK)
    assert len(trajectory.screenshots) == 4  # every step's screenshot is judged
    assert len(trajectory.actions) == 3 and not any(a.startswith("TASK_COMPLETE") for a in trajectory.actions)
    assert trajectory.thoughts == [
        "Start from the airline's home page.",
        "Baggage rules are usually under Help.",
        "This page lists allowances by cabin class.",
    ]
    assert trajectory.final_answer.startswith("Economy class allows 25 kg")
    assert trajectory.extra["urls"][0] == "https://www.qatarairways.com/"
    assert trajectory.extra["reference_length"] == 4
    assert [s.path.name for s in trajectory.screenshots] == [f"{i:04d}.jpg" for i in range(4)]


def test_v2_screenshot_references_relative_to_the_task_folder_and_inline(tmp_path):
    task = tmp_path / V2_TASK
    shutil.copytree(TRAJ / "online_mind2web_v2" / V2_TASK, task)
    result = json.loads((task / "result.json").read_text())
    jpeg = (task / "trajectory" / "0001.jpg").read_bytes()
    result["action_history"][0]["screenshot"] = "trajectory/0000.jpg"
    result["action_history"][1]["screenshot"] = "data:image/jpeg;base64," + base64.b64encode(jpeg).decode()
    del result["agent_final_answer"]
    (task / "result.json").write_text(json.dumps(result))
    trajectory = load_trajectory(task)
    assert trajectory.screenshots[0].path == task / "trajectory" / "0000.jpg"
    inline = trajectory.screenshots[1]
    assert inline.data == jpeg and inline.load().size == (1282, 713)
    assert inline.prepare().visual_tokens == 1150
    assert trajectory.final_answer.startswith("Economy class allows")  # parsed from TASK_COMPLETE -> ANSWER:


def test_agentlab_run():
    trajectory = load_trajectory(AGENTLAB_RUN)
    assert trajectory.format == "agentlab"
    assert trajectory.task_id == "workarena.servicenow.knowledge-base-search_5"
    assert trajectory.benchmark == "workarena"
    assert trajectory.agent == "DemoAgent-gpt-4o"
    assert trajectory.reward == 1.0
    assert trajectory.task.startswith("Answer the following question using the knowledge base:")
    assert trajectory.task.endswith('Provide the answer in gallons."')
    assert trajectory.actions == [
        "fill('112', 'water usage office #456')",
        "click('123')",
        "press('112', 'Enter')",
        "scroll(0, 200)",
        "click('320')",
        'send_msg_to_user("The exact amount of water that office #456 utilizes each year is 50,000 gallons.")',
    ]
    assert len(trajectory.thoughts) == 6
    assert trajectory.thoughts[1].startswith(
        'I have already filled the search input with the query "water usage'
    )
    assert all("```" not in thought for thought in trajectory.thoughts)
    assert (
        trajectory.final_answer
        == "The exact amount of water that office #456 utilizes each year is 50,000 gallons."
    )
    assert [s.path.name for s in trajectory.screenshots] == [f"screenshot_step_{i}.png" for i in range(7)]
    assert trajectory.extra["model_name"] == "gpt-4o"


def test_agentlab_steps_sort_numerically_and_actions_may_span_lines(tmp_path):
    run = tmp_path / "2025-01-02_03-04-05_GenericAgentArgs_on_webarena.310"
    run.mkdir()
    png = (AGENTLAB_RUN / "screenshot_step_0.png").read_bytes()
    for n in range(11):
        (run / f"screenshot_step_{n}.png").write_bytes(png)
    steps = []
    for n in range(11):
        if n == 10:
            body = "No next action available"
        elif n == 3:
            body = "```\nType two lines.\n\n```python\nfill('12', 'line one\nline two')\n```\n```"
        else:
            body = f"```\nThought number {n}.\n```click('{n}')```\n```"
        steps.append(
            f"## InstanceStep{n:03d}\n\n### State of the World\n\n```\n## not a heading\n```\n\n### Next Action\n\n{body}\n"
        )
    analysis = (
        "# 1 - Global Parameters\n\n## Task\n\n* **Goal**:\n  Find the issue\n  with the most comments.\n"
        "## Run Parameters\n\n### Model Configuration\n* **model_name**: Qwen/Qwen2.5-VL-72B-Instruct\n\n"
        "# 2 - Instance Type\n\n"
        + "\n".join(steps)
        + "\n# 3 - Templates\n\n## Next Action - Template\n\n```\nignored\n```\n"
    )
    (run / "experiment_analysis.md").write_text(analysis)
    trajectory = load_trajectory(run)
    assert trajectory.task == "Find the issue\nwith the most comments."
    assert trajectory.agent == "GenericAgent-Qwen_Qwen2.5-VL-72B-Instruct"
    assert trajectory.benchmark == "webarena" and trajectory.task_id == "webarena.310"
    assert trajectory.reward is None
    assert len(trajectory.actions) == 10 and trajectory.actions[9] == "click('9')"
    assert trajectory.actions[3] == "fill('12', 'line one\nline two')"
    assert trajectory.thoughts[3] == "Type two lines."
    assert [s.path.name for s in trajectory.screenshots][-2:] == [
        "screenshot_step_9.png",
        "screenshot_step_10.png",
    ]


def test_parse_experiment_analysis_on_the_real_file():
    steps = parse_experiment_analysis(AGENTLAB_RUN / "experiment_analysis.md")
    assert steps.num_steps == 7 and len(steps.actions) == 6 and steps.model_name == "gpt-4o"


def test_jsonl_file():
    trajectories = list(load_trajectories(TRAJ / "jsonl" / "trajectories.jsonl"))
    assert [t.agent for t in trajectories] == ["Operator", "SeeAct"]
    zelda, swimsuit = trajectories
    assert zelda.format == "jsonl" and zelda.human_label == "not_executable" and zelda.thoughts is not None
    assert swimsuit.human_label == "failure" and swimsuit.reward == 0.0 and swimsuit.thoughts is None
    assert zelda.screenshots[1].path == TRAJ / "jsonl" / "screenshots" / "zelda_1.jpg"
    assert zelda.extra["jsonl_line"] == 1 and swimsuit.extra["jsonl_line"] == 2
    # the JSONL's folder (screenshots/ beside it) also loads
    assert [t.task_id for t in load_trajectories(TRAJ / "jsonl")] == [zelda.task_id, swimsuit.task_id]


def test_write_jsonl_round_trip(tmp_path):
    originals = [
        *load_trajectories(TRAJ / "online_mind2web_v1", agent="SeeAct"),
        load_trajectory(TRAJ / "online_mind2web_v2" / V2_TASK),
        load_trajectory(AGENTLAB_RUN),
        *load_trajectories(TRAJ / "jsonl"),
    ]
    out = tmp_path / "nested" / "all.jsonl"
    assert write_jsonl(originals, out) == len(originals)
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(not Path(ref).is_absolute() for record in records for ref in record["screenshots"])
    loaded = list(load_trajectories(out, allow_outside=(FIXTURES,)))  # refs point back into the fixtures
    assert len(loaded) == len(originals)
    for before, after in zip(originals, loaded, strict=True):
        for name in (
            "task_id",
            "task",
            "actions",
            "thoughts",
            "agent",
            "benchmark",
            "human_label",
            "reward",
            "final_answer",
        ):
            assert getattr(after, name) == getattr(before, name), name
        assert [s.path.resolve() for s in after.screenshots] == [s.path.resolve() for s in before.screenshots]


def test_folder_of_mixed_formats_auto_detects_each(tmp_path):
    shutil.copytree(TRAJ / "online_mind2web_v1" / V1_TASK, tmp_path / "a_v1")
    shutil.copytree(TRAJ / "online_mind2web_v2" / V2_TASK, tmp_path / "b_v2")
    shutil.copytree(AGENTLAB_RUN, tmp_path / AGENTLAB_RUN.name)
    (tmp_path / ".DS_Store").write_bytes(b"\x00")
    formats = [t.format for t in load_trajectories(tmp_path)]
    assert formats == ["agentlab", "online-mind2web-v1", "online-mind2web-v2"]
    assert detect_format(tmp_path / "b_v2") == "online-mind2web-v2"
    assert detect_format(TRAJ / "jsonl" / "trajectories.jsonl") == "jsonl"
    assert set(FORMATS) == {"online-mind2web-v1", "online-mind2web-v2", "agentlab", "jsonl"}


def test_forced_format_must_match(tmp_path):
    with pytest.raises(
        TrajectoryError, match="format online-mind2web-v1 was requested but the file is online-mind2web-v2"
    ):
        load_trajectory(TRAJ / "online_mind2web_v2" / V2_TASK, fmt="online-mind2web-v1")
    assert (
        load_trajectory(TRAJ / "online_mind2web_v2" / V2_TASK, fmt="online-mind2web").format
        == "online-mind2web-v2"
    )
    with pytest.raises(TrajectoryError, match=r"no screenshot_step_N\.png"):
        load_trajectory(TRAJ / "online_mind2web_v1" / V1_TASK, fmt="agentlab")
    with pytest.raises(ValueError, match="unknown trajectory format"):
        load_trajectories(TRAJ, fmt="webarena")


def test_skip_mode_reports_bad_trajectories_and_goes_on(tmp_path, caplog):
    shutil.copytree(AGENTLAB_RUN, tmp_path / AGENTLAB_RUN.name)
    shutil.copytree(CRASHED_RUN, tmp_path / CRASHED_RUN.name)
    with pytest.raises(TrajectoryError, match="filter-asset-list_27: trajectory has no screenshots"):
        list(load_trajectories(tmp_path))
    errors: list[TrajectoryError] = []
    loaded = list(load_trajectories(tmp_path, on_error="skip", errors=errors))
    assert [t.task_id for t in loaded] == ["workarena.servicenow.knowledge-base-search_5"]
    assert len(errors) == 1 and "Page.wait_for_function: Timeout 30000ms exceeded" in str(errors[0])
    assert CRASHED_RUN.name not in caplog.text  # the caller that collects the errors says them, once
    assert len(list(load_trajectories(tmp_path, on_error="skip"))) == 1
    assert caplog.text.count(CRASHED_RUN.name) == 1  # no one collects it: warned of, once


def test_screenshots_are_decoded_lazily(tmp_path):
    task = tmp_path / "task"
    shutil.copytree(TRAJ / "online_mind2web_v1" / V1_TASK, task)
    trajectory = load_trajectory(task)  # loading reads no pixels...
    (task / "trajectory" / "1_full_screenshot.jpg").write_bytes(b"not a jpeg any more")
    assert trajectory.screenshots[0].load().size == (1282, 713)
    with pytest.raises(TrajectoryError, match=r"1_full_screenshot\.jpg: not an image file"):
        trajectory.screenshots[1].load()  # ...so a file broken after loading fails only when decoded


def test_human_labels_file():
    labels = read_human_labels(LABELS)
    assert labels.agents == [
        "Operator",
        "Agent-E",
        "Browser_Use",
        "Claude_Computer_Use_3.5",
        "Claude_Computer_Use_3.7",
        "SeeAct",
    ]
    assert len(labels.tasks) == 300
    raw = _label_file()
    codes = {"0": "failure", "1": "success", "2": "not_executable"}
    for entry in raw[:50]:
        assert labels.label("Operator", entry["task_id"]) == codes[entry["Operator_human_label"]]
    assert labels.resolve_agent("browser use") == "Browser_Use"
    assert labels.resolve_agent("agent_e") == "Agent-E"


def test_attach_human_labels():
    raw = {entry["task_id"]: entry for entry in _label_file()}
    codes = {"0": "failure", "1": "success", "2": "not_executable"}
    for agent in ("SeeAct", "Browser_Use"):
        labelled = attach_human_labels(load_trajectories(TRAJ / "online_mind2web_v1"), LABELS, agent=agent)
        assert [t.human_label for t in labelled] == [
            codes[raw[t.task_id][f"{agent}_human_label"]] for t in labelled
        ]
        assert all(t.agent == agent for t in labelled)  # an agent-less trajectory takes the column's name
    # each trajectory's own agent picks the column (JSONL names Operator and SeeAct)
    labelled = attach_human_labels(load_trajectories(TRAJ / "jsonl"), read_human_labels(LABELS))
    assert [t.human_label for t in labelled] == ["not_executable", "failure"]
    with pytest.raises(TrajectoryError, match=r"human_label\.json: no human labels for agent 'WebVoyager'"):
        attach_human_labels(load_trajectories(TRAJ / "jsonl"), LABELS, agent="WebVoyager")
    with pytest.raises(TrajectoryError, match="has no agent"):
        attach_human_labels(load_trajectories(TRAJ / "online_mind2web_v1"), LABELS)


def test_trajectory_invariants():
    with pytest.raises(ValueError, match="human_label must be one of"):
        Trajectory(task_id="t", task="x", actions=[], human_label="yes")
    with pytest.raises(ValueError, match="2 thoughts for 1 actions"):
        Trajectory(task_id="t", task="x", actions=["a"], thoughts=["1", "2"])
