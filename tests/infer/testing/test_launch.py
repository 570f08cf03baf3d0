"""The one reader of a process's output lines and the servers started through it
(keyshot.infer.testing.launch): each line handed over once, in order, even when several come in one
write; a process that ends or falls silent is named with what it said; ``keyshot reward serve`` on a port
the kernel chose, stopped at the end, or refused with its own line."""

from __future__ import annotations

import subprocess
import sys
import urllib.request

import pytest

from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from keyshot.infer.testing.launch import OutputLines, start_reward_serve
from tests.support.reward import write_config


def python(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_two_lines_written_at_once_are_each_handed_over():
    """A driver that answers two jobs in one write: the second answer is not lost in the reader's buffer
    (a select() on the pipe, as the tests' first_line did, saw no more data and waited out its timeout)."""
    proc = python("import sys, time; sys.stdout.write('one\\ntwo\\n'); sys.stdout.flush(); time.sleep(60)")
    try:
        lines = OutputLines(proc, "the driver")
        assert lines.wait_for("", 10) == "one\n"
        assert lines.wait_for("", 2) == "two\n"
        assert lines.text() == "one\ntwo\n"
    finally:
        proc.kill()
        proc.wait()


def test_a_line_is_looked_for_after_the_last_one_handed_over():
    proc = python("print('result 1'); print('log'); print('result 2')")
    lines = OutputLines(proc)
    assert lines.wait_for("result", 10) == "result 1\n"
    assert lines.wait_for("result", 10) == "result 2\n"
    proc.wait()


def test_a_process_that_ends_first_is_named_with_its_exit_code_and_output():
    proc = python("print('starting'); raise SystemExit(3)")
    with pytest.raises(RuntimeError) as caught:
        OutputLines(proc, "the server").wait_for("listening", 30)
    message = str(caught.value)
    assert message.startswith("the server ended (exit code 3) before a line with 'listening'")
    assert "starting" in message


def test_a_silent_process_is_named_with_the_time_it_was_given():
    proc = python("import time; time.sleep(60)")
    try:
        with pytest.raises(RuntimeError, match=r"^the driver said nothing in 0.5 s before a line with ''"):
            OutputLines(proc, "the driver").wait_for("", 0.5)
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_reward_serve_listens_on_the_port_it_names_and_is_stopped_at_the_end(tmp_path):
    pytest.importorskip("fastapi")
    with FakeOpenAI(make_judge()) as judge:
        config = write_config(tmp_path / "reward.yaml", judge, on_failure="zero")
        with start_reward_serve(config, tmp_path) as service:
            assert service.url.startswith("http://127.0.0.1:") and not service.url.endswith(":0")
            with urllib.request.urlopen(f"{service.url}/health", timeout=10) as answer:
                assert answer.status == 200
        assert service.proc.returncode is not None  # stopped, and reaped
        assert "stopping: no new requests" in service.output.text()


def test_reward_serve_refusing_its_config_is_named_with_its_line(tmp_path):
    config = tmp_path / "reward.yaml"
    config.write_text("judge: [not, a, section]\n")
    with pytest.raises(RuntimeError) as caught:
        start_reward_serve(config, tmp_path)
    message = str(caught.value)
    assert message.startswith("keyshot reward serve ended (exit code 2) before a line with ' on http://'")
    assert str(config) in message
