"""What the reward tests share (tests/conftest.py makes the fixtures visible to every test module):
the fixture folders, the config writer, the fake judge and scorer, the reset of the process-wide models,
and the reader of a service process's output lines."""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from keyshot.infer.testing.configs import fake_judge_config
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths

FIXTURES = paths.FIXTURES
OM2W_V1 = sorted((FIXTURES / "trajectories" / "online_mind2web_v1").iterdir())


def write_config(
    path: Path,
    judge: FakeOpenAI | str,
    scorer: FakeOpenAI | str | None = None,
    *,
    timeout_s: float = 10.0,
    **reward: Any,
) -> Path:
    """A ``keyshot judge`` config at ``path`` with ``judge`` as the judge and ``scorer`` (default: the
    judge) as the scorer (fake servers or base URLs), quick to give up on a dead endpoint; ``reward`` keys
    (``on_failure="zero"``, ``batch_window_s=1``; None: left out) make its ``reward:`` section."""
    judge_url, scorer_url = (getattr(s, "base_url", s) for s in (judge, scorer or judge))
    fake_judge_config(
        path,
        judge_url,
        {"endpoint": {"base_url": scorer_url, "model": "webjudge-7b", "api_key_env": None}},
        judge={"backoff_base_s": 0.01, "max_retries": 1, "timeout_s": timeout_s},
    )
    section = {k: v for k, v in reward.items() if v is not None}
    if section:
        path.write_text(path.read_text() + "reward:\n" + "".join(f"  {k}: {v}\n" for k, v in section.items()))
    return path


@pytest.fixture
def judge():
    """A fake judge (the deterministic WebJudge responder), also the scorer of :func:`config`."""
    with FakeOpenAI(make_judge()) as server:
        yield server


@pytest.fixture
def on_failure() -> str | None:
    """``reward.on_failure`` of :func:`config`: None, so a failed call is None (TRL's "no reward"). A module
    whose reward must be a number (OpenRLHF, the service) overrides this fixture with ``"zero"``."""
    return None


@pytest.fixture
def config(tmp_path, judge, on_failure) -> Path:
    """A reward config at ``tmp_path/reward.yaml``: :func:`judge` as judge and scorer, :func:`on_failure`."""
    return write_config(tmp_path / "reward.yaml", judge, on_failure=on_failure)


@pytest.fixture
def servers():
    """A fake judge and a fake scorer (the deterministic WebJudge responder)."""
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        yield judge, scorer


@pytest.fixture
def no_shared_model(monkeypatch):
    """No ``$KEYSHOT_REWARD_CONFIG`` from outside, and the process-wide models a test built closed after
    it (``pytestmark = pytest.mark.usefixtures("no_shared_model")``)."""
    from keyshot.reward import shared

    monkeypatch.delenv(shared.CONFIG_ENV, raising=False)
    yield
    shared.reset_shared()


class OutputLines:
    """The lines a process writes to its stdout (a pipe), read on a thread of their own as they come,
    so a test waits for a line instead of sleeping."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.lines: list[str] = []
        self._new: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, name="output-lines", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._new.put(line)
        self._new.put(None)  # the pipe is closed: the process ended

    def wait_for(self, text: str, timeout_s: float = 60.0) -> str:
        """The first line holding ``text`` (read now or later); fails naming the output when the process
        ends or ``timeout_s`` passes first."""
        found = next((line for line in self.lines if text in line), None)
        deadline = time.monotonic() + timeout_s
        while found is None:
            try:
                line = self._new.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no line with {text!r} within {timeout_s:g} s; output: {self.text()[-4000:]}")
            if line is None:
                self._new.put(None)
                pytest.fail(f"the process ended without a line with {text!r}; output: {self.text()[-4000:]}")
            self.lines.append(line)
            found = line if text in line else None
        return found

    def text(self) -> str:
        """Everything read so far."""
        while not self._new.empty():
            line = self._new.get()
            if line is None:
                self._new.put(None)
                break
            self.lines.append(line)
        return "".join(self.lines)
