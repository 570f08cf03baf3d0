"""The reward room's core: the public name, the reward value, the shared model reached from many threads
and loops, the one rollout reader and the one builder of log fields."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import io
import logging
import math
import threading
from pathlib import Path

import pytest
from PIL import Image

from keyshot.infer.common.config import ConfigError
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.reward import shared as reward_shared
from keyshot.reward.logs import SAMPLE_KEYS, batch_metrics, sample_logs, warn_constant_groups
from keyshot.reward.model import RewardResult
from keyshot.reward.rollouts import RolloutError, read_rollout
from tests.test_reward import OM2W_V1, write_config

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def servers():
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        yield judge, scorer


@pytest.fixture(autouse=True)
def no_shared_model(monkeypatch):
    monkeypatch.delenv(reward_shared.CONFIG_ENV, raising=False)
    yield
    reward_shared.reset_shared()


def count(server: FakeOpenAI, step: str) -> int:
    return sum(identify_step(r) == step for r in server.requests)


# ---------------------------------------------------------------------------- the public name
def test_keyshot_reward_is_the_public_name_and_its_adapter_files_load_by_path():
    import keyshot.reward
    import keyshot.reward.trl
    import keyshot.reward.verl
    from keyshot.reward.model import RewardModel

    assert keyshot.reward.RewardModel is RewardModel
    assert callable(keyshot.reward.verl.compute_score) and callable(keyshot.reward.trl.environment_reward)
    # OpenRLHF's loader: a spec from the file, no sys.modules entry, exec_module
    spec = importlib.util.spec_from_file_location("reward_func", REPO / "reward" / "openrlhf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.reward_func)


# ---------------------------------------------------------------------------- the reward value
def test_reward_value_p_success_and_progress_and_the_configs_that_cannot_give_them(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path, judge, scorer)
    with pytest.raises(ConfigError, match="pipeline.outcome_logprobs"):
        reward_shared.RewardModel.from_config(config, value="p_success")
    with pytest.raises(ConfigError, match="outcome_mode: key_point"):
        reward_shared.RewardModel.from_config(config, value="progress")
    rollouts = [str(p) for p in OM2W_V1]
    p = reward_shared.RewardModel.from_config(config, value="p_success", pipeline__outcome_logprobs=5)
    results = p.score_sync(rollouts)
    p.close()
    assert all(r.error is None for r in results)
    assert [r.reward for r in results] == [pytest.approx(0.8 if r.success else 0.2) for r in results]
    k = reward_shared.RewardModel.from_config(config, value="progress", pipeline__outcome_mode="key_point")
    results = k.score_sync(rollouts)
    k.close()
    assert all(r.reward == r.progress and 0.0 <= r.reward <= 1.0 for r in results)
    assert any(0.0 < r.reward < 1.0 for r in results) or all(r.reward in (0.0, 1.0) for r in results)


def test_a_verdict_without_the_chosen_value_is_a_failure_not_a_zero(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path, judge, scorer, {"on_failure": "zero"})
    rm = reward_shared.RewardModel.from_config(config, value="p_success", pipeline__outcome_logprobs=5)
    why = "not available: the judge's answer gave no log-probabilities at its status word"
    r = rm.settle(rm.valued(RewardResult(id="x", reward=1.0, success=True, p_success_source=why)))
    rm.close()
    assert r.success is True and r.error == f"reward.value p_success: {why}"
    assert r.reward == 0.0 and r.on_failure_applied  # the counted on_failure value, not a silent 0


# ---------------------------------------------------------------------------- one model, many callers
def test_per_sample_calls_from_many_threads_share_one_batch_and_pay_nothing_twice(
    tmp_path, servers, monkeypatch
):
    """OpenRLHF calls its reward once per sample, each in a thread of its own: 16 samples of 2 tasks cost
    what one process scoring the two folders costs."""
    judge, scorer = servers
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path, judge, scorer)))
    folders = [str(OM2W_V1[0]), str(OM2W_V1[1])]
    once = reward_shared.shared_model().score_sync(folders)
    alone = {"key_points": count(judge, "key_points"), "outcome": count(judge, "outcome")}
    alone_scorer = len(scorer.requests)
    reward_shared.reset_shared()
    judge.requests.clear()
    scorer.requests.clear()
    results: dict[int, RewardResult] = {}

    def sample(i: int) -> None:
        (results[i],) = reward_shared.score_shared_sync([folders[i % 2]])

    threads = [threading.Thread(target=sample, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(results) == 16
    assert {results[i].reward for i in range(0, 16, 2)} == {once[0].reward}
    assert {results[i].reward for i in range(1, 16, 2)} == {once[1].reward}
    assert count(judge, "key_points") == alone["key_points"] == 2
    assert count(judge, "outcome") == alone["outcome"]
    assert len(scorer.requests) == alone_scorer


def test_score_shared_is_awaitable_from_several_event_loops_at_once(tmp_path, servers, monkeypatch):
    judge, scorer = servers
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path, judge, scorer)))
    out: list[float | None] = []

    def loop_in_thread() -> None:
        async def batch():
            return await asyncio.gather(*(reward_shared.score_shared(str(f)) for f in OM2W_V1))

        out.extend(r.reward for r in asyncio.run(batch()))

    threads = [threading.Thread(target=loop_in_thread) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(out) == 3 * len(OM2W_V1) and None not in out
    assert count(judge, "key_points") == len(OM2W_V1)


# ---------------------------------------------------------------------------- the rollout reader
def test_a_short_base64_jpeg_is_read_as_an_image_and_never_echoed(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "white").save(buffer, format="JPEG")
    text = base64.b64encode(buffer.getvalue()).decode()
    assert text.startswith("/9j/") and len(text) < 4096  # looks like an absolute path
    trajectory = read_rollout({"task": "t", "screenshots": [text]}, 0, allow_root=tmp_path)
    assert trajectory.screenshots[0].data == buffer.getvalue()
    bogus = "/data/shots/" + "x" * 300 + ".png"  # a missing file: named, cut short
    with pytest.raises(RolloutError) as info:
        read_rollout({"task": "t", "screenshots": [bogus]}, 3, allow_root=tmp_path)
    assert "rollout 3: screenshot 0" in str(info.value) and bogus not in str(info.value)


def test_the_reader_confines_folders_to_the_scope_with_its_status(tmp_path):
    from keyshot.infer.loaders.common import InputScope

    with pytest.raises(RolloutError) as info:
        read_rollout(str(OM2W_V1[0]), 1, scope=InputScope.of(tmp_path))
    assert info.value.status == 403 and "rollout 1" in str(info.value)
    assert read_rollout(str(OM2W_V1[0]), 0).num_screenshots > 0
    with pytest.raises(RolloutError) as info:
        read_rollout(str(OM2W_V1[0]), 0, max_screenshots=1)
    assert info.value.status == 413


# ---------------------------------------------------------------------------- log fields
def test_log_fields_have_the_same_keys_and_numbers_only_whatever_the_results():
    results = [
        RewardResult(id="a", reward=1.0, success=True, progress=0.5, calls={"judge": 2}, cached_calls={}),
        RewardResult(id="b", error="outcome: down", calls={"judge": 1}, cached_calls={"judge": 1}),
        RewardResult(id="c", reward=0.0, success=False, p_success=0.2),
    ]
    logs = sample_logs(results)
    assert tuple(logs) == SAMPLE_KEYS and all(len(v) == 3 for v in logs.values())
    assert all(isinstance(x, float) and math.isfinite(x) for v in logs.values() for x in v)
    assert logs["keyshot_failed"] == [0.0, 1.0, 0.0] and logs["keyshot_judge_calls"] == [2.0, 0.0, 0.0]
    assert logs["keyshot_has_progress"] == [1.0, 0.0, 0.0] and logs["keyshot_progress"] == [0.5, 0.0, 0.0]
    metrics = batch_metrics(results)
    assert set(metrics) == set(batch_metrics([]))
    assert metrics["keyshot/progress"] == 0.5 and metrics["keyshot/progress_n"] == 1.0
    assert metrics["keyshot/failed"] == pytest.approx(1 / 3)


def test_constant_groups_are_named_once(caplog):
    with caplog.at_level(logging.WARNING, logger="keyshot.reward.logs"):
        assert warn_constant_groups(["f1", "f1", "f2", "f2"], [0, 0, 1, 1], "test-where", "record episodes")
        assert warn_constant_groups(["f1", "f1"], [0, 0], "test-where", "record episodes")
        assert not warn_constant_groups(["e1", "e2", "e3", "e4"], [0, 0, 1, 1], "other", "x")
    warned = [r for r in caplog.records if "test-where" in r.getMessage()]
    assert len(warned) == 1 and "record episodes" in warned[0].getMessage()
