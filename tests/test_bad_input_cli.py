"""A bad-input corpus through the real command: every case asserts the exit code, a message naming the
file or field, and that every other trajectory's verdict is intact."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge

REPO = Path(__file__).resolve().parents[1]
REFERENCE = str(REPO / "configs/judge/reference_gpt4o.yaml")
GOOD = ("good-a", "good-b", "good-c")


def png(path: Path, size=(320, 200), mode="RGB") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(len(str(path))).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).convert(mode).save(path)
    return path


def v1(root: Path, name: str, shots: int = 2, **result) -> Path:
    task = root / name
    for i in range(shots):
        png(task / "trajectory" / f"{i}.png")
    data = {
        "task": f"Find the page of {name}.",
        "action_history": [f"CLICK {i}" for i in range(shots)],
        **result,
    }
    (task / "result.json").write_text(json.dumps(data), encoding="utf-8")
    return task


def _corrupt(task: Path) -> str:
    (task / "trajectory" / "1.png").write_bytes(os.urandom(2000))
    return "1.png"


def _truncated(task: Path) -> str:
    data = (task / "trajectory" / "1.png").read_bytes()
    (task / "trajectory" / "1.png").write_bytes(data[: len(data) // 3])
    return "1.png"


def _empty_png(task: Path) -> str:
    (task / "trajectory" / "1.png").write_bytes(b"")
    return "1.png"


def _text_as_png(task: Path) -> str:
    (task / "trajectory" / "1.png").write_text("this is not an image")
    return "1.png"


def _folder_as_png(task: Path) -> str:
    (task / "trajectory" / "1.png").unlink()
    (task / "trajectory" / "1.png").mkdir()
    return "1.png"


def _fifo_png(task: Path) -> str:
    (task / "trajectory" / "1.png").unlink()
    os.mkfifo(task / "trajectory" / "1.png")
    return "1.png"


def _dangling_png(task: Path) -> str:
    (task / "trajectory" / "1.png").unlink()
    (task / "trajectory" / "1.png").symlink_to(task / "gone.png")
    return "1.png"


def _bomb(task: Path) -> str:
    # a header claiming 30000 x 30000 pixels: refused by the image policy, never decoded
    img = Image.new("1", (30000, 30000))
    img.save(task / "trajectory" / "1.png")
    return "1.png"


def _bad_json(task: Path) -> str:
    (task / "result.json").write_text('{"task": "x", "action_history": [', encoding="utf-8")
    return "result.json"


def _json_list(task: Path) -> str:
    (task / "result.json").write_text("[1, 2]", encoding="utf-8")
    return "result.json"


def _task_number(task: Path) -> str:
    (task / "result.json").write_text(json.dumps({"task": 7, "action_history": ["a", "b"]}))
    return "'task'"


def _no_actions(task: Path) -> str:
    (task / "result.json").write_text(json.dumps({"task": "t"}))
    return "'action_history'"


def _actions_not_list(task: Path) -> str:
    (task / "result.json").write_text(json.dumps({"task": "t", "action_history": "click"}))
    return "'action_history'"


def _latin1(task: Path) -> str:
    (task / "result.json").write_bytes('{"task": "caf\xe9", "action_history": []}'.encode("latin-1"))
    return "not UTF-8"


def _fifo_json(task: Path) -> str:
    (task / "result.json").unlink()
    os.mkfifo(task / "result.json")
    return "result.json"


def _no_screenshots(task: Path) -> str:
    shutil.rmtree(task / "trajectory")
    (task / "trajectory").mkdir()
    return "no screenshots"


def _only_ds_store(task: Path) -> str:
    shutil.rmtree(task / "trajectory")
    (task / "trajectory").mkdir()
    (task / "trajectory" / ".DS_Store").write_bytes(b"\0\0")
    return "no screenshots"


def _unknown_schema(task: Path) -> str:
    (task / "result.json").write_text(
        json.dumps({"schema_version": "om2w-v9", "task": "t", "action_history": []})
    )
    return "schema_version"


def _v2_missing_screenshot(task: Path) -> str:
    steps = [
        {"step": 0, "screenshot": "nope.png", "action": "a"},
        {"step": 1, "screenshot": "0.png", "action": "b"},
    ]
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": steps})
    )
    return "nope.png"


def _v2_escape(task: Path) -> str:
    png(task.parent.parent / "secret.png")
    steps = [{"step": 0, "screenshot": "../../secret.png", "action": "a"}]
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": steps})
    )
    return "outside the input"


def _v2_absolute(task: Path) -> str:
    secret = png(task.parent.parent / "abs-secret.png")
    steps = [{"step": 0, "screenshot": str(secret), "action": "a"}]
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": steps})
    )
    return "outside the input"


def _v2_step_not_object(task: Path) -> str:
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": ["click"]})
    )
    return "action_history[0]"


def _v2_duplicate_steps(task: Path) -> str:
    steps = [
        {"step": 0, "screenshot": "0.png", "action": "a"},
        {"step": 0, "screenshot": "1.png", "action": "b"},
    ]
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": steps})
    )
    return "duplicate step"


def _name_without_digits(task: Path) -> str:
    png(task / "trajectory" / "final.png")
    return "final.png"


def _symlink_out(task: Path) -> str:
    outside = png(task.parent.parent / "linked-secret.png")
    (task / "trajectory" / "1.png").unlink()
    (task / "trajectory" / "1.png").symlink_to(outside)
    return "outside the input"


BROKEN = {
    "corrupt screenshot": (_corrupt, "screenshot"),
    "truncated screenshot": (_truncated, "screenshot"),
    "0-byte screenshot": (_empty_png, "trajectory"),
    "text file named .png": (_text_as_png, "screenshot"),
    "folder named .png": (_folder_as_png, "trajectory"),
    "FIFO named .png": (_fifo_png, "trajectory"),
    "dangling symlink": (_dangling_png, "trajectory"),
    "decompression-bomb-sized screenshot": (_bomb, "screenshot"),
    "invalid result.json": (_bad_json, "trajectory"),
    "result.json is a list": (_json_list, "trajectory"),
    "task is a number": (_task_number, "trajectory"),
    "no action_history": (_no_actions, "trajectory"),
    "action_history not a list": (_actions_not_list, "trajectory"),
    "non-UTF-8 result.json": (_latin1, "trajectory"),
    "FIFO result.json": (_fifo_json, "trajectory"),
    "empty trajectory folder": (_no_screenshots, "trajectory"),
    "only .DS_Store": (_only_ds_store, "trajectory"),
    "unknown schema": (_unknown_schema, "trajectory"),
    "v2 missing screenshot": (_v2_missing_screenshot, "trajectory"),
    "v2 `..` escape": (_v2_escape, "trajectory"),
    "v2 absolute path": (_v2_absolute, "trajectory"),
    "v2 step not an object": (_v2_step_not_object, "trajectory"),
    "v2 duplicate step numbers": (_v2_duplicate_steps, "trajectory"),
    "screenshot name without digits": (_name_without_digits, "trajectory"),
    "symlink leading outside": (_symlink_out, "trajectory"),
}


def judge(root: Path, out: Path, *extra: str) -> tuple[int, str]:
    with FakeOpenAI(make_judge()) as server:
        argv = ["judge", str(root), "--config", REFERENCE, "--no-progress", f"out={out}", *extra]
        code = keyshot([*argv, f"judge.base_url={server.base_url}", "judge.api_key_env=null"])
    return code


def good_verdicts_intact(out: Path) -> None:
    verdicts = {v.task_id: v for v in read_verdicts(out / "verdicts.jsonl")}
    for name in GOOD:
        assert verdicts[name].finished and verdicts[name].success is not None, name


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_bad_trajectory_is_named_and_the_others_are_judged(tmp_path, capsys, case):
    make, named = BROKEN[case]
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    bad = v1(root, "bad-one", shots=2)
    needle = make(bad)
    out = tmp_path / "out"
    code = judge(root, out)
    printed = capsys.readouterr().out
    assert code == 0, printed[-2000:]
    good_verdicts_intact(out)
    summary = json.loads((out / "summary.json").read_text())
    verdicts = {v.task_id: v for v in read_verdicts(out / "verdicts.jsonl")}
    if named == "trajectory":  # the trajectory cannot be read: listed with its file and reason, not judged
        messages = summary["run"]["load_error_messages"]
        assert len(messages) == 1 and "bad-one" in messages[0] and needle in messages[0], messages
        assert "bad-one" not in verdicts and "bad-one" in printed
    else:  # one screenshot cannot be read: the trajectory is judged, the screenshot named as unreadable
        errors = verdicts["bad-one"].screenshots[1].error
        assert errors and needle in errors and verdicts["bad-one"].finished, verdicts["bad-one"]


@pytest.mark.parametrize("mode", ["P", "LA", "I;16", "CMYK", "1", "RGBA"])
def test_odd_image_modes_and_unicode_names_are_judged(tmp_path, mode):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    odd = v1(root, "café menü 東京", shots=2)
    target = odd / "trajectory" / "1.png"
    if mode == "I;16":
        Image.fromarray(np.arange(64000, dtype=np.uint16).reshape(200, 320)).save(target)
    else:  # (CMYK goes as a JPEG under a .png name: formats are read from the content)
        Image.open(target).convert(mode).save(target, format="JPEG" if mode == "CMYK" else "PNG")
    out = tmp_path / "out with spaces"
    assert judge(root, out) == 0
    good_verdicts_intact(out)
    v = next(v for v in read_verdicts(out / "verdicts.jsonl") if v.task_id == "café menü 東京")
    assert v.finished and all(s.error is None for s in v.screenshots)


def test_jsonl_bad_lines_are_named_by_line(tmp_path, capsys):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    shot = png(root / "shots" / "a.png")
    lines = [
        '{"task_id": "broken", "task": ',
        json.dumps(
            {"task_id": "typo", "task": "t", "actions": [], "screenshots": ["shots/a.png"], "agnet": "x"}
        ),
        json.dumps({"task_id": "empty", "task": "t", "actions": [], "screenshots": []}),
        json.dumps(
            {"task_id": "fine", "task": "t", "actions": ["a"], "screenshots": [str(shot.relative_to(root))]}
        ),
    ]
    (root / "more.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    assert judge(root, out) == 0
    messages = json.loads((out / "summary.json").read_text())["run"]["load_error_messages"]
    assert any("more.jsonl:1" in m and "invalid JSON" in m for m in messages), messages
    assert any("more.jsonl:2" in m and "agnet" in m for m in messages), messages
    assert any("more.jsonl:3" in m and "no screenshots" in m for m in messages), messages
    assert "fine" in {v.task_id for v in read_verdicts(out / "verdicts.jsonl")}


def test_output_path_that_is_a_file_is_refused(tmp_path, capsys):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    out.write_text("I am a file")
    assert judge(root, out) == 2
    err = capsys.readouterr().err
    assert str(out) in err and err.count("\n") == 1 and out.read_text() == "I am a file"


def test_non_utf8_and_torn_lines_in_an_existing_verdict_file(tmp_path, capsys, caplog):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    assert judge(root, out) == 0
    path = out / "verdicts.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"task_id": "good-d", "task": "x", "succ')  # a run killed mid-line
    v1(root, "good-d")
    assert judge(root, out) == 0
    lines = path.read_bytes().splitlines(keepends=True)
    assert b"".join(lines[:3]) == good and len(lines) == 4 and b'"task_id":"good-d"' in lines[3]
    assert "incomplete" in caplog.text  # the torn tail was cut with a warning, nothing else touched
    good_verdicts_intact(out)
    good = path.read_bytes()
    path.write_bytes(good.replace(b'"task":"Find', b'"task":"\xff\xfeFind', 1))
    capsys.readouterr()
    assert judge(root, out) == 2
    err = capsys.readouterr().err
    assert f"{path}:1" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--config", "/no/such.yaml"], "/no/such.yaml: config file not found"),
        (["concurrency=many"], "concurrency: expected int, got 'many'"),
        (["pipeline.outcome_mode=vote"], "outcome_mode"),
        (["judge.api_key_env=OPENAI KEY"], "api_key_env must name an environment variable"),
        (["judge.base_url=ftp://host/v1"], "base_url must start with http:// or https://"),
        (["pipeline.prompt_variant=mind2web"], "mind2web"),
    ],
)
def test_config_mistakes_are_one_line(tmp_path, capsys, argv, message):
    root = tmp_path / "input"
    v1(root, "good-a")
    code = keyshot(
        ["judge", str(root), "--config", REFERENCE, "--no-progress", f"out={tmp_path / 'out'}", *argv]
    )
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_metrics_with_a_non_utf8_label_file(tmp_path, capsys):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    assert judge(root, out) == 0
    labels = tmp_path / "human_label.json"
    labels.write_bytes(b'[{"task_id": "good-a", "SeeAct_human_label": "1", "note": "\xff"}]')
    capsys.readouterr()
    assert (
        keyshot(
            [
                "metrics",
                str(out / "verdicts.jsonl"),
                "--human-labels",
                str(labels),
                "--out",
                str(tmp_path / "m"),
            ]
        )
        == 2
    )
    assert str(labels) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["tiny-model", "OUT"], "keyshot tiny-model"),
        (["merge-lora", "ADAPTER", "--out", "OUT"], "keyshot merge-lora"),
        (
            [
                "judge",
                "IN",
                "--config",
                "configs/judge/tiny_cpu.yaml",
                "scorer.backend=transformers",
                "scorer.checkpoint=C",
            ],
            "scorer.backend=transformers (the in-process scorer)",
        ),
    ],
)
def test_a_core_install_asked_for_the_training_stack_says_what_to_install(tmp_path, argv, what):
    """`pip install .` has no torch: the jobs that need it say so in one line, exit 2."""
    import subprocess
    import sys

    v1(tmp_path / "IN", "good-a")
    argv = [str(tmp_path / a) if a in ("OUT", "ADAPTER", "IN", "C") else a for a in argv]
    code = "import sys; sys.modules['torch'] = None; from keyshot.infer.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"{what} needs torch" in proc.stderr and "pip install 'keyshot[train]'" in proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
