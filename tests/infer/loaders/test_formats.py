"""keyshot.infer.loaders.formats: the folder formats are a registry their modules fill. A format added
there (here a made-up one, "toy-folder": a task.txt and PNG screenshots) is detected, loaded, walked to in
a folder of folders and named in the lines that list the formats, with nothing else changed."""

from __future__ import annotations

import shutil

import pytest
from PIL import Image

from keyshot.infer.common.registry import DuplicateName
from keyshot.infer.loaders import FORMATS, detect_format, load_trajectories, load_trajectory
from keyshot.infer.loaders.common import screenshot_file
from keyshot.infer.loaders.formats import FOLDER_FORMATS, FolderFormat, folder_formats, register_folder_format
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.testing.images import encoded
from tests.support import paths

TOY = "toy-folder"
V1_TASK = "fb7b4f784cfde003e2548fdf4e8d6b4f"  # an Online-Mind2Web v1 task folder of the fixtures


def _load_toy(folder, name=None, *, agent=None, benchmark=None, scope=None):
    shots = sorted(folder.glob("*.png"))
    return Trajectory(
        task_id=folder.name,
        task=(folder / "task.txt").read_text().strip(),
        actions=[f"step {i}" for i in range(len(shots) - 1)],
        screenshots=[screenshot_file(p, i, folder, scope=scope) for i, p in enumerate(shots)],
        agent=agent,
        benchmark=benchmark or "toy",
        source=folder,
        format=TOY,
    )


@pytest.fixture
def toy_format():
    fmt = register_folder_format(
        FolderFormat(
            names=(TOY,),
            label="Toy",
            expects="task.txt",
            holds=lambda folder: (folder / "task.txt").is_file(),
            detect=lambda folder: TOY if (folder / "task.txt").is_file() else None,
            load=_load_toy,
        )
    )
    try:
        yield fmt
    finally:
        FOLDER_FORMATS.remove(TOY)


def toy_folder(path, task="Open the toy page"):
    path.mkdir(parents=True)
    (path / "task.txt").write_text(task)
    for i in range(2):
        (path / f"{i}.png").write_bytes(encoded(Image.new("RGB", (64, 48))))
    return path


def test_the_shipped_formats_are_registered_by_their_modules():
    assert set(FORMATS) == {"online-mind2web-v1", "online-mind2web-v2", "agentlab", "jsonl"}
    assert [f.label for f in folder_formats()] == ["AgentLab", "Online-Mind2Web"]
    assert FOLDER_FORMATS.get("online-mind2web") is FOLDER_FORMATS.get("online-mind2web-v2")


def test_a_registered_format_is_detected_loaded_and_walked_to(tmp_path, toy_format):
    one = toy_folder(tmp_path / "runs" / "agent-a" / "task-1")
    assert detect_format(one) == TOY
    trajectory = load_trajectory(one)
    assert (trajectory.task, trajectory.format, trajectory.num_screenshots) == ("Open the toy page", TOY, 2)
    # beside an Online-Mind2Web task, in a folder of agents' folders: each read with its own format
    shutil.copytree(
        paths.FIXTURES / "trajectories" / "online_mind2web_v1" / V1_TASK,
        tmp_path / "runs" / "agent-b" / V1_TASK,
    )
    found = {t.format: t.agent for t in load_trajectories(tmp_path / "runs")}
    assert found == {TOY: "agent-a", "online-mind2web-v1": "agent-b"}
    assert load_trajectory(one, fmt=TOY).format == TOY  # forced by name


def test_a_folder_of_no_format_is_named_with_every_registered_one(tmp_path, toy_format):
    (tmp_path / "empty").mkdir()
    with pytest.raises(
        TrajectoryError,
        match=r"expected experiment_analysis\.md .* \(AgentLab\) or "
        r"result\.json \(Online-Mind2Web\) or task\.txt \(Toy\)",
    ):
        detect_format(tmp_path / "empty")
    with pytest.raises(ValueError) as raised:
        list(load_trajectories(tmp_path, fmt="toy"))
    assert str(raised.value) == (
        "unknown trajectory format 'toy' (format); known: auto, agentlab, online-mind2web-v1, "
        "online-mind2web-v2, online-mind2web, toy-folder, jsonl"
    )


def test_a_format_name_taken_is_refused(toy_format):
    with pytest.raises(DuplicateName, match="trajectory format 'toy-folder' is registered already"):
        register_folder_format(toy_format)
