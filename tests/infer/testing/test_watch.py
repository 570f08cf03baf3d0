"""A process killed at the moment a test or bench means (keyshot.infer.testing.watch): while it runs,
and never once it has ended by itself (the kill would prove nothing)."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from keyshot.infer.testing.watch import kill_when, line_count, wait_until


def writer(path, lines: int, every_s: float) -> subprocess.Popen:
    """A process that appends ``lines`` lines to ``path``, one every ``every_s`` seconds."""
    code = (
        "import sys, time\n"
        f"for i in range({lines}):\n"
        f"    with open({str(path)!r}, 'a') as f: f.write(f'{{i}}\\n')\n"
        f"    time.sleep({every_s})\n"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def test_a_run_is_killed_once_it_has_written_the_lines_asked_for(tmp_path):
    out = tmp_path / "verdicts.jsonl"
    proc = writer(out, 400, 0.05)
    kill_when(proc, lambda: line_count(out) >= 5, "5 lines were written")
    assert proc.returncode == -signal.SIGKILL
    assert 5 <= line_count(out) < 400


def test_a_run_that_ends_before_the_moment_is_refused_not_counted_as_killed(tmp_path):
    """bench/faults.py counted such a run as killed (-9) and measured a resume that never happened."""
    out = tmp_path / "verdicts.jsonl"
    proc = writer(out, 2, 0.0)
    with pytest.raises(
        RuntimeError, match=r"^the process ended \(exit code 0\) before 5 lines were written$"
    ):
        kill_when(proc, lambda: line_count(out) >= 5, "5 lines were written")
    assert line_count(out) == 2


def test_waiting_names_what_did_not_happen_in_time(tmp_path):
    with pytest.raises(RuntimeError, match=r"^not the file was written within 0.2 s$"):
        wait_until((tmp_path / "never").exists, "the file was written", 0.2)
    assert line_count(tmp_path / "never") == 0
