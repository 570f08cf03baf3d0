"""Per-step rewards (``pipeline.step_rewards``, issue 64): when each key point was first met, asked once
more after a ``cot`` outcome (a follow-up of its conversation) or with each key point's call, on the
fixture trajectories and the fake judge (which names, for key point k, the k-th screenshot scored >= 3)."""

from __future__ import annotations

import pytest

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.scorers import OpenAIScorer
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, is_follow_up, make_judge
from tests.support.judge_inputs import agentlab_trajectories, judge_all


def _client(server, model: str, cache: CallCache, retries: int) -> JudgeClient:
    endpoint = EndpointConfig(
        base_url=server.base_url,
        model=model,
        api_key_env=None,
        timeout_s=5,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        max_retries=retries,
    )
    return JudgeClient(endpoint, cache)


def _judge(server, tmp_path, retries: int = 1, **config):
    """A WebJudge on ``server`` (judge and scorer), its calls cached in ``tmp_path``."""
    cache = CallCache(tmp_path / "calls.sqlite")
    scorer = OpenAIScorer(_client(server, "fake-scorer", cache, retries), load_prompt_set())
    return WebJudge(_client(server, "fake-judge", cache, retries), scorer, PipelineConfig(**config))


def _check_steps(verdict):
    """The step fields' invariants: one entry per key point and per screenshot, non-decreasing, the last
    the share of key points met."""
    steps, progress = verdict.key_point_steps, verdict.step_progress
    assert len(steps) == len(split_key_points(verdict.key_points))
    assert len(progress) == len(verdict.screenshots)
    assert progress == sorted(progress) and progress[0] >= 0 and progress[-1] <= 1
    assert progress[-1] == pytest.approx(sum(s is not None for s in steps) / len(steps))


@pytest.fixture(scope="module")
def trajectory():
    return max(agentlab_trajectories(), key=lambda t: t.num_screenshots)


def test_cot_asks_one_follow_up_and_keeps_the_verdict(tmp_path, trajectory):
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        off = judge_all(_judge(server, tmp_path / "off"), [trajectory])[0]
        server.requests.clear()
        on = judge_all(_judge(server, tmp_path / "on", step_rewards=True), [trajectory])[0]
        sent = list(server.requests)
        again = judge_all(_judge(server, tmp_path / "on", step_rewards=True), [trajectory])[0]
    assert off.key_point_steps is None and off.step_progress is None and "step_rewards" not in off.config
    assert (on.success, on.outcome_text, on.kept) == (off.success, off.outcome_text, off.kept)
    assert on.usage["judge"].calls == off.usage["judge"].calls + 1 == 3
    follow_ups = [r for r in sent if is_follow_up(r)]
    outcome = [r for r in sent if "Action History" in str(r["messages"]) and not is_follow_up(r)]
    assert len(follow_ups) == 1 and len(outcome) == 1
    # the follow-up shares the outcome request's prefix, then the judge's own answer
    assert follow_ups[0]["messages"][:2] == outcome[0]["messages"]
    assert follow_ups[0]["messages"][2] == {"role": "assistant", "content": on.outcome_text}
    _check_steps(on)
    met = [r.index for r in on.screenshots if r.score is not None and r.score >= 3]
    assert on.key_point_steps == [met[k] if k < len(met) else None for k in range(len(on.key_point_steps))]
    assert on.config["step_rewards"] is True and on.config["step_prompt_version"].startswith("steps@")
    assert again.usage["judge"].cached == again.usage["judge"].calls == 3  # cached like the others
    assert again.key_point_steps == on.key_point_steps


def test_key_point_mode_names_the_steps_at_no_call_more(tmp_path, trajectory):
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        v = judge_all(_judge(server, tmp_path, step_rewards=True, outcome_mode="key_point"), [trajectory])[0]
    n = len(split_key_points(v.key_points))
    assert v.usage["judge"].calls == 1 + n and not any(is_follow_up(r) for r in server.requests)
    assert [c.step for c in v.outcome_calls] == v.key_point_steps
    _check_steps(v)
    assert all((c.step is not None) == bool(c.success) for c in v.outcome_calls)


def test_an_unreadable_answer_gives_no_steps_with_its_reason(tmp_path, trajectory):
    judge = make_judge("any_image", "brightness")

    def vague(request: dict) -> str:
        return "Most of them were met at some point." if is_follow_up(request) else judge(request)

    with FakeOpenAI(vague) as server:
        v = judge_all(_judge(server, tmp_path, step_rewards=True), [trajectory])[0]
    assert v.finished and v.success is not None
    assert v.key_point_steps is None and v.step_progress is None
    assert "no line for key point(s)" in v.step_error
    assert any(e.startswith("key point steps: no line") for e in v.errors)


def test_a_failed_follow_up_is_incomplete_and_resumes_from_the_cache(tmp_path, trajectory):
    judge = make_judge("any_image", "brightness")
    down = {"on": True}

    def flaky(request: dict) -> str:
        if down["on"] and is_follow_up(request):
            raise RuntimeError("the follow-up fails")
        return judge(request)

    with FakeOpenAI(flaky) as server:
        first = judge_all(_judge(server, tmp_path, step_rewards=True), [trajectory])[0]
        down["on"] = False
        second = judge_all(_judge(server, tmp_path, step_rewards=True), [trajectory])[0]
    assert not first.finished and first.success is None
    assert any(i.startswith("key point steps:") for i in first.incomplete)
    assert second.finished and second.key_point_steps is not None
    assert second.usage["judge"].calls - second.usage["judge"].cached == 1  # only the follow-up is paid


def test_the_step_fields_hold_on_every_fixture_trajectory(tmp_path):
    """Every real fixture trajectory (AgentLab, Online-Mind2Web v1 and v2, JSONL), in cot and key_point
    modes: one entry per key point and per screenshot, non-decreasing, the last the share of key points met."""
    from keyshot.infer.loaders import load_trajectories
    from tests.support.judge_inputs import ALL_PATHS, N_TRAJECTORIES

    trajectories = [t for path in ALL_PATHS for t in load_trajectories(path)]
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        for mode in ("cot", "key_point"):
            verdicts = judge_all(
                _judge(server, tmp_path / mode, step_rewards=True, outcome_mode=mode), trajectories
            )
            assert len(verdicts) == len(trajectories) == N_TRAJECTORIES
            for v in verdicts:
                assert v.finished and v.step_error is None, (v.task_id, v.errors)
                _check_steps(v)


def test_step_rewards_refuse_reference_mode():
    with pytest.raises(ValueError, match="step_rewards asks a question the reference does not"):
        PipelineConfig(step_rewards=True, parse_mode="reference")


def test_faults_on_the_follow_up_lose_nothing(tmp_path, trajectory):
    with FakeOpenAI(make_judge("any_image", "brightness"), faults=FaultPlan.uniform(0.3, seed=1)) as server:
        v = judge_all(_judge(server, tmp_path, retries=8, step_rewards=True), [trajectory])[0]
    assert v.finished
    _check_steps(v)


def test_the_dry_run_counts_the_step_question(trajectory):
    from keyshot.infer.judge.config import JudgeRunConfig
    from keyshot.infer.judge.estimate import estimate_run
    from keyshot.infer.protocol.images import DEFAULT_POLICY

    def judge_calls(**pipeline) -> tuple[int, int]:
        cfg = JudgeRunConfig(
            judge=EndpointConfig(base_url="http://127.0.0.1:9", model="m", api_key_env=None),
            pipeline=PipelineConfig(**pipeline),
        )
        judge = estimate_run([trajectory], cfg, DEFAULT_POLICY)[0]
        return judge.calls, judge.prompt_tokens

    off, on = judge_calls(), judge_calls(step_rewards=True)
    assert on[0] == off[0] + 1 and on[1] > off[1]
    kp_off, kp_on = (
        judge_calls(outcome_mode="key_point"),
        judge_calls(outcome_mode="key_point", step_rewards=True),
    )
    assert kp_on[0] == kp_off[0] and kp_on[1] > kp_off[1]


def test_a_cut_step_answer_gives_no_steps_and_says_which_limit_to_raise(tmp_path, trajectory):
    judge = make_judge("any_image", "brightness")

    def long_winded(request: dict) -> str:
        return ("Let me think about each page in turn. " * 40) if is_follow_up(request) else judge(request)

    with FakeOpenAI(long_winded) as server:
        v = judge_all(_judge(server, tmp_path, step_rewards=True, outcome_max_tokens=60), [trajectory])[0]
    assert v.success is not None and v.key_point_steps is None
    assert "cut by max_tokens" in v.step_error and "pipeline.outcome_max_tokens" in v.step_error
    assert any(c.startswith("key point steps: cut at") for c in v.cut)
