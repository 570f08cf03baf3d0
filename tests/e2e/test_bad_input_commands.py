"""A bad-input corpus through the real command: every case asserts the exit code, a message naming the
file or field, and that every other trajectory's verdict is intact."""

from __future__ import annotations

import codecs
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from keyshot.infer.cli import main as keyshot
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.images import encoded, noise
from tests.support import paths

REPO = paths.REPO
REFERENCE = str(REPO / "configs/judge/reference_gpt4o.yaml")
GOOD = ("good-a", "good-b", "good-c")


def png(path: Path, size=(320, 200)) -> Path:
    """A PNG file of random pixels at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encoded(noise(*size, seed=len(str(path)))))
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


def _v2_result(task: Path, steps: list) -> None:
    """``task``'s result.json in Online-Mind2Web's v2 schema, ``steps`` its action history."""
    (task / "result.json").write_text(
        json.dumps({"schema_version": "online-mind2web-v2", "task": "t", "action_history": steps})
    )


def _v2_missing_screenshot(task: Path) -> str:
    steps = [
        {"step": 0, "screenshot": "nope.png", "action": "a"},
        {"step": 1, "screenshot": "0.png", "action": "b"},
    ]
    _v2_result(task, steps)
    return "nope.png"


def _v2_escape(task: Path) -> str:
    png(task.parent.parent / "secret.png")
    steps = [{"step": 0, "screenshot": "../../secret.png", "action": "a"}]
    _v2_result(task, steps)
    return "outside the input"


def _v2_absolute(task: Path) -> str:
    secret = png(task.parent.parent / "abs-secret.png")
    steps = [{"step": 0, "screenshot": str(secret), "action": "a"}]
    _v2_result(task, steps)
    return "outside the input"


def _v2_step_not_object(task: Path) -> str:
    _v2_result(task, ["click"])
    return "action_history[0]"


def _v2_duplicate_steps(task: Path) -> str:
    steps = [
        {"step": 0, "screenshot": "0.png", "action": "a"},
        {"step": 0, "screenshot": "1.png", "action": "b"},
    ]
    _v2_result(task, steps)
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


# ----------------------------------------------------------------------------- through the console script
def judge_cli(inputs: list[Path], out: Path) -> tuple[int, str, str]:
    """``python -m keyshot.infer.cli judge`` in a subprocess, against the fake judge: (exit, stdout, stderr)."""
    with FakeOpenAI(make_judge()) as server:
        argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", *map(str, inputs), "--config", REFERENCE]
        argv += ["--no-progress", f"out={out}", f"judge.base_url={server.base_url}", "judge.api_key_env=null"]
        done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr


def jsonl_record(root: Path, task_id: str) -> str:
    shot = png(root / "shots" / f"{task_id}.png")
    return json.dumps(
        {"task_id": task_id, "task": "t", "actions": ["a"], "screenshots": [str(shot.relative_to(root))]}
    )


def _zip_beside(root: Path) -> tuple[str, str]:
    (root / "online_mind2web_part2.zip").write_bytes(b"PK\x03\x04" + os.urandom(64))
    return "online_mind2web_part2.zip", "unpack it"


def _loose_result_json(root: Path) -> tuple[str, str]:
    shutil.copy(root / "good-a" / "result.json", root / "result.json")
    return "result.json", "outside a task folder"


def _dangling_jsonl(root: Path) -> tuple[str, str]:
    (root / "more.jsonl").symlink_to(root / "moved-away.jsonl")
    return "more.jsonl", "dangling symlink"


def _looping_jsonl(root: Path) -> tuple[str, str]:
    (root / "more.jsonl").symlink_to("more.jsonl")
    return "more.jsonl", "symlink loop"


def _fifo_jsonl(root: Path) -> tuple[str, str]:
    os.mkfifo(root / "more.jsonl")
    return "more.jsonl", "not a regular file"


def _empty_jsonl(root: Path) -> tuple[str, str]:
    (root / "more.jsonl").write_text("\n")
    return "more.jsonl", "empty JSONL file"


def _looping_screenshot(root: Path) -> tuple[str, str]:
    shot = v1(root, "bad-one") / "trajectory" / "1.png"
    shot.unlink()
    shot.symlink_to("1.png")
    return "bad-one/trajectory/1.png", "symlink loop"


def _deeply_nested_result(root: Path) -> tuple[str, str]:
    task = v1(root, "bad-one")
    (task / "result.json").write_text("[" * 100_000 + "]" * 100_000)
    return "bad-one/result.json", "nested too deeply"


def _non_utf8_jsonl_line(root: Path) -> tuple[str, str]:
    lines = [
        jsonl_record(root, "line-1").encode(),
        b'{"task_id": "caf\xe9"}',
        jsonl_record(root, "line-3").encode(),
    ]
    (root / "more.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return "more.jsonl:2", "not UTF-8"


UNJUDGED = {
    "zip file beside task folders": _zip_beside,
    "loose result.json at the input root": _loose_result_json,
    "dangling symlink named .jsonl": _dangling_jsonl,
    "symlink loop named .jsonl": _looping_jsonl,
    "FIFO named .jsonl": _fifo_jsonl,
    "empty .jsonl": _empty_jsonl,
    "screenshot that is a symlink loop": _looping_screenshot,
    "result.json nested 100,000 levels deep": _deeply_nested_result,
    "JSONL line that is not UTF-8": _non_utf8_jsonl_line,
}


#: The cases above whose entry holds no trajectory at all: counted apart from trajectories that failed to load.
NOT_TRAJECTORIES = {"zip file beside task folders", "loose result.json at the input root", "empty .jsonl"}


@pytest.mark.parametrize("case", list(UNJUDGED))
def test_every_entry_not_judged_is_listed_with_its_reason(tmp_path, case):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    where, reason = UNJUDGED[case](root)
    out = tmp_path / "out"
    code, stdout, stderr = judge_cli([root], out)
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    good_verdicts_intact(out)
    run = json.loads((out / "summary.json").read_text())["run"]
    apart = case in NOT_TRAJECTORIES
    messages = run["not_trajectory_messages" if apart else "load_error_messages"]
    assert run["load_error_messages" if apart else "not_trajectory_messages"] == []
    listed = [m for m in messages if m.startswith(f"{root / where}:")]
    assert len(messages) == 1 and len(listed) == 1 and reason in listed[0], messages
    assert str(root / where) in stdout  # the printed summary lists it too
    judged = {v.task_id for v in read_verdicts(out / "verdicts.jsonl")}
    assert judged >= set(GOOD) and "bad-one" not in judged
    if case == "JSONL line that is not UTF-8":  # the good lines of that file are judged
        assert {"line-1", "line-3"} <= judged


def test_a_byte_order_mark_does_not_hide_the_first_jsonl_record(tmp_path):
    root = tmp_path / "input"
    lines = [jsonl_record(root, "first"), jsonl_record(root, "second")]
    (root / "bom.jsonl").write_bytes(codecs.BOM_UTF8 + "\n".join(lines).encode() + b"\n")
    out = tmp_path / "out"
    code, _, stderr = judge_cli([root / "bom.jsonl"], out)
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    assert {v.task_id for v in read_verdicts(out / "verdicts.jsonl")} == {"first", "second"}
    assert json.loads((out / "summary.json").read_text())["run"]["load_errors"] == 0


def test_a_fifo_as_the_input_path_is_one_line(tmp_path):
    fifo = tmp_path / "trajectories"
    os.mkfifo(fifo)
    code, _, stderr = judge_cli([fifo], tmp_path / "out")
    assert code == 2 and "Traceback" not in stderr and stderr.count("\n") == 1, stderr[-3000:]
    assert f"{fifo}: not a file or folder (a FIFO" in stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_where_the_summary_goes_is_named_and_the_verdicts_kept(tmp_path):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    (out / "summary.json").mkdir(parents=True)
    code, _, stderr = judge_cli([root], out)
    assert code == 2 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert (
        f"{out / 'summary.json'}: is a folder where keyshot writes a file" in last and "move it away" in last
    )
    good_verdicts_intact(out)  # judged and kept: a re-run once the folder is moved resumes for free
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_a_folder_where_the_verdicts_go_is_named_in_one_line(tmp_path):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    (out / "verdicts.jsonl" / "kept.txt").parent.mkdir(parents=True)
    (out / "verdicts.jsonl" / "kept.txt").write_text("mine")
    code, _, stderr = judge_cli([root], out)
    assert code == 2 and "Traceback" not in stderr, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert (
        f"{out / 'verdicts.jsonl'}: is a folder where keyshot writes a file" in last
        and "move it away" in last
    )
    assert (out / "verdicts.jsonl" / "kept.txt").read_text() == "mine"  # nothing of the user's touched
    (out / "verdicts.jsonl" / "kept.txt").unlink()
    (out / "verdicts.jsonl").rmdir()
    code, _, stderr = judge_cli([root], out)  # moved away: the same command judges everything
    assert code == 0, stderr[-3000:]
    good_verdicts_intact(out)


def test_a_config_that_is_a_folder_or_not_utf8_is_one_line_naming_it(tmp_path):
    root = tmp_path / "input"
    v1(root, "good-a")
    latin1 = tmp_path / "judge.yaml"
    latin1.write_bytes(Path(REFERENCE).read_bytes() + "# réglages\n".encode("latin-1"))
    for config, problem in ((tmp_path, "a folder, not a config file"), (latin1, "not UTF-8 text")):
        argv = [sys.executable, "-m", "keyshot.infer.cli", "judge", str(root), "--config", str(config)]
        done = subprocess.run(
            [*argv, f"out={tmp_path / 'out'}"], cwd=REPO, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert done.stderr.count("\n") == 1 and f"{config}: {problem}" in done.stderr, done.stderr
        assert not (tmp_path / "out").exists()


def scorer_folder(folder: Path, **fields) -> Path:
    """A model folder whose keyshot.json holds ``fields`` over a well-formed scorer checkpoint's."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    meta = {
        "prompt_variant": "online_mind2web",
        "prompt_version": load_prompt_set().version,
        "min_pixels": 3136,
        "max_pixels": 12544,
        **fields,
    }
    (folder / "keyshot.json").write_text(json.dumps(meta))
    return folder


def serve_dry_run(model: Path) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "keyshot.infer.cli", "serve", "--dry-run", f"model={model}", "device=cpu"]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_serve_refuses_checkpoint_metadata_of_the_wrong_type_or_encoding(tmp_path):
    """keyshot.json's pixel bounds as strings would go to vLLM as they are: refused naming file and field."""
    strings = scorer_folder(tmp_path / "strings", min_pixels="3136", max_pixels="12544")
    done = serve_dry_run(strings)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1, done.stderr
    assert f"{strings / 'keyshot.json'}: field 'min_pixels' must be an integer, got '3136'" in done.stderr
    latin1 = scorer_folder(tmp_path / "latin1")
    meta = {**json.loads((latin1 / "keyshot.json").read_text()), "base_model": "café"}
    (latin1 / "keyshot.json").write_bytes(json.dumps(meta, ensure_ascii=False).encode("latin-1"))
    done = serve_dry_run(latin1)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and f"{latin1 / 'keyshot.json'}: not UTF-8 text" in done.stderr
    good = serve_dry_run(scorer_folder(tmp_path / "good"))
    assert good.returncode == 0, good.stderr[-3000:]
    assert json.loads(good.stdout.split("--mm-processor-kwargs ")[1].split("' ")[0].strip("'")) == {
        "min_pixels": 3136,
        "max_pixels": 12544,
    }


def test_an_unreadable_screenshot_is_said_on_the_terminal_and_in_summary_md(tmp_path):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    corrupt = v1(root, "bad-one") / "trajectory" / "1.png"
    corrupt.write_bytes(corrupt.read_bytes()[:200])  # a truncated PNG among good ones
    out = tmp_path / "out"
    code, stdout, stderr = judge_cli([root], out)
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    said = [line for line in stderr.splitlines() if "could not be read as images" in line]
    assert len(said) == 1 and said[0].startswith("keyshot judge: 1 screenshot(s)") and str(corrupt) in said[0]
    markdown = (out / "summary.md").read_text()
    section = markdown.split("## Screenshots that could not be read (1;")[1]
    assert f"- {corrupt}: " in section and markdown in stdout
    good_verdicts_intact(out)
    bad = next(v for v in read_verdicts(out / "verdicts.jsonl") if v.task_id == "bad-one")
    assert bad.finished and bad.screenshots[0].error is None and bad.screenshots[1].image_problem


def test_entries_that_hold_no_trajectory_are_counted_apart_from_trajectories_not_loaded(tmp_path):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    (root / "README.md").write_text("# my agent's runs")
    (root / "part2.zip").write_bytes(b"PK\x03\x04" + os.urandom(64))
    broken = v1(root, "bad-one")
    _bad_json(broken)
    out = tmp_path / "out"
    code, stdout, stderr = judge_cli([root], out)
    assert code == 0 and "Traceback" not in stderr, stderr[-3000:]
    good_verdicts_intact(out)
    run = json.loads((out / "summary.json").read_text())["run"]
    assert run["not_trajectories"] == 2 and run["load_errors"] == 1
    assert [m.split(":")[0] for m in run["not_trajectory_messages"]] == [
        str(root / "README.md"),
        str(root / "part2.zip"),
    ]
    assert run["load_error_messages"][0].startswith(f"{broken / 'result.json'}:")
    markdown = (out / "summary.md").read_text()
    assert "1 not loaded, 2 not a trajectory" in markdown and markdown in stdout
    apart = markdown.split("## Not a trajectory (not judged)\n")[1].split("##")[0]
    assert str(root / "README.md") in apart and str(root / "part2.zip") in apart and "bad-one" not in apart
    failed = markdown.split("## Trajectories that could not be read (not judged)\n")[1].split("##")[0]
    assert "bad-one" in failed and "README.md" not in failed and "part2.zip" not in failed


def test_serve_scorer_refuses_a_scorer_max_tokens_below_the_trained_answers_before_vllm(tmp_path):
    """An explicit scorer.max_tokens below the answers the checkpoint was trained on would cut every one:
    refused, dry run or not, before a server is started or a call is paid."""
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    checkpoint = scorer_folder(tmp_path / "ckpt", answer_tokens={"max": 150, "p99": 120, "rows": 700})
    out = tmp_path / "out"
    tiny = str(REPO / "configs/judge/tiny_cpu.yaml")
    with FakeOpenAI(make_judge()) as server:
        base = [sys.executable, "-m", "keyshot.infer.cli", "judge", str(root), "--config", tiny]
        base += ["--serve-scorer", str(checkpoint), f"judge.base_url={server.base_url}", f"out={out}"]
        for extra in ([], ["--dry-run"]):
            done = subprocess.run(
                [*base, "scorer.max_tokens=100", *extra],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
            assert done.stderr.count("\n") == 1, done.stderr
            assert "scorer.max_tokens=100 is below the longest answer" in done.stderr
            assert "(150 tokens" in done.stderr and str(checkpoint) in done.stderr
            assert not (out / "vllm.log").exists() and not (out / "verdicts.jsonl").exists()
        done = subprocess.run(
            [*base, "scorer.max_tokens=160", "--dry-run"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 0 and "3 to judge" in done.stdout, done.stderr[-3000:]


def test_metrics_out_naming_a_file_is_one_line(tmp_path):
    root = tmp_path / "input"
    for name in GOOD:
        v1(root, name)
    out = tmp_path / "out"
    assert judge(root, out) == 0
    target = tmp_path / "metrics.txt"
    target.write_text("notes")
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({name: 1 for name in GOOD}))
    argv = [
        sys.executable,
        "-m",
        "keyshot.infer.cli",
        "metrics",
        str(out / "verdicts.jsonl"),
        "--human-labels",
        str(labels),
        "--out",
        str(target),
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and f"{target}: is a file where keyshot needs a folder" in errors[0], done.stderr
    assert target.read_text() == "notes"


def test_one_task_in_two_agents_folders_that_nothing_tells_apart_is_refused_naming_both(tmp_path):
    """Two Online-Mind2Web agent folders passed one by one: their tasks have no agent, so a task id in
    both would be judged once and the other agent's trajectory lost. The run refuses, naming both."""
    seeact, browser_use = tmp_path / "SeeAct", tmp_path / "Browser_Use"
    v1(seeact, "task-1")
    v1(browser_use, "task-1")
    out = tmp_path / "out"
    code, _, err = judge_cli([seeact, browser_use], out)
    assert code == 2 and "Traceback" not in err, err[-3000:]
    line = err.strip()
    assert "\n" not in line
    assert str(seeact / "task-1") in line and str(browser_use / "task-1") in line
    assert "no agent name tells the two apart" in line and "--agent NAME" in line
    assert not (out / "verdicts.jsonl").exists()
    # passed as one parent folder, each folder's name names its agent: both are judged
    code, _, err = judge_cli([tmp_path], tmp_path / "both")
    assert code == 0, err[-3000:]
    assert {(v.task_id, v.agent) for v in read_verdicts(tmp_path / "both" / "verdicts.jsonl")} == {
        ("task-1", "SeeAct"),
        ("task-1", "Browser_Use"),
    }


def test_training_on_a_model_name_that_is_no_folder_and_not_reachable_says_how_to_point_at_a_copy(tmp_path):
    """An offline cluster node and a hub id: one line naming what was tried and how to give a local copy,
    with --check and in a run, before any weight is loaded."""
    from keyshot.infer.testing.scorer_data import build_scorer_dataset

    dataset = build_scorer_dataset(tmp_path / "ds", n_train=4, n_val=2)
    argv = [sys.executable, "-m", "keyshot.train.sft", "--config", str(REPO / "configs/train/tiny_cpu.yaml")]
    argv += ["model.name_or_path=nonexistent/model", f"data.path={dataset}", f"run_dir={tmp_path / 'run'}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    for extra in (["--check"], []):
        done = subprocess.run(
            [*argv, *extra], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        errors = [line for line in done.stderr.splitlines() if "keyshot sft: error: " in line]
        assert len(errors) == 1, done.stderr[-3000:]
        assert "nonexistent/model: model.name_or_path is no local folder" in errors[0]
        assert "model.name_or_path=/path/to/folder" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]
    assert [p.name for p in (tmp_path / "run").iterdir()] == ["config.yaml"]  # the resolved config only
