"""What the reward tests share (tests/conftest.py makes the fixtures visible to every test module):
the fixture folders, the config writer, the fake judge and scorer, and the reset of the process-wide
models."""

from __future__ import annotations

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
