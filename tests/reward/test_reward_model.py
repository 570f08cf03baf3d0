"""keyshot as a reward model: RewardModel, Episode and the TRL / OpenRLHF / verl adapters, against fake
judge and scorer servers."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import time
from pathlib import Path

import pytest

from keyshot.frameworks.openrlhf.reward import reward_func
from keyshot.frameworks.trl.reward import EpisodeRecorder, environment_reward, reward_function
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, identify_step, make_judge
from keyshot.infer.testing.worlds import synthetic_trajectories
from keyshot.reward import Episode, RewardModel
from keyshot.reward import shared as reward_shared
from tests.support.reward import FIXTURES, OM2W_V1, write_config

pytestmark = pytest.mark.usefixtures("no_shared_model")


def steps(server: FakeOpenAI) -> list[str]:
    return [identify_step(r) for r in server.requests]


@pytest.fixture
def group(tmp_path):
    """8 rollouts of one task (distinct screenshots), as dicts with ids."""
    jsonl = synthetic_trajectories(tmp_path / "world", 8, 3)
    return [
        {
            "id": f"r{i}",
            "task": "Find the page number 3 and open its settings",
            "screenshots": [str(s.path) for s in t.screenshots],
            "actions": t.actions,
        }
        for i, t in enumerate(load_trajectories(jsonl))
    ]


def test_a_group_of_eight_sends_one_key_point_request_and_keeps_order(tmp_path, group):
    # the scorer takes a moment per answer, as a real one does: its calls' overlap is then observable
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge(), latency_s=0.2) as scorer:
        rm = RewardModel.from_config(
            write_config(tmp_path / "reward.yaml", judge, scorer), allow_root=str(tmp_path)
        )
        results = rm.score_sync(group)
        rm.score_sync(group[:2])  # a later batch of the same task: everything from the cache
        rm.close()
    assert [r.id for r in results] == [f"r{i}" for i in range(8)]
    assert all(r.reward in (0.0, 1.0) and r.error is None for r in results)
    assert steps(judge).count("key_points") == 1 and steps(judge).count("outcome") == 8
    assert len(scorer.requests) == 24 and scorer.stats.max_in_flight > 1  # the batch's scorer calls together
    # the calls each result paid for add up to the requests the endpoints received
    assert sum(r.paid_calls["judge"] for r in results) == len(judge.requests) == 9  # the later batch: none
    assert sum(r.paid_calls["scorer"] for r in results) == 24
    assert all(r.paid_calls[k] + r.cached_calls[k] == r.calls[k] for r in results for k in r.calls)
    assert results[0].key_points == ["Find the page number 3", "Open its settings"]
    assert len(results[0].step_scores) == 3 and results[0].progress is None  # cot: no key-point progress
    assert results[0].p_success is None and "logprobs" in results[0].p_success_source
    assert set(results[0].to_dict()) >= {
        "reward",
        "p_success",
        "progress",
        "step_scores",
        "kept",
        "calls",
        "tokens",
        "cost_usd",
        "error",
        "kind",
    }


def test_rollout_kinds_and_progress_in_key_point_mode(tmp_path, servers):
    judge, scorer = servers
    rm = RewardModel.from_config(
        write_config(tmp_path / "reward.yaml", judge, scorer), pipeline__outcome_mode="key_point"
    )
    trajectory = next(load_trajectories(OM2W_V1[0]))
    shot = trajectory.screenshots[0].read_bytes()
    import base64

    from PIL import Image

    rollouts = [
        str(OM2W_V1[0]),
        trajectory,
        {
            "task": trajectory.task,
            "screenshots": [shot, base64.b64encode(shot).decode(), Image.new("RGB", (64, 48), "white")],
        },
    ]
    results = rm.score_sync(rollouts)
    assert [r.error for r in results] == [None, None, None]
    assert all(r.progress is not None and 0.0 <= r.progress <= 1.0 for r in results)
    assert results[0].reward == results[1].reward and results[0].progress == results[1].progress
    rm.close()


def test_a_failing_judge_gives_none_never_zero_unless_on_failure_zero(tmp_path, group):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        rm = RewardModel.from_config(
            write_config(tmp_path / "reward.yaml", judge, scorer), allow_root=str(tmp_path)
        )
        results = rm.score_sync(group[:3])
        assert [r.reward for r in results] == [None, None, None]
        assert all(
            "key points" in r.error and r.kind == "judge" and not r.on_failure_applied for r in results
        )
        zero = RewardModel.from_config(
            write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero"), allow_root=str(tmp_path)
        )
        results = zero.score_sync(group[:2])
        assert [r.reward for r in results] == [0.0, 0.0]
        assert all(r.on_failure_applied and r.error and r.kind == "judge" for r in results)
    # a scorer whose answers hold no score: no evidence, so no verdict; a dead one: its endpoint is down
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(lambda request: "**Score**: unsure") as scorer:
        unreadable = RewardModel.from_config(
            write_config(tmp_path / "scorer.yaml", judge, scorer), allow_root=str(tmp_path)
        )
        results = unreadable.score_sync(group[:2])
        assert [r.reward for r in results] == [None, None] and [r.kind for r in results] == ["scorer"] * 2
        scorer.faults = FaultPlan({"500": 1.0})
        results = unreadable.score_sync(group[2:4])
    assert [r.reward for r in results] == [None, None] and [r.kind for r in results] == ["stopped"] * 2


def test_bad_rollouts_get_none_with_the_reason_and_the_rest_is_scored(tmp_path, servers, group):
    judge, scorer = servers
    rm = RewardModel.from_config(
        write_config(tmp_path / "reward.yaml", judge, scorer), allow_root=str(tmp_path)
    )
    shot = next(load_trajectories(OM2W_V1[0])).screenshots[0].path  # outside the allowed root
    bad = [
        {"screenshots": [b"\x89PNG"]},
        {"task": "t", "screenshots": [b"not an image at all"]},
        {"task": "t", "screenshots": [str(shot)]},
        Episode("t"),
    ]
    results = rm.score_sync([group[0], *bad])
    assert results[0].reward is not None
    assert "'task'" in results[1].error and "not an image" in results[2].error
    assert "outside the allowed root" in results[3].error and "no screenshots" in results[4].error
    assert all(r.reward is None and r.kind == "input" for r in results[1:]) and results[0].kind is None


def test_episode_spills_to_disk_is_removed_once_scored_and_kept_for_keyshot_judge(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    rm = RewardModel.from_config(config)
    trajectory = next(load_trajectories(OM2W_V1[0]))
    temporary = Episode(trajectory.task, start_url="https://example.com")
    kept = [Episode(trajectory.task, keep_dir=tmp_path / "kept") for _ in range(2)]
    for episode in (temporary, *kept):
        for i, shot in enumerate(trajectory.screenshots):
            episode.add_step(shot.path if i % 2 else shot.read_bytes(), action=f"click({i})")
        episode.finish("done")
    spilled = sorted(temporary.folder.iterdir())
    assert len(spilled) == trajectory.num_screenshots and all(p.stat().st_size > 0 for p in spilled)
    results = rm.score_sync([temporary, *kept])
    assert all(r.reward is not None for r in results)
    assert not temporary.root.exists()
    assert all(e.jsonl_path.is_file() and e.folder.is_dir() for e in kept)
    out = tmp_path / "judged"
    assert (
        keyshot(["judge", str(tmp_path / "kept"), "--config", str(config), "--no-progress", f"out={out}"])
        == 0
    )
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert len(verdicts) == 2 and all(v.finished for v in verdicts)
    rm.close()


# ---------------------------------------------------------------------------- TRL
class ReplayEnv(EpisodeRecorder):
    """A stand-in browser: replays a recorded trajectory, one screenshot per tool call."""

    def __init__(self, folder: Path):
        self.trajectory = next(load_trajectories(folder))

    def reset(self) -> str:
        self._start_episode(self.trajectory.task)
        self.step = 0
        return self.trajectory.task

    def click(self, element: str) -> str:
        shot = self.trajectory.screenshots[self.step].path
        self.step += 1
        return self._record(shot, action=f"click({element!r})", text=f"page {self.step}")


def test_trl_environment_reward_scores_every_environment_concurrently(tmp_path, servers):
    judge, scorer = servers
    rm = RewardModel.from_config(write_config(tmp_path / "reward.yaml", judge, scorer))
    envs = [ReplayEnv(OM2W_V1[i % 2]) for i in range(4)]
    for env in envs:
        env.reset()
        for _ in env.trajectory.screenshots:
            env.click("next")
    metrics, extras = {}, {}
    reward = environment_reward(rm)
    rewards = asyncio.run(
        reward(
            environments=envs,
            prompts=[[{"role": "user", "content": env.trajectory.task}] for env in envs],
            completions=[[{"role": "assistant", "content": "done"}] for _ in envs],
            completion_ids=[[1, 2] for _ in envs],
            trainer_state=None,
            log_metric=metrics.__setitem__,
            log_extra=extras.__setitem__,
            task=[env.trajectory.task for env in envs],
        )
    )
    assert len(rewards) == 4 and all(r in (0.0, 1.0) for r in rewards)
    assert rewards[0] == rewards[2] and rewards[1] == rewards[3]
    assert steps(judge).count("key_points") == 2  # once per task across the group
    assert metrics["keyshot/failed"] == 0.0 and len(extras["keyshot_progress"]) == 4
    assert all(not env.episode.root.exists() for env in envs)


def test_trl_reward_function_reads_the_dataset_columns(tmp_path, servers):
    judge, scorer = servers
    rm = RewardModel.from_config(write_config(tmp_path / "reward.yaml", judge, scorer))
    reward = reward_function(rm)
    rewards = asyncio.run(
        reward(
            prompts=["p0", "p1"],
            completions=["answer 0", "answer 1"],
            completion_ids=[[1], [2]],
            trainer_state=None,
            trajectory=[str(p) for p in OM2W_V1],
        )
    )
    assert len(rewards) == 2 and all(r in (0.0, 1.0) for r in rewards)


# ---------------------------------------------------------------------------- OpenRLHF
def test_openrlhf_needs_its_config_variable(tmp_path):
    with pytest.raises(reward_shared.RewardConfigError, match="KEYSHOT_REWARD_CONFIG"):
        reward_func(["q"], ["p"], [str(OM2W_V1[0])])


def test_openrlhf_reward_func(tmp_path, servers, monkeypatch):
    judge, scorer = servers
    monkeypatch.setenv(
        "KEYSHOT_REWARD_CONFIG", str(write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero"))
    )
    out = reward_func(["q0", "q1"], ["p0", "p1"], [str(p) for p in OM2W_V1])
    assert set(out) == {"rewards", "scores", "extra_logs"} and len(out["rewards"]) == 2
    assert [float(x) for x in out["extra_logs"]["keyshot_failed"]] == [0.0, 0.0]


AGENT_FILE = """
from pathlib import Path
from keyshot.infer.loaders import load_trajectory
from keyshot.frameworks.openrlhf.reward import KeyshotAgentInstance, Observation

class AgentInstance(KeyshotAgentInstance):
    async def start(self, label):
        self.replay = load_trajectory(label)
        self.step_no = 0
        return self.replay.task, Observation(self.replay.task, self.replay.screenshots[0].path)

    async def act(self, action_text):
        self.step_no += 1
        last = self.step_no >= len(self.replay.screenshots) - 1
        shot = self.replay.screenshots[min(self.step_no, len(self.replay.screenshots) - 1)].path
        return Observation(f"page {self.step_no}", shot, done=last, answer="done" if last else None)
"""


def test_an_openrlhf_agents_page_is_the_environments_page():
    """One page type: OpenRLHF's Observation is keyshot's Page under its former name, built as before
    (text, screenshot, done= and answer= by keyword), so a keyshot browser's page can be returned as it is."""
    from keyshot.env.page import Page
    from keyshot.frameworks.openrlhf.reward import Observation

    assert Observation is Page
    first = Observation("page 0")
    assert (first.screenshot, first.step, first.done, first.answer) == (None, 0, False, None)
    last = Observation("page 1", b"png", done=True, answer="done")
    assert last == Page("page 1", b"png", 0, True, "done")


def load_agent_file(tmp_path: Path):
    path = tmp_path / "agent_func.py"
    path.write_text(AGENT_FILE)
    spec = importlib.util.spec_from_file_location("agent_func", path)  # as OpenRLHF loads it
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AgentInstance


async def drive(agent_cls, labels: list[str]) -> list[dict]:
    async def one(label: str) -> dict:
        agent = agent_cls()
        await agent.reset({"observation": "", "label": label})
        while True:
            out = await agent.step({"observation_text": "", "action_text": "click(next)", "label": label})
            if out["done"]:
                return out

    return await asyncio.gather(*(one(label) for label in labels))


def test_openrlhf_agent_file_driven_through_reset_and_step(tmp_path, servers, monkeypatch):
    judge, scorer = servers
    # a batch window wide enough for the four episodes finishing together on a busy machine
    config = write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero", batch_window_s=2)
    monkeypatch.setenv("KEYSHOT_REWARD_CONFIG", str(config))
    finals = asyncio.run(drive(load_agent_file(tmp_path), [str(OM2W_V1[0])] * 3 + [str(OM2W_V1[1])]))
    assert all(float(f["rewards"][0]) in (0.0, 1.0) for f in finals)
    assert all(float(f["extra_logs"]["keyshot_failed"][0]) == 0.0 for f in finals)
    assert steps(judge).count("key_points") == 2
    assert reward_shared.shared_batcher().batches == 1  # finishing together: one round of calls


def test_openrlhf_agent_with_a_failing_judge_returns_the_counted_on_failure_value(tmp_path, monkeypatch):
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        monkeypatch.setenv(
            "KEYSHOT_REWARD_CONFIG",
            str(write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero")),
        )
        finals = asyncio.run(drive(load_agent_file(tmp_path), [str(OM2W_V1[0])] * 2))
    assert [float(f["rewards"][0]) for f in finals] == [0.0, 0.0]
    assert [float(f["extra_logs"]["keyshot_failed"][0]) for f in finals] == [1.0, 1.0]


# verl: tests/reward/test_verl.py (compute_score here and through verl's own reward loop)


def test_reward_filter_writes_accepted_ids_and_links_folders(tmp_path, servers):
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    out = tmp_path / "filtered"
    rollouts = str(FIXTURES / "trajectories" / "online_mind2web_v1")
    argv = [
        "reward",
        "filter",
        rollouts,
        "--config",
        str(config),
        "--min-reward",
        "1",
        "--out",
        str(out),
        "--link",
    ]
    assert keyshot(argv) == 0
    every = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    accepted = [json.loads(line) for line in (out / "accepted.jsonl").read_text().splitlines()]
    assert len(every) == 2 and all(set(r) >= {"id", "reward", "progress", "error"} for r in every)
    assert accepted == [r for r in every if r["reward"] == 1.0]
    assert len(list((out / "accepted").iterdir())) == len(accepted)
    assert all(
        link.is_symlink() and (link / "result.json").is_file() for link in (out / "accepted").iterdir()
    )


def test_reward_filter_with_a_dead_judge_accepts_nothing_and_says_the_run_is_incomplete(tmp_path, capsys):
    """on_failure: zero gives a trainer its number; a filter must not read it as a rejection."""
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer, on_failure="zero")
        out = tmp_path / "filtered"
        rollouts = str(FIXTURES / "trajectories" / "online_mind2web_v1")
        argv = ["reward", "filter", rollouts, "--config", str(config), "--min-reward", "0", "--out", str(out)]
        assert keyshot(argv) == 3  # EXIT_INCOMPLETE: re-run when the judge is up
    every = [json.loads(line) for line in (out / "rewards.jsonl").read_text().splitlines()]
    assert len(every) == 2 and all(r["reward"] is None and r["error"] and r["kind"] == "judge" for r in every)
    assert (out / "accepted.jsonl").read_text() == ""
    captured = capsys.readouterr()
    assert "0 of 2 rollouts accepted" in captured.out and "2 without a reward" in captured.out
    assert "no verdict because a call failed" in captured.err


def test_the_service_refuses_a_full_queue_and_ends_a_request_at_its_deadline(tmp_path, group):
    """429 with Retry-After while the queue is full, 504 at the deadline, and the next request served."""
    from keyshot.reward.service import RewardService, ServiceLimits

    with FakeOpenAI(make_judge(), latency_s=0.6) as judge, FakeOpenAI(make_judge()) as scorer:
        rm = RewardModel.from_config(
            write_config(tmp_path / "reward.yaml", judge, scorer), allow_root=str(tmp_path)
        )
        service = RewardService(rm, ServiceLimits(allow_root=str(tmp_path), queue_size=1, deadline_s=0.3))
        body = json.dumps({"rollouts": group[:2]}).encode()

        async def two_at_once():
            admitted = asyncio.Event()

            async def first_request(data: dict) -> dict:
                admitted.set()  # the first request holds the queue's one place
                return await service.reward(data)

            first = asyncio.create_task(service.admitted("/v1/reward", None, body, first_request))
            await admitted.wait()
            second = await service.admitted("/v1/reward", None, body, service.reward)
            return await first, second

        (late, _, _), (full, refused, headers) = asyncio.run(two_at_once())
        assert late == 504 and full == 429 and headers == {"Retry-After": "1"}
        assert "queue is full" in refused["error"] and service.in_flight == 0
        service.limits.deadline_s = 30.0
        status, payload, _ = asyncio.run(service.admitted("/v1/reward", None, body, service.reward))
        assert status == 200 and all(r["error"] is None for r in payload["results"])
        metrics = service.metrics.text(service.in_flight)
        assert 'code="504"} 1' in metrics and 'code="429"} 1' in metrics and 'code="200"} 1' in metrics


def test_an_all_failing_judge_fails_requests_fast_and_health_says_so(tmp_path, group):
    from keyshot.reward.service import RewardService, ServiceLimits

    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer)
        rm = RewardModel.from_config(
            config, "judge.breaker_failures=2", "judge.breaker_window_s=0", allow_root=str(tmp_path)
        )
        service = RewardService(rm, ServiceLimits(allow_root=str(tmp_path)))
        body = json.dumps({"rollouts": group[:4]}).encode()
        for _ in range(6):  # each request's key-point call fails after its retries, until the breaker trips
            asyncio.run(service.admitted("/v1/reward", None, body, service.reward))
            status, health = service.health()
            if status != 200:
                break
        assert status == 503 and health["status"] == "down" and health["judge"]["down"]
        started = time.perf_counter()
        status, payload, _ = asyncio.run(service.admitted("/v1/reward", None, body, service.reward))
        assert time.perf_counter() - started < 1.0
        assert status == 200 and all(r["reward"] is None and r["error"] for r in payload["results"])


def test_half_the_judge_calls_failing_gives_no_wrong_reward(tmp_path, group):
    """Under 50% injected judge faults each reward equals the clean run's or is None with its reason."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "faulty").mkdir()
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_judge()) as scorer:
        clean = RewardModel.from_config(
            write_config(tmp_path / "clean" / "reward.yaml", judge, scorer), allow_root=str(tmp_path)
        )
        expected = {r.id: r.reward for r in clean.score_sync(group)}
    faults = {"500": 0.2, "timeout": 0.1, "malformed": 0.1, "disconnect": 0.1}
    with (
        FakeOpenAI(make_judge(), faults=faults, timeout_sleep_s=0.5) as judge,
        FakeOpenAI(make_judge()) as scorer,
    ):
        config = write_config(tmp_path / "faulty" / "reward.yaml", judge, scorer)
        rm = RewardModel.from_config(config, "judge.timeout_s=0.3", allow_root=str(tmp_path))
        results = rm.score_sync(group)
    assert all(v is not None for v in expected.values())
    wrong = [r.id for r in results if r.reward is not None and r.reward != expected[r.id]]
    assert wrong == [] and all(r.error for r in results if r.reward is None)
    assert sum(r.reward is not None for r in results) >= 1  # the retries got some through


def test_p_success_is_read_at_the_status_token_when_the_outcome_asks_for_logprobs(tmp_path, servers, group):
    """The fake judge offers 0.8 on the status word it wrote and 0.2 on the other one."""
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    rm = RewardModel.from_config(config, pipeline__outcome_logprobs=5, allow_root=str(tmp_path))
    results = rm.score_sync(group[:4])
    assert all(r.error is None for r in results)
    for r in results:
        assert r.p_success == pytest.approx(0.8 if r.reward == 1.0 else 0.2)
        assert "status word" in r.p_success_source
    outcome = [q for q in judge.requests if identify_step(q) == "outcome"]
    assert outcome and all(q.get("logprobs") and q.get("top_logprobs") == 5 for q in outcome)
    by_point = RewardModel.from_config(
        config, pipeline__outcome_logprobs=5, pipeline__outcome_mode="key_point", allow_root=str(tmp_path)
    )
    (r,) = by_point.score_sync(group[:1])
    met = round(r.progress * len(r.key_points))
    assert r.p_success == pytest.approx(0.8**met * 0.2 ** (len(r.key_points) - met))
    assert "multiplied over the 2 key points" in r.p_success_source
    plain = RewardModel.from_config(config, allow_root=str(tmp_path)).score_sync(group[:1])[0]
    assert plain.p_success is None and "pipeline.outcome_logprobs" in plain.p_success_source


def test_step_rewards_sum_to_the_episodes_progress_and_mix_with_the_outcome(tmp_path, servers, group):
    """reward.value step_progress (pipeline.step_rewards): r_t = P_t - P_(t-1) per screenshot, summing to the
    episode's progress; reward.step_outcome_weight adds the verdict at the last step."""
    from keyshot.infer.common.config import ConfigError
    from keyshot.reward.model import per_action_rewards, per_step_rewards

    assert per_step_rewards([0.0, 0.5, 0.5, 1.0], True) == [0.0, 0.5, 0.0, 0.5]
    # to actions: the first page's reward to the first action, a page past the last action's to the last
    assert per_action_rewards([0.5, 0.0, 0.5, 0.0], 3) == [0.5, 0.5, 0.0]
    assert per_action_rewards([0.1, 0.2, 0.3, 0.4], 2) == pytest.approx([0.3, 0.7])
    assert per_action_rewards([0.25, 0.75], 0) == [1.0]
    assert per_step_rewards([0.5, 0.5], False, 0.5) == [0.25, 0.0]
    assert per_step_rewards([0.0, 1.0], True, 0.5) == [0.0, 1.0]
    judge, scorer = servers
    config = write_config(tmp_path / "reward.yaml", judge, scorer)
    with pytest.raises(ConfigError, match="set pipeline.step_rewards: true"):
        RewardModel.from_config(config, value="step_progress")
    plain = RewardModel.from_config(config, allow_root=str(tmp_path), pipeline__step_rewards=True)
    mixed = RewardModel.from_config(
        config,
        allow_root=str(tmp_path),
        value="step_progress",
        step_outcome_weight=0.5,
        pipeline__step_rewards=True,
    )
    try:
        results, mixes = plain.score_sync(group), mixed.score_sync(group)
    finally:
        plain.close()
        mixed.close()
    for r, m in zip(results, mixes, strict=True):
        assert r.error is None and r.reward in (0.0, 1.0)  # the binary value is left as it was
        assert len(r.step_rewards) == len(r.step_progress) == len(r.step_scores)
        assert sum(r.step_rewards) == pytest.approx(r.progress) == pytest.approx(r.step_progress[-1])
        assert len(r.key_point_steps) == len(r.key_points)
        assert (
            m.reward == pytest.approx(0.5 * r.progress + 0.5 * r.reward) == pytest.approx(sum(m.step_rewards))
        )
        assert m.step_rewards[:-1] == pytest.approx([x / 2 for x in r.step_rewards[:-1]])
    assert len({r.progress for r in results}) > 1  # progress tells the group's rollouts apart
