"""The WebJudge pipeline and its result records, on real fixture trajectories.

Judges are the fake OpenAI server (deterministic answers, injected faults); the scorer in the
``slow`` tests is a real vLLM server serving the tiny Qwen2.5-VL.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from dataclasses import dataclass

import pytest

from keyshot.infer.client.judge_client import EndpointConfig, JudgeClient
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.scorers import (
    JUDGE_SCORES,
    OpenAIScorer,
    checkpoint_image_policy,
    expected_score_from_logprobs,
)
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory
from keyshot.infer.protocol.images import REFERENCE_POLICY
from keyshot.infer.protocol.parsing import split_key_points
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import (
    ResumeIndex,
    ScreenshotRecord,
    Verdict,
    VerdictFileError,
    VerdictWriter,
    latest_verdicts,
    read_verdicts,
    select_kept,
)
from keyshot.infer.runs.verdict_sources import read_reference_records
from keyshot.infer.testing.fake_openai import FakeOpenAI, FaultPlan, make_judge, score_image
from tests.support import paths
from tests.support.judge_inputs import agentlab_trajectories, judge_all, judge_client

FIXTURES = paths.FIXTURES
REFERENCE = FIXTURES / "reference_outputs"


def fixture_trajectories() -> list[Trajectory]:
    """Every loadable fixture trajectory: AgentLab, Online-Mind2Web v1/v2, JSONL."""
    out = agentlab_trajectories()
    for name in ("online_mind2web_v1", "online_mind2web_v2", "jsonl"):
        out.extend(load_trajectories(FIXTURES / "trajectories" / name))
    return out


# ---------------------------------------------------------------------------- selection
def _records(scores: list[int | None]) -> list[ScreenshotRecord]:
    return [ScreenshotRecord(index=10 + i, score=s, valid=s is not None) for i, s in enumerate(scores)]


def test_select_kept_threshold_and_order():
    records = _records([1, 3, None, 5, 2, 4])
    assert select_kept(records, 3) == [11, 13, 15]
    assert select_kept(records, 5) == [13]
    assert select_kept(records, 3, mode="reference") == [11, 13, 15]


def test_select_kept_caps_at_50_highest_in_strict_and_first_in_reference():
    scores = [3] * 40 + [5] * 20  # 60 eligible
    records = _records(scores)
    strict = select_kept(records, 3, 50)
    assert len(strict) == 50
    assert strict == sorted(strict)  # shown in trajectory order
    assert all(r.index in strict for r in records[40:])  # every 5 is kept
    assert [r.index for r in records[:30]] == strict[:30]  # then the earliest 3s
    reference = select_kept(records, 3, 50, mode="reference")
    assert reference == [r.index for r in records[:50]]


def test_select_kept_on_expected_score():
    records = _records([4, 2, 3])
    records[0].expected_score, records[1].expected_score, records[2].expected_score = 2.6, 3.4, None
    assert select_kept(records, 3, threshold_on="expected_score") == [11]


def test_split_key_points():
    text = "\n1. Search for shoes  \n2) Filter by size 9\n- Sort by price\n"
    assert split_key_points(text) == ["Search for shoes", "Filter by size 9", "Sort by price"]
    assert split_key_points("just one thing") == ["just one thing"]
    assert split_key_points("\n\n") == []


def test_expected_score_from_logprobs():
    text = "**Reasoning**: a page.\n\n**Score**: 4"
    tokens = ["**", "Reasoning", "**", ":", " a", " page", ".", "\n\n", "**", "Score", "**", ":", " ", "4"]
    assert "".join(tokens) == text
    logprobs = [{"token": t, "logprob": -0.1, "top_logprobs": []} for t in tokens]
    logprobs[-1]["logprob"] = -0.2231435513
    logprobs[-1]["top_logprobs"] = [
        {"token": "4", "logprob": -0.2231435513},  # p = 0.8
        {"token": "5", "logprob": -2.302585093},  # p = 0.1
        {"token": "3", "logprob": -2.302585093},  # p = 0.1
    ]
    assert expected_score_from_logprobs(text, logprobs, 4) == pytest.approx(4.0, abs=1e-6)
    logprobs[-1]["top_logprobs"][1]["logprob"] = -1.6094379124  # 5 now p = 0.2
    assert expected_score_from_logprobs(text, logprobs, 4) == pytest.approx((3.2 + 1.0 + 0.3) / 1.1, abs=1e-6)
    assert expected_score_from_logprobs(text, None, 4) is None
    assert expected_score_from_logprobs("no score here", logprobs, None) is None


# ---------------------------------------------------------------------------- verdict files
def _verdict(task_id: str, agent: str | None = "a", **kw) -> Verdict:
    return Verdict(task_id=task_id, task=f"task {task_id}", agent=agent, **kw)


def test_verdict_roundtrip_and_torn_line(tmp_path, caplog):
    path = tmp_path / "verdicts.jsonl"
    v1 = _verdict(
        "t1", success=True, status_valid=True, screenshots=[ScreenshotRecord(index=0, score=4, valid=True)]
    )
    with VerdictWriter(path) as w:
        w.append(v1)
        w.append(_verdict("t2", success=False, status_valid=True))
    back = read_verdicts(path)
    assert [v.task_id for v in back] == ["t1", "t2"]
    assert back[0].screenshots[0].score == 4 and back[0].usage["judge"].calls == 0
    assert back[0].to_dict() == v1.to_dict()

    # A run killed mid-write leaves a torn last line: readers skip it with a warning...
    with open(path, "ab") as fh:
        fh.write(_verdict("t3").to_json().encode()[:37])
    with caplog.at_level(logging.WARNING):
        assert [v.task_id for v in read_verdicts(path)] == ["t1", "t2"]
    assert "incomplete last line" in caplog.text
    # ...and the next writer cuts it off before appending (saying so), so the file stays valid JSONL.
    caplog.clear()
    with caplog.at_level(logging.WARNING), VerdictWriter(path) as w:
        w.append(_verdict("t3"))
    assert "the last line (37 bytes) is incomplete" in caplog.text and "judged again" in caplog.text
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["task_id"] for line in lines)


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    path = tmp_path / "verdicts.jsonl"
    path.write_text(_verdict("t1").to_json() + "\n{oops\n" + _verdict("t2").to_json() + "\n")
    with pytest.raises(VerdictFileError, match=r"verdicts\.jsonl:2"):
        read_verdicts(path)


def test_resume_index_and_latest():
    failed = _verdict("t1", error="outcome: endpoint 'x': gave up")
    ok = _verdict("t1", success=True, status_valid=True)
    other_agent = _verdict("t2", agent="b", success=False, status_valid=True)
    agentless = _verdict("t3", agent=None, success=True, status_valid=True)
    index = ResumeIndex([failed, other_agent, agentless])
    assert not index.done("t1", "a")  # a failure is judged again
    assert index.done("t2", "b") and not index.done("t2", "a")
    assert index.done("t3", "anyone")  # reference outputs do not name the agent
    latest = latest_verdicts([failed, other_agent, ok])
    assert [(v.task_id, v.success) for v in latest] == [("t1", True), ("t2", False)]


def test_read_reference_outputs():
    om2w = read_reference_records(
        REFERENCE / "WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json"
    )
    assert [v.task_id for v in om2w] == ["om2w-task-a", "om2w-task-b"]
    a, b = om2w
    assert [s.score for s in a.screenshots] == [1, 2, 5, 3, 5, 5]
    assert a.kept == [2, 3, 4, 5] and b.kept == [0, 1]
    assert (a.success, b.success) == (True, False) and a.status_valid
    assert a.screenshots[2].thought and "**Reasoning**" not in a.screenshots[2].thought
    assert a.benchmark == "online_mind2web" and a.agent is None

    arb = read_reference_records(REFERENCE / "arb")
    assert sorted(v.task_id for v in arb) == ["webarena.15", "webarena.171"]
    rec = next(v for v in arb if v.task_id == "webarena.171")
    assert rec.agent == "GenericAgent-anthropic_claude-3.7-sonnet" and rec.benchmark == "webarena"
    assert [s.score for s in rec.screenshots] == [1, 5, 5] and rec.kept == [1, 2]
    assert rec.usage["judge"].prompt_tokens > 0 and rec.config["judge_model"] == "webjudge-7B"
    assert rec.success is not None and rec.reward is not None
    with pytest.raises(VerdictFileError, match="no such file"):
        read_reference_records(REFERENCE / "missing.jsonl")


# ---------------------------------------------------------------------------- reference configuration
def test_reference_configuration_makes_n_plus_2_judge_calls():
    trajectories = fixture_trajectories()
    assert len(trajectories) >= 5
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        webjudge = WebJudge(judge_client(server, max_concurrency=8), scorer=JUDGE_SCORES)
        verdicts = judge_all(webjudge, trajectories)
        assert server.stats.completions_served == sum(t.num_screenshots + 2 for t in trajectories)
    for t, v in zip(trajectories, verdicts, strict=True):
        assert v.finished and v.status_valid, v.errors
        assert v.usage["judge"].calls == t.num_screenshots + 2
        assert v.usage["scorer"].calls == 0
        # The judge's own scores (brightness of the screenshot it was sent) decide what is kept.
        expected = [
            s.index
            for s in t.screenshots
            if score_image("brightness", s.prepare(REFERENCE_POLICY).pil()) >= 3
        ]
        assert v.kept == expected
        assert v.success is bool(expected)  # the fake judge says success iff screenshots were attached
        assert v.config["scorer_backend"] == "none"


def test_the_reference_configuration_is_named_not_implied():
    """No scorer is not a mode: WebJudge refuses None (it switched silently to the judge scoring every
    screenshot under another image policy) and takes JUDGE_SCORES, which says so."""
    with pytest.raises(TypeError, match="JUDGE_SCORES for the reference configuration"):
        WebJudge(JudgeClient(EndpointConfig(base_url="http://127.0.0.1:9/v1", model="j")), None)
    webjudge = WebJudge(
        JudgeClient(EndpointConfig(base_url="http://127.0.0.1:9/v1", model="j")), JUDGE_SCORES
    )
    assert webjudge.policy == REFERENCE_POLICY and webjudge.scorer.role == "judge"
    assert webjudge.describe()["scorer_backend"] == "none" and webjudge.describe()["scorer_model"] is None


def test_outcome_modes_key_point_and_combined():
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge("always_success")) as server:
        kp = judge_all(
            WebJudge(judge_client(server), JUDGE_SCORES, PipelineConfig(outcome_mode="key_point")),
            [trajectory],
        )[0]
        n_points = len(split_key_points(kp.key_points))
        assert n_points >= 1
        assert len(kp.outcome_calls) == n_points
        assert {c.key_point for c in kp.outcome_calls} == set(split_key_points(kp.key_points))
        assert kp.usage["judge"].calls == trajectory.num_screenshots + 1 + n_points
        assert kp.success is True

        def combined_with(most: int) -> Verdict:
            config = PipelineConfig(outcome_mode="combined", combined_max_key_points=most)
            return judge_all(WebJudge(judge_client(server), JUDGE_SCORES, config), [trajectory])[0]

        combined = combined_with(0)
        assert combined.config["outcome_mode_used"] == "cot" and len(combined.outcome_calls) == 1
        combined = combined_with(99)
        assert combined.config["outcome_mode_used"] == "key_point"
        assert len(combined.outcome_calls) == n_points


def test_text_only_outcome_sends_the_descriptions_without_images():
    """outcome_images: none (a deviation): the outcome call carries the kept screenshots' descriptions,
    no image, and the same kept set as with images."""
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        scorer = OpenAIScorer(judge_client(server, model="fake-scorer"), load_prompt_set())
        with_images = judge_all(WebJudge(judge_client(server), scorer), [trajectory])[0]
        server.requests.clear()
        scorer = OpenAIScorer(judge_client(server, model="fake-scorer"), load_prompt_set())
        text_only = judge_all(
            WebJudge(judge_client(server), scorer, PipelineConfig(outcome_images="none")), [trajectory]
        )[0]
    assert text_only.kept == with_images.kept and text_only.kept
    outcome = [r for r in server.requests if "Action History" in json.dumps(r["messages"])]
    assert len(outcome) == 1
    parts = outcome[0]["messages"][1]["content"]
    assert all(p["type"] == "text" for p in parts)
    text = parts[0]["text"]
    assert "The potentially important snapshots of the webpage" in text
    records = {r.index: r for r in text_only.screenshots}
    assert all(records[i].thought in text for i in text_only.kept)
    assert text_only.usage["judge"].prompt_tokens < with_images.usage["judge"].prompt_tokens


def test_p_success_records_what_it_rests_on():
    """The outcome call records how many status words p_success rests on; asked for the top-1 token only, the
    failure word is never among them, and the verdict says its 1.0 is one-sided (it said nothing)."""
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge("always_success")) as server:
        verdicts = {}
        for k in (2, 1):
            scorer = OpenAIScorer(judge_client(server, model="fake-scorer"), load_prompt_set())
            webjudge = WebJudge(judge_client(server), scorer, PipelineConfig(outcome_logprobs=k))
            verdicts[k] = judge_all(webjudge, [trajectory])[0]
    both, top1 = verdicts[2].outcome_calls[0], verdicts[1].outcome_calls[0]
    assert (both.p_success, both.p_success_alternatives, both.p_success_note) == (pytest.approx(0.8), 2, None)
    assert (top1.p_success, top1.p_success_alternatives) == (1.0, 1)
    assert "no failure word among the 1 token returned" in top1.p_success_note
    assert any("outcome: no failure word" in e for e in verdicts[1].errors)
    assert not any("no failure word" in e for e in verdicts[2].errors)


def test_key_point_mode_fails_if_any_point_fails():
    trajectory = agentlab_trajectories()[0]

    judge = make_judge("always_success")

    def one_point_fails(request: dict) -> str:
        text = judge(request)
        user = request["messages"][-1]["content"][0]["text"]
        if (
            text.startswith("Thoughts")
            and "Key Points: " in user
            and user.split("Key Points: ")[1].startswith("Navigate")
        ):
            return 'Thoughts: this key point is not met.\nStatus: "failure"'
        return text

    trajectory.task = "Navigate to the knowledge base, and search for the article"
    with FakeOpenAI(one_point_fails) as server:
        v = judge_all(
            WebJudge(judge_client(server), JUDGE_SCORES, PipelineConfig(outcome_mode="key_point")),
            [trajectory],
        )[0]
    assert [c.success for c in v.outcome_calls].count(False) == 1
    assert v.success is False and v.status_valid


def test_faults_lose_no_trajectory():
    trajectories = fixture_trajectories()
    plan = FaultPlan.uniform(0.2, seed=3)
    with FakeOpenAI(make_judge(), faults=plan, timeout_sleep_s=1.5) as server:
        webjudge = WebJudge(
            judge_client(server, timeout_s=1.0, max_retries=8, max_concurrency=8), scorer=JUDGE_SCORES
        )
        verdicts = judge_all(webjudge, trajectories)
        assert server.stats.total_faults > 0
    assert [v.task_id for v in verdicts] == [t.task_id for t in trajectories]
    assert all(v.finished and v.status_valid for v in verdicts), [v.errors for v in verdicts]


def test_failed_judge_is_recorded_not_dropped(tmp_path):
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge(), faults={"500": 1.0}) as server:
        v = judge_all(WebJudge(judge_client(server, max_retries=1), JUDGE_SCORES), [trajectory])[0]
    assert v.success is None and not v.finished
    assert v.error.startswith("key points:") and "500" in v.error
    assert v.usage["judge"].errors == 1


def test_unreadable_screenshot_is_an_error_on_that_screenshot(tmp_path):
    good = agentlab_trajectories()[0]
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n not really")
    shots = [
        good.screenshots[0],
        Screenshot(path=broken, index=1),
        Screenshot(path=tmp_path / "gone.png", index=2),
    ]
    trajectory = Trajectory(task_id="t-broken", task=good.task, actions=good.actions[:3], screenshots=shots)
    with FakeOpenAI(make_judge()) as server:
        v = judge_all(WebJudge(judge_client(server), JUDGE_SCORES), [trajectory])[0]
        assert server.stats.completions_served == 1 + 1 + 1  # key points, ONE scorer call, outcome
    assert v.finished and v.status_valid
    assert v.screenshots[0].error is None and v.screenshots[0].score is not None
    assert "broken.png" in v.screenshots[1].error and "gone.png" in v.screenshots[2].error
    assert sum("screenshot" in e for e in v.errors) == 2


def test_reference_parse_mode_sends_reference_messages():
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        v = judge_all(
            WebJudge(judge_client(server), JUDGE_SCORES, PipelineConfig(parse_mode="reference")), [trajectory]
        )[0]
        outcome = [r for r in server.requests if "User Task:" in json.dumps(r)][-1]
    assert v.finished and v.config["parse_mode"] == "reference"
    urls = [p["image_url"]["url"] for p in outcome["messages"][-1]["content"] if p["type"] == "image_url"]
    assert v.kept and len(urls) == len(v.kept)
    assert all(u.startswith("data:image/png;base64,") for u in urls)  # the reference's label (defect 1)


def test_pipeline_refuses_a_scorer_on_another_prompt_set():
    with FakeOpenAI(make_judge()) as server:
        client = judge_client(server)
        scorer = OpenAIScorer(client, load_prompt_set("general"))
        with pytest.raises(ValueError, match="prompt set"):
            WebJudge(client, scorer, PipelineConfig(prompt_variant="online_mind2web"))


# ---------------------------------------------------------------------------- with the vLLM scorer
@pytest.mark.slow
def test_two_judge_calls_per_trajectory_with_vllm_scorer(vllm_server, scorer_checkpoint):
    trajectories = agentlab_trajectories()
    assert len(trajectories) == 2
    policy = checkpoint_image_policy(scorer_checkpoint)
    # The untrained model's answers are cut by max_tokens and hold no score: strict mode gives no verdict on
    # them and stops the run (tests/infer/judge/test_evidence.py); reference mode judges anyway, as the reference does.
    with FakeOpenAI(make_judge()) as server:
        scorer = OpenAIScorer(
            JudgeClient(vllm_server.endpoint(max_tokens=16, max_concurrency=4)),
            load_prompt_set(),
            parse_mode="reference",
            policy=policy,
            logprobs=3,
        )
        webjudge = WebJudge(judge_client(server), scorer, PipelineConfig(parse_mode="reference"))
        assert webjudge.policy == policy
        verdicts = judge_all(webjudge, trajectories)
        assert server.stats.completions_served == 2 * len(trajectories)
    for t, v in zip(trajectories, verdicts, strict=True):
        assert v.finished, v.errors
        assert v.usage["judge"].calls == 2
        assert v.usage["scorer"].calls == t.num_screenshots
        assert len(v.screenshots) == t.num_screenshots
        for record in v.screenshots:
            assert record.raw  # the tiny model's (random) answer, recorded
            assert record.visual_tokens <= 64  # the checkpoint's max_pixels: 64 visual tokens
        assert v.config["scorer_model"] == vllm_server.model_name


# ---------------------------------------------------------------------------- screenshots first come, first served
def test_trajectories_in_flight_share_the_image_threads_first_come_first_served():
    """Many trajectories judged at once (a rollout batch, a judge run's concurrency): the screenshots of the
    trajectory that asked first are prepared first, so its scorer calls start while the others' are still
    being prepared (with a thread pool per trajectory every trajectory finished preparing at the end)."""
    events: list[tuple[str, str]] = []

    @dataclass(frozen=True)
    class LoggedShot(Screenshot):
        task_id: str = ""

        def prepare(self, policy=REFERENCE_POLICY):
            events.append(("prepare", self.task_id))
            return super().prepare(policy)

    class LoggedScorer(OpenAIScorer):
        async def score_many(self, task, key_points, images):
            events.append(("score", task))
            return await super().score_many(task, key_points, images)

    source = agentlab_trajectories()[0]
    trajectories = [
        dataclasses.replace(
            source,
            task_id=name,
            task=name,
            screenshots=[LoggedShot(s.path, s.index, task_id=name) for s in source.screenshots],
        )
        for name in ("a", "b", "c", "d")
    ]
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        scorer = LoggedScorer(judge_client(server, model="fake-scorer"), load_prompt_set())
        webjudge = WebJudge(judge_client(server), scorer, PipelineConfig(image_workers=2))

        async def all_at_once():
            try:
                return await asyncio.gather(*(webjudge.judge(t) for t in trajectories))
            finally:
                await webjudge.aclose()

        verdicts = asyncio.run(all_at_once())
    assert all(v.success is not None for v in verdicts)
    prepared = [name for kind, name in events if kind == "prepare"]
    order = list(dict.fromkeys(prepared))  # in the order their key points came back
    assert prepared == [name for name in order for _ in source.screenshots]
    first, last = order[0], order[-1]
    assert ("prepare", last) in events[events.index(("score", first)) :], (
        f"trajectory {first} waited for every other's screenshots"
    )
