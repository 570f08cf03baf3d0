"""A released record whose embedded screenshot is not an image: `synth import-arb` names it and skips it,
`synth build` builds from the rest and says in one line which split ended up empty, why and what to do
(datasets is never handed a split without rows)."""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path

import yaml

from keyshot.data_synth.labels import LABELS_FILE, read_store
from keyshot.infer.cli import main as keyshot
from tests.support import paths

ARB = paths.FIXTURES / "arb_records"
AGENT = "GenericAgent-gpt-4o-2024-11-20"
RECORD = ARB / "webjudge_7B" / "webarena" / AGENT / "webarena.344.json"  # 2 embedded PNG screenshots
OTHER = "OtherAgent"


def _records(tmp_path: Path, corrupt) -> tuple[Path, Path]:
    """The real record, and a copy of it by another agent whose embedded images went through ``corrupt``."""
    root = tmp_path / "records"
    good = root / "webjudge_7B" / "webarena" / AGENT / RECORD.name
    good.parent.mkdir(parents=True)
    shutil.copy(RECORD, good)
    record = json.loads(RECORD.read_text(encoding="utf-8"))
    record["agent"] = OTHER
    for message in record["chat_messages"]:
        for part in message["content"] if isinstance(message.get("content"), list) else []:
            if part.get("type") == "image_url":
                head, data = part["image_url"]["url"].split(",", 1)
                part["image_url"]["url"] = (
                    head + "," + base64.b64encode(corrupt(base64.b64decode(data))).decode()
                )
    bad = root / "webjudge_7B" / "webarena" / OTHER / RECORD.name
    bad.parent.mkdir(parents=True)
    bad.write_text(json.dumps(record), encoding="utf-8")
    return root, bad


def _build_config(tmp_path: Path) -> Path:
    path = tmp_path / "build.yaml"
    path.write_text(yaml.safe_dump({"splits": {"agents": {"train": [AGENT], "validation": [OTHER]}}}))
    return path


def _build(tmp_path: Path, run: Path, capsys) -> list[str]:
    assert keyshot(["synth", "build", str(run), "--config", str(_build_config(tmp_path))]) == 0
    return capsys.readouterr().out.splitlines()


def test_a_record_whose_screenshot_is_not_an_image_is_named_and_the_rest_built(tmp_path, capsys):
    from datasets import load_from_disk

    for name, corrupt in {
        "truncated": lambda b: b[: len(b) // 3],
        "not-an-image": lambda b: b"\0" * len(b),
    }.items():
        records, bad = _records(tmp_path / name, corrupt)
        run = tmp_path / name / "run"
        assert keyshot(["synth", "import-arb", str(records), "--run", str(run)]) == 0
        out = capsys.readouterr().out
        assert "records read: 2 (1 skipped with errors)" in out
        assert f"error: {bad}: embedded image 1 in chat_messages: " in out
        assert ("truncated" if name == "truncated" else "not an image") in out
        assert {t.agent for t in read_store(run / LABELS_FILE).trajectories.values()} == {AGENT}

        printed = _build(tmp_path / name, run, capsys)
        empty = [line for line in printed if line.startswith("split ")]
        assert empty == [
            f"split validation is empty: no trajectory of its agents ({OTHER}) has a row; add their "
            "trajectories or list other agents under splits.agents.validation"
        ]
        assert list(load_from_disk(str(run / "dataset"))) == ["train"]


def test_a_run_holding_an_unreadable_screenshot_builds_without_its_split(tmp_path, capsys):
    """A run folder imported before the check (its stored copy of a screenshot is corrupt): the split
    whose rows all have an unreadable screenshot is left out, in one line, not handed to datasets."""
    from datasets import load_from_disk

    records, _ = _records(tmp_path, lambda b: b)
    run = tmp_path / "run"
    assert keyshot(["synth", "import-arb", str(records), "--run", str(run)]) == 0
    stored = read_store(run / LABELS_FILE).trajectories[f"webarena/{OTHER}/webarena.344"].screenshots
    for path in filter(None, stored):
        Path(path).write_bytes(Path(path).read_bytes()[:2000])
    capsys.readouterr()

    printed = _build(tmp_path, run, capsys)
    assert [line for line in printed if line.startswith("split ")] == [
        "split validation is empty: all 2 of its rows have an unreadable screenshot (listed above); "
        "replace those screenshots and build again"
    ]
    ds = load_from_disk(str(run / "dataset"))
    assert list(ds) == ["train"] and [r["count"] for r in ds["train"]] == [2]
