"""A checkpoint folder is replaced so that it is never missing (keyshot.infer.common.fileio.replace_folder,
the one implementation train/checkpointing.py and data_synth/dataset.py use): the writer, a real process,
is killed with SIGKILL at each step of the replacement (an audit hook of the driver sees every rename and
removal before it happens), and afterwards the folder is the old one or the new one, whole, and the next
run writes its own. The old writer removed the old folder before moving the new one in: killed between
the two, it left neither."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from keyshot.train.checkpointing import STATE_FILE, CheckpointManager

PARTS = 8
#: The writer: ``_swapped_in`` (how the final model and adapter folders are written) writes PARTS files of
#: VERSION into TARGET, and kills itself at the KILL_AT-th rename or removal of the replacement (-1: never).
#: MODE ``aside`` runs it as on a system that cannot exchange two names in one step.
WRITER = f"""
import os, signal, sys
from pathlib import Path
from keyshot.infer.common import fileio
from keyshot.train.checkpointing import _swapped_in

mode, target, version, kill_at = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
if mode == "aside":
    fileio._exchange = lambda a, b: False  # a system without renameat2's RENAME_EXCHANGE
armed, seen = False, 0

def kill_in_the_window(event, args):
    global seen
    if armed and event in ("os.rename", "shutil.rmtree") and str(target.parent) in str(args[0]):
        if seen == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        seen += 1

sys.addaudithook(kill_in_the_window)
with _swapped_in(target) as tmp:
    for i in range({PARTS}):
        (tmp / f"part-{{i}}").write_text(version)
    armed = True
print(seen)
"""


def write(mode: str, target: Path, version: str, kill_at: int = -1) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", WRITER, mode, str(target), version, str(kill_at)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def whole(folder: Path) -> str | None:
    """The one version every part of ``folder`` holds; None when it is missing or mixed."""
    found = {p.read_text() for p in folder.glob("part-*")} if folder.is_dir() else set()
    count = len(list(folder.glob("part-*"))) if folder.is_dir() else 0
    return found.pop() if len(found) == 1 and count == PARTS else None


@pytest.mark.parametrize("mode", ["exchange", "aside"])
def test_a_writer_killed_at_any_step_leaves_the_old_or_the_new_folder_and_the_next_run_writes(tmp_path, mode):
    target = tmp_path / "run" / "final"
    steps, left_aside = 0, 0
    for kill_at in range(10):
        done = write(mode, target, "old")
        assert done.returncode == 0 and whole(target) == "old", done.stderr[-2000:]
        killed = write(mode, target, "new", kill_at)
        if killed.returncode == 0:  # no step left to kill at: the replacement ran whole
            steps = int(killed.stdout)
            assert whole(target) == "new"
            break
        assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
        if mode == "exchange":  # the two are exchanged in one step: the folder is never missing
            assert whole(target) in ("old", "new"), (
                f"killed at step {kill_at}: {sorted(target.parent.iterdir())}"
            )
        else:  # killed between the renames: the old folder is whole, aside, until the next run puts it back
            from keyshot.infer.common.fileio import REPLACED

            left_aside += not target.exists()
            assert whole(target) in ("old", "new") or whole(target.with_name(f".final{REPLACED}")) == "old"
        again = write(mode, target, "next")  # the next run starts from what the killed one left
        assert again.returncode == 0 and whole(target) == "next", again.stderr[-2000:]
        assert sorted(p.name for p in target.parent.iterdir()) == ["final"]  # nothing left aside
    assert steps == kill_at >= 2  # every step of the replacement was a kill point
    assert left_aside == (1 if mode == "aside" else 0)


class Saver:
    """What CheckpointManager.save asks of accelerate's Accelerator in one process (the real save_state
    writes the model's and optimizer's files; here one file stands for them)."""

    is_main_process = True

    def __init__(self, content: str):
        self.content = content

    def wait_for_everyone(self) -> None:
        pass

    def save_state(self, folder: str) -> None:
        (Path(folder) / "model.safetensors").write_text(self.content)


#: Saves step 4 of RUN holding CONTENT; with ``kill``, killed where the new folder is about to go in (on a
#: system that renames the old one aside first: the window where the step folder is missing).
SAVER = f"""
import os, signal, sys
from pathlib import Path
from keyshot.infer.common import fileio
from keyshot.train.checkpointing import CheckpointManager, TrainerState
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_checkpoint_replace import Saver

run, content, kill = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "kill"
fileio._exchange = lambda a, b: False
final = run / "checkpoints" / "step_00000004"

def kill_before_the_new_folder_goes_in(event, args):
    if kill and event == "os.rename" and str(args[1]) == str(final):
        os.kill(os.getpid(), signal.SIGKILL)

sys.addaudithook(kill_before_the_new_folder_goes_in)
CheckpointManager(run, keep_last=2).save(Saver(content), TrainerState(step=4, samples_seen=len(content)))
"""


def save(run: Path, content: str, kill: bool) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", SAVER, str(run), content, "kill" if kill else "run"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def test_a_step_saved_again_and_killed_in_the_window_is_resumed_from(tmp_path):
    """Step 4 saved a second time (a resumed run saves again the step it resumed from) by a writer killed
    when the new folder is about to go in: the next run finds step 4 and reads its state, the old one,
    whole. The old writer had removed the old folder first: nothing to resume from."""
    first = save(tmp_path, "old", kill=False)
    assert first.returncode == 0, first.stderr[-2000:]
    killed = save(tmp_path, "newer", kill=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    manager = CheckpointManager(tmp_path, keep_last=2)
    latest = manager.latest()
    assert latest is not None and latest.name == "step_00000004"
    assert json.loads((latest / STATE_FILE).read_text())["samples_seen"] == len("old")
    assert (latest / "model.safetensors").read_text() == "old"
    again = save(tmp_path, "newer", kill=False)  # the next run saves it whole
    assert again.returncode == 0 and (latest / "model.safetensors").read_text() == "newer"
    assert sorted(p.name for p in manager.root.iterdir()) == ["step_00000004"]
