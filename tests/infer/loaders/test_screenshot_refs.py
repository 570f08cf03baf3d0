"""A screenshot given as text is read by one rule (:func:`keyshot.infer.loaders.common.screenshot_from_ref`):
a trajectory file's reference, a reward rollout's screenshot, an episode's step and the fake server's
image URL read the same string the same way: the same file, the same bytes, or refused by all."""

from __future__ import annotations

import base64
from pathlib import Path

from PIL import Image

from keyshot.infer.loaders.common import screenshot_from_ref
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.testing.fake_requests import ResponderError, decode_data_url
from keyshot.infer.testing.images import encoded, png
from keyshot.reward.episode import Episode
from keyshot.reward.rollouts import RolloutError, from_dict

SMALL = png(2, 2, (200, 40, 40))  # base64 far shorter than 256 characters
LARGE = png(300, 200, (200, 40, 40))
SMALL_JPEG = encoded(
    Image.new("RGB", (8, 8), (40, 200, 40)), "JPEG"
)  # base64 "/9j/...": a path to a naive reader


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def cases(folder: Path) -> dict[str, tuple[str, object]]:
    """name -> (the text, what every reader makes of it: a file's path, bytes, or None: refused)."""
    shot = folder / "shot.png"
    shot.write_bytes(SMALL)
    (folder / "c2hvdA==").write_bytes(SMALL)  # a file whose name is valid base64 ("shot")
    wrapped = b64(LARGE)
    wrapped = "\n".join(wrapped[i : i + 76] for i in range(0, len(wrapped), 76))
    return {
        "a file": ("shot.png", shot),
        "an absolute file": (str(shot), shot),
        "a file named like base64": ("c2hvdA==", folder / "c2hvdA=="),
        "short base64": (b64(SMALL), SMALL),
        "short base64 of a JPEG": (b64(SMALL_JPEG), SMALL_JPEG),
        "long base64": (b64(LARGE), LARGE),
        "base64 in lines of 76": (wrapped, LARGE),
        "a data URL": ("data:image/png;base64," + b64(SMALL), SMALL),
        "a data URL with parameters": ("data:image/png;charset=utf-8;base64," + b64(SMALL), SMALL),
        "a missing file": ("missing.png", None),
        "a missing file in a folder": ("step/0001.png", None),
        "a word of base64's alphabet": ("screenshot1", None),
        "a data URL without base64": ("data:image/png," + b64(SMALL), None),
        "a remote URL": ("https://example.com/shot.png", None),
    }


def by_loader(text: str, folder: Path) -> object:
    try:
        shot = screenshot_from_ref(text, 0, [folder], folder / "t.jsonl")
    except TrajectoryError:
        return None
    return shot.data if shot.data is not None else shot.path


def by_rollout(text: str, folder: Path) -> object:
    try:
        [shot] = from_dict({"task": "t", "screenshots": [text]}, "rollout 0", allow_root=folder).screenshots
    except RolloutError:
        return None
    return shot.data if shot.data is not None else shot.path


def by_episode(text: str, folder: Path) -> object:
    episode = Episode("t", keep_dir=folder / "kept")
    episode.add_step(text)
    if episode.problems or not episode.screenshots:
        return None
    return episode.screenshots[0].read_bytes()


def test_every_reader_reads_a_screenshot_string_the_same_way(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the reward's relative paths are the current folder's
    disagreements = []
    for name, (text, expected) in cases(tmp_path).items():
        loader, rollout = by_loader(text, tmp_path), by_rollout(text, tmp_path)
        episode = by_episode(text, tmp_path)
        expected_bytes = expected.read_bytes() if isinstance(expected, Path) else expected
        if loader != expected or rollout != expected or episode != expected_bytes:
            disagreements.append((name, loader is None, rollout is None, episode is None))
        if text.startswith("data:"):
            try:
                fake = decode_data_url(text)
            except ResponderError:
                fake = None
            if fake != expected:
                disagreements.append((name, "fake server", fake is None))
    assert disagreements == []
