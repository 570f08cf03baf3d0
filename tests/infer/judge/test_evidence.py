"""A verdict needs evidence (docs/architecture.md, "A verdict needs evidence"): an answer cut by max_tokens is a failed call, a run whose
first answers are all cut stops as a configuration error, and a trajectory none of whose screenshot scores
could be read gets no verdict in strict mode (reference mode judges it anyway, warned)."""

from __future__ import annotations

import asyncio
import json

from keyshot.infer.cli import main as keyshot
from keyshot.infer.client.cache import CallCache
from keyshot.infer.judge.calls import Protocol, ask_score
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.scorers import JUDGE_SCORES
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.protocol.prompts import load_prompt_set
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import (
    GARBAGE_TEXT,
    FakeOpenAI,
    identify_step,
    make_judge,
    make_teacher,
)
from tests.support.judge_inputs import (
    N_SCREENSHOTS,
    N_TRAJECTORIES,
    VERBOSE,
    agentlab_trajectories,
    judge_all,
    judge_argv,
    judge_client,
)


def scorer_requests(server: FakeOpenAI) -> int:
    return sum(identify_step(r) == "key_screenshot" for r in server.requests)


# ---------------------------------------------------------------------------- the call
def test_a_cut_answer_is_not_asked_again_and_is_read_as_cut_from_the_cache(tmp_path):
    image = agentlab_trajectories()[0].screenshots[0].prepare(DEFAULT_POLICY)
    protocol = Protocol(load_prompt_set())
    with FakeOpenAI(make_judge(reasoning_words=VERBOSE)) as server, CallCache(tmp_path / "c.sqlite") as cache:
        client = judge_client(server, max_invalid_retries=2)
        client.cache = cache

        async def ask():
            try:
                return await ask_score(
                    client, protocol, "a task", "1. a point", image.data_url, max_tokens=64
                )
            finally:
                await client.aclose()

        first, reading = asyncio.run(ask())
        assert first.cut and not first.valid and first.finish_reason == "length"
        assert "cut by max_tokens" in first.error and first.completion_tokens == 64
        assert not reading.valid and reading.score is None and "cut by max_tokens" in reading.error
        assert server.stats.completions_served == 1  # the validator did not ask again: same limit, same cut
        again, reading = asyncio.run(ask())
        assert again.cached and again.cut and not again.valid and reading.score is None
        assert server.stats.completions_served == 1
        # reference mode reads the cut answer as the reference does (it has no score: 0), and says it was cut
        _, reference = asyncio.run(
            ask_score(client, Protocol(load_prompt_set(), "reference"), "a task", "1. a point", image.data_url,
                      max_tokens=64)
        )  # fmt: skip
        assert reference.score == 0 and not reference.valid and "cut" not in reference.error


# ---------------------------------------------------------------------------- cut answers stop the run
def test_a_verbose_scorer_behind_a_small_max_tokens_stops_the_run_early(tmp_path, capsys):
    out = tmp_path / "run"
    with FakeOpenAI(make_judge(reasoning_words=VERBOSE)) as server:
        assert keyshot(judge_argv(server, out, concurrency="1")) == 2  # a configuration error
        err = capsys.readouterr().err
        asked = scorer_requests(server)
    assert asked < N_SCREENSHOTS  # stopped before paying for the rest
    stop = next(line for line in err.splitlines() if "stopped:" in line)
    assert "the first 8 answers under scorer.endpoint.max_tokens were all cut" in stop
    assert "at up to 64 completion tokens" in stop and "raise scorer.endpoint.max_tokens" in stop
    assert "answers under scorer.endpoint.max_tokens were cut by max_tokens" in err
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert all(v.success is None and not v.finished for v in verdicts)  # no verdict from cut answers
    assert all(v.no_evidence and "cut by max_tokens" in v.no_evidence for v in verdicts)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["success"] == summary["failure"] == 0 and summary["success_rate"] is None
    assert summary["run"]["exit_code"] == 2 and summary["cut_answers"] == sum(len(v.cut) for v in verdicts)
    assert summary["unreadable_scores"] == 0  # cut answers are counted as cut, not as answers without score
    [cut] = summary["run"]["cut_answers"]
    assert cut["setting"] == "scorer.endpoint.max_tokens" and cut["cut"] == cut["answers"] >= 8
    assert cut["cut_tokens"] == cut["longest_tokens"] == 64
    markdown = (out / "summary.md").read_text()
    assert "**Stopped:**" in markdown and "| success rate |" in markdown and "n/a" in markdown

    # The fix the message names: a larger limit judges everything (the cut answers' keys differ).
    with FakeOpenAI(make_judge(reasoning_words=VERBOSE)) as server:
        assert keyshot(judge_argv(server, out, **{"scorer.endpoint.max_tokens": "1024"})) == 0
    final = json.loads((out / "summary.json").read_text())
    assert final["trajectories"] == N_TRAJECTORIES and final["success"] + final["failure"] == N_TRAJECTORIES
    assert final["run"]["judged"] == N_TRAJECTORIES and not final["run"]["cut_answers"]


def test_a_cut_judge_answer_makes_the_trajectory_incomplete():
    trajectory = agentlab_trajectories()[0]
    with FakeOpenAI(make_judge()) as server:
        webjudge = WebJudge(judge_client(server), JUDGE_SCORES, PipelineConfig(outcome_max_tokens=3))
        [v] = judge_all(webjudge, [trajectory])
    assert v.success is None and not v.finished
    assert v.error.startswith("outcome: answer cut by max_tokens after 3 tokens")
    assert "raise pipeline.outcome_max_tokens" in v.error
    assert v.cut == ["outcome: cut at 3 tokens (pipeline.outcome_max_tokens)"]
    assert [r["setting"] for r in webjudge.cut_report()] == ["pipeline.outcome_max_tokens"]


# ---------------------------------------------------------------------------- no verdict without evidence
def test_verdicts_only_where_a_score_was_read(tmp_path, capsys):
    out = tmp_path / "run"
    teacher = make_teacher("brightness", garbage_rate=0.5, seed=6)  # half the answers have no score
    with FakeOpenAI(teacher) as server:
        argv = judge_argv(server, out, **{"scorer.endpoint.max_tokens": "1024"})
        assert keyshot(argv) == 3  # not complete: some trajectories have no verdict
        err = capsys.readouterr().err
        paid = server.stats.completions_served
        verdicts = read_verdicts(out / "verdicts.jsonl")
        blind = [v for v in verdicts if not any(s.valid for s in v.screenshots)]
        assert 0 < len(blind) < N_TRAJECTORIES  # the seed gives both kinds
        for v in verdicts:
            if v in blind:
                assert (
                    v.success is None
                    and not v.finished
                    and v.no_evidence == v.error.split(": ", 1)[1].split(";")[0]
                )
                n = len(v.screenshots)
                assert (
                    v.no_evidence
                    == f"no readable scores: {n} of {n} answers had no score (0 cut by max_tokens)"
                )
                assert v.outcome_calls == [] and v.usage["judge"].calls == 1  # no outcome paid on no evidence
            else:
                assert v.finished and v.success is not None and v.no_evidence is None
        summary = json.loads((out / "summary.json").read_text())
        garbage = sum(s.raw == GARBAGE_TEXT for v in verdicts for s in v.screenshots)
        assert summary["unreadable_scores"] == garbage > 0 and summary["cut_answers"] == 0
        assert summary["no_readable_scores"] == summary["incomplete"] == len(blind)
        assert summary["success"] + summary["failure"] == N_TRAJECTORIES - len(blind)
        assert summary["success_rate"] == summary["success"] / (N_TRAJECTORIES - len(blind))
        noun = "trajectory has" if len(blind) == 1 else "trajectories have"
        assert f"{len(blind)} {noun} no readable scores" in err
        markdown = (out / "summary.md").read_text()
        assert "## No readable scores (no verdict; the next run judges them again)" in markdown
        assert "Incomplete trajectories" not in markdown

        # The next run judges again exactly those, every call from the cache.
        assert keyshot(argv) == 3
        again = json.loads((out / "summary.json").read_text())
        assert again["run"]["judged"] == len(blind) and again["run"]["skipped"] == N_TRAJECTORIES - len(blind)
        assert server.stats.completions_served == paid


def test_reference_mode_judges_without_evidence_but_says_so(caplog):
    trajectory = agentlab_trajectories()[0]
    every_answer_unreadable = make_teacher("brightness", garbage_rate=1.0)
    with FakeOpenAI(every_answer_unreadable) as server:
        [strict] = judge_all(WebJudge(judge_client(server), JUDGE_SCORES), [trajectory])
        strict_calls = server.stats.completions_served
        [reference] = judge_all(
            WebJudge(judge_client(server), JUDGE_SCORES, PipelineConfig(parse_mode="reference")), [trajectory]
        )
    n = trajectory.num_screenshots
    assert strict_calls == 1 + n  # key points and the scores; no outcome call on no evidence
    assert strict.success is None and not strict.finished and strict.no_evidence
    # reference: every score is 0, nothing is kept, and the judge decides anyway, as the reference does
    assert reference.finished and reference.success is False and reference.kept == []
    assert reference.no_evidence == strict.no_evidence
    assert any("judged anyway: parse_mode=reference" in e for e in reference.errors)
    assert "judged anyway (parse_mode=reference" in caplog.text
