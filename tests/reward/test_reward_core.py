"""The reward room's core: the public name, the reward value, the shared model reached from many threads
and loops, the one rollout reader and the one builder of log fields."""

from __future__ import annotations

import asyncio
import base64
import importlib.util
import json
import logging
import math
import os
import threading

import pytest
from PIL import Image

from keyshot.infer.common.config import ConfigError
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge, user_parts
from keyshot.infer.testing.images import encoded, png
from keyshot.infer.testing.worlds import synthetic_trajectories
from keyshot.reward import shared as reward_shared
from keyshot.reward.logs import SAMPLE_KEYS, Metrics, sample_logs, trainer_metrics, warn_constant_groups
from keyshot.reward.model import RewardResult
from keyshot.reward.rollouts import RolloutError, read_rollout
from tests.support import paths
from tests.support.reward import OM2W_V1, write_config

REPO = paths.REPO

pytestmark = pytest.mark.usefixtures("no_shared_model")


def count(server: FakeOpenAI, step: str) -> int:
    return sum(identify_step(r) == step for r in server.requests)


# ---------------------------------------------------------------------------- the public name
def test_keyshot_reward_is_the_public_name_and_its_adapter_files_load_by_path():
    import keyshot.frameworks.trl.reward
    import keyshot.frameworks.verl.reward
    import keyshot.reward
    from keyshot.reward.model import RewardModel

    assert keyshot.reward.RewardModel is RewardModel
    assert callable(keyshot.frameworks.verl.reward.compute_score) and callable(
        keyshot.frameworks.trl.reward.environment_reward
    )
    # OpenRLHF's loader: a spec from the file, no sys.modules entry, exec_module
    spec = importlib.util.spec_from_file_location(
        "reward_func", REPO / "frameworks" / "openrlhf" / "reward.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert callable(module.reward_func)


# ---------------------------------------------------------------------------- the reward value
def test_reward_value_p_success_and_progress_and_the_configs_that_cannot_give_them(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
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
    # progress: a judge that needs 1-3 key screenshots per key point (each key point its own number), so a
    # rollout can meet some of its three key points; the judge's own answers say how many each one met
    shots = [
        [str(s.path) for s in t.screenshots]
        for t in load_trajectories(synthetic_trajectories(tmp_path, 4, 4))
    ]
    tasks = [f"Open page {i}, find its settings and save the form" for i in range(4)]
    graded = make_judge("evidence")
    with FakeOpenAI(graded) as judge:
        config = write_config(tmp_path / "graded.yaml", judge, scorer)
        k = reward_shared.RewardModel.from_config(
            config, value="progress", pipeline__outcome_mode="key_point", allow_root=str(tmp_path)
        )
        results = k.score_sync([{"task": t, "screenshots": s} for t, s in zip(tasks, shots, strict=True)])
        k.close()
    assert all(r.error is None for r in results)
    for task, r in zip(tasks, results, strict=True):
        asked = [q for q in judge.requests if identify_step(q) == "outcome" and task in user_parts(q)[0]]
        met = sum('Status: "success"' in graded(q) for q in asked)
        assert len(asked) == len(r.key_points) == 3
        assert r.reward == r.progress == pytest.approx(met / 3)
    assert any(0.0 < r.reward < 1.0 for r in results)  # some key points met, not all


def test_a_verdict_without_the_chosen_value_is_a_failure_not_a_zero(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero")
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
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path / "reward.yaml", judge, scorer)))
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
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path / "reward.yaml", judge, scorer)))
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
    jpeg = encoded(Image.new("RGB", (8, 8), "white"), "JPEG")
    text = base64.b64encode(jpeg).decode()
    assert text.startswith("/9j/") and len(text) < 4096  # looks like an absolute path
    trajectory = read_rollout({"task": "t", "screenshots": [text]}, 0, allow_root=tmp_path)
    assert trajectory.screenshots[0].data == jpeg
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
        RewardResult(
            id="a", reward=1.0, success=True, progress=0.5, calls={"judge": 2}, paid_calls={"judge": 2}
        ),
        RewardResult(id="b", error="outcome: down", calls={"judge": 1}, cached_calls={"judge": 1}),
        RewardResult(id="c", reward=0.0, success=False, p_success=0.2),
    ]
    logs = sample_logs(results)
    assert tuple(logs) == SAMPLE_KEYS and all(len(v) == 3 for v in logs.values())
    assert all(isinstance(x, float) and math.isfinite(x) for v in logs.values() for x in v)
    assert logs["keyshot_failed"] == [0.0, 1.0, 0.0] and logs["keyshot_judge_calls"] == [2.0, 0.0, 0.0]
    assert logs["keyshot_has_progress"] == [1.0, 0.0, 0.0] and logs["keyshot_progress"] == [0.5, 0.0, 0.0]
    # a trainer that averages each metric as its sum over its count gets the mean over the samples that
    # have one, and every optional measure's count even when no sample has one
    metrics: dict[str, list[float]] = {}
    for name, value in trainer_metrics(results):
        metrics.setdefault(name, []).append(value)
    assert metrics["keyshot/progress"] == [0.5] and metrics["keyshot/progress_n"] == [1.0]
    assert metrics["keyshot/failed"] == [0.0, 1.0, 0.0] and metrics["keyshot/p_success"] == [0.2]
    assert dict(trainer_metrics([])) == {
        "keyshot/progress_n": 0.0,
        "keyshot/p_success_n": 0.0,
        "keyshot/credited_steps_n": 0.0,
        "keyshot/first_credited_step_n": 0.0,
    }
    # per-step rewards: how many steps earned one, and the first that did (a number every sample has)
    stepped = [
        RewardResult(id="s", step_rewards=[0.0, 0.5, 0.0, 0.5]),
        RewardResult(id="z", step_rewards=[0.0]),
    ]
    logs = sample_logs([*stepped, results[0]])
    assert logs["keyshot_credited_steps"] == [2.0, 0.0, 0.0] and logs["keyshot_has_credited_steps"] == [
        1,
        1,
        0,
    ]
    assert logs["keyshot_first_credited_step"] == [1.0, 0.0, 0.0]
    assert logs["keyshot_has_first_credited_step"] == [1.0, 0.0, 0.0]


def test_identical_screenshots_scored_once_are_not_counted_as_cache_hits(tmp_path, servers):
    """The service's ``keyshot_reward_cache_hits_total`` counts answers read from the call cache only: a
    rollout showing one page three times, scored once against an empty cache, has its repeats counted as
    identical screenshots scored once (``keyshot_reward_same_image_total``), not as cache hits (they
    were, which over-counted the cache)."""
    judge, scorer = servers
    shot = base64.b64encode(png(64, 48, (30, 120, 200))).decode()
    rollout = {"task": "Open the blue page", "screenshots": [shot] * 3, "actions": ["scroll(0, 1)"] * 2}
    rm = reward_shared.RewardModel.from_config(write_config(tmp_path / "reward.yaml", judge, scorer))
    try:
        [result] = rm.score_sync([rollout])
    finally:
        rm.close()
    assert not result.failed, result.error
    assert result.same_image["scorer"] == 2 and result.cache_hits["scorer"] == 0
    assert result.paid_calls["scorer"] == len(scorer.requests) == 1
    metrics = Metrics()
    metrics.count([result])
    text = metrics.text(0)
    assert 'keyshot_reward_cache_hits_total{role="scorer"} 0' in text
    assert 'keyshot_reward_same_image_total{role="scorer"} 2' in text
    assert 'keyshot_reward_paid_calls_total{role="scorer"} 1' in text


def test_constant_groups_are_named_once(caplog):
    with caplog.at_level(logging.WARNING, logger="keyshot.reward.logs"):
        assert warn_constant_groups(["f1", "f1", "f2", "f2"], [0, 0, 1, 1], "test-where", "record episodes")
        assert warn_constant_groups(["f1", "f1"], [0, 0], "test-where", "record episodes")
        assert not warn_constant_groups(["e1", "e2", "e3", "e4"], [0, 0, 1, 1], "other", "x")
    warned = [r for r in caplog.records if "test-where" in r.getMessage()]
    assert len(warned) == 1 and "record episodes" in warned[0].getMessage()


# ---------------------------------------------------------------------------- OpenRLHF labels
def test_an_openrlhf_label_that_looks_like_json_is_json_never_a_path(tmp_path):
    from keyshot.reward.rollouts import label_rollout

    assert label_rollout(' {"task": "t", "screenshots": []}', 0) == {"task": "t", "screenshots": []}
    assert label_rollout({"task": "t"}, 0) == {"task": "t"}
    assert label_rollout(f" {OM2W_V1[0]}\n", 0) == str(OM2W_V1[0])
    for malformed in ('{"task": "t", "screenshots": [', "[1, 2"):
        with pytest.raises(RolloutError) as info:
            label_rollout(malformed, 7)
        assert str(info.value).startswith("label 7: ") and "is not JSON" in str(info.value)
        assert info.value.status == 422


# ---------------------------------------------------------------------------- the episode recorder
def test_an_episode_keeps_every_action_records_failures_and_lets_nobody_append(tmp_path):
    from keyshot.reward import Episode

    shot = next(load_trajectories(synthetic_trajectories(tmp_path, 1, 1))).screenshots[0].path
    episode = Episode("Open the settings", keep_dir=tmp_path / "kept")
    episode.add_step(shot)  # the first page
    episode.add_step(action="scroll('down')", thought="look further")  # no page shown after it
    episode.add_step(shot, action="click('3')")
    assert episode.actions == ("scroll('down')", "click('3')") and len(episode.screenshots) == 2
    assert episode.thoughts == ("look further", "")
    for view in (episode.actions, episode.screenshots, episode.thoughts, episode.problems):
        with pytest.raises(AttributeError):
            view.append("x")  # read-only: recorded through the methods only
    episode.finish("done")
    assert episode.trajectory().actions == ["scroll('down')", "click('3')"] and episode.problem() is None
    episode.fail("the browser died")
    assert episode.problems == (f"episode {episode.id}: the browser died",)
    with pytest.raises(RolloutError, match="the browser died"):
        episode.trajectory()


# ---------------------------------------------------------------------------- the model's life
def test_the_model_starts_its_loop_at_its_first_score_and_closes_once_from_any_thread(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    before = set(threading.enumerate())
    rm = reward_shared.RewardModel.from_config(config)
    assert not set(threading.enumerate()) - before and not rm.loop.running  # building starts no thread
    folder = rm.cache.path.parent
    assert rm.score_sync([str(OM2W_V1[0])])[0].error is None
    assert rm.loop.running  # the first score started it
    closers = [threading.Thread(target=rm.close) for _ in range(3)]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)
    rm.close()  # once more: nothing left to do
    assert not rm.loop.running and not folder.exists()
    with pytest.raises(RuntimeError, match="stopped"):
        rm.score_sync([str(OM2W_V1[0])])

    # on the model's own loop close() hands the work to a thread of its own; aclose() from another loop
    on_loop = reward_shared.RewardModel.from_config(config)

    async def close_here() -> None:
        on_loop.close()

    on_loop.loop.run_sync(close_here(), timeout=30)
    another = reward_shared.RewardModel.from_config(config)

    async def from_a_loop() -> bool:
        ticks = asyncio.create_task(asyncio.sleep(0))  # the caller's loop keeps running meanwhile
        await another.aclose()
        return ticks.done()

    assert asyncio.run(from_a_loop())
    assert not another.loop.running

    # a model closed before any score: no thread was started, none is left, and it cannot score after
    around = set(threading.enumerate())
    unused = reward_shared.RewardModel.from_config(config)
    unused_folder = unused.cache.path.parent
    unused.close()
    unused.close()
    assert not set(threading.enumerate()) - around
    assert not unused.loop.running and not unused_folder.exists()
    with pytest.raises(RuntimeError, match="stopped"):
        unused.score_sync([str(OM2W_V1[0])])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_builds_its_own_shared_model_and_leaves_the_parents_alone(
    tmp_path, servers, monkeypatch
):
    judge, scorer = servers
    monkeypatch.setenv(reward_shared.CONFIG_ENV, str(write_config(tmp_path / "reward.yaml", judge, scorer)))
    parent = reward_shared.shared_model()
    assert parent.score_sync([str(OM2W_V1[0])])[0].error is None
    folder = parent.cache.path.parent
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it saw, then leave without running the parent's exit handlers
        try:
            report = {}
            try:
                parent.score_sync([str(OM2W_V1[0])])
            except RuntimeError as exc:
                report["parent_model"] = str(exc)
            own = reward_shared.shared_model()
            report["own_is_new"] = own is not parent
            report["own_reward"] = own.score_sync([str(OM2W_V1[1])])[0].reward
            del parent, own
            reward_shared.reset_shared()
            os.write(write, json.dumps(report).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        report = json.loads(pipe.read() or "{}")
    os.waitpid(pid, 0)
    assert "before a fork" in report["parent_model"] and report["own_is_new"]
    assert report["own_reward"] in (0.0, 1.0)
    assert folder.is_dir() and parent.loop.running  # the child released nothing of the parent's
    assert parent.score_sync([str(OM2W_V1[1])])[0].reward == report["own_reward"]


def test_the_batch_window_is_a_config_key_with_the_documented_variable_as_its_fallback(monkeypatch, tmp_path):
    """The variable is read where the config is (reward_config), not inside RewardSettings."""
    from keyshot.reward.model import DEFAULT_WINDOW_S, WINDOW_ENV, RewardSettings, reward_config
    from tests.support.reward import write_config

    config = write_config(tmp_path / "reward.yaml", "http://127.0.0.1:9/v1")
    monkeypatch.delenv(WINDOW_ENV, raising=False)
    assert reward_config(config)[1].batch_window_s == DEFAULT_WINDOW_S
    monkeypatch.setenv(WINDOW_ENV, "0.5")
    assert reward_config(config)[1].batch_window_s == 0.5
    assert reward_config(config, batch_window_s=2)[1].batch_window_s == 2
    assert RewardSettings().batch_window_s is None  # the settings read no environment
    monkeypatch.setenv(WINDOW_ENV, "soon")
    with pytest.raises(ConfigError, match=WINDOW_ENV):
        reward_config(config)


def test_the_batcher_resolves_the_window_by_the_models_rule(monkeypatch, tmp_path):
    """RewardBatcher fell back to DEFAULT_WINDOW_S where the model's settings hold no window, passing over
    $KEYSHOT_REWARD_WINDOW_S that reward_config reads: both now ask reward.model.batch_window_s."""
    from keyshot.reward.model import WINDOW_ENV, RewardModel, RewardSettings, reward_config
    from keyshot.reward.shared import RewardBatcher
    from tests.support.reward import write_config

    cfg, _ = reward_config(write_config(tmp_path / "reward.yaml", "http://127.0.0.1:9/v1"))
    monkeypatch.setenv(WINDOW_ENV, "0.25")
    model = RewardModel(cfg, RewardSettings())  # settings built without a config: no window
    try:
        assert (
            RewardBatcher(model).window_s == 0.25 == reward_config(tmp_path / "reward.yaml")[1].batch_window_s
        )
        assert RewardBatcher(model, window_s=1.0).window_s == 1.0
    finally:
        model.close()
