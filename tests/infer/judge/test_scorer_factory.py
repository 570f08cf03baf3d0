"""keyshot.infer.judge.scorer_factory's back-ends are a registry (scorer.backend): the three of keyshot's,
a back-end registered beside them is built by name, an unknown one stops the run in one line naming the
known ones before anything is recorded, and a name taken is refused."""

from __future__ import annotations

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import load_config
from keyshot.infer.common.registry import DuplicateName
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.scorer_factory import SCORER_BACKENDS, build_scorer
from keyshot.infer.judge.scorers import JUDGE_SCORES
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support.judge_inputs import TINY_CPU, judge_argv


def test_keyshots_back_ends_are_registered():
    assert SCORER_BACKENDS.names() == ("none", "transformers", "openai")


def test_an_unknown_back_end_is_one_line_naming_the_known_ones(tmp_path, capsys):
    with FakeOpenAI(make_judge()) as server:
        code = keyshot(judge_argv(server, tmp_path / "out", **{"scorer.backend": "vllm-direct"}))
        assert server.requests == []  # nothing asked
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "keyshot judge: error: unknown scorer back-end 'vllm-direct' (scorer.backend); known: none, "
        "transformers, openai"
    )
    assert not (tmp_path / "out" / "verdicts.jsonl").exists()


def test_a_registered_back_end_is_built_by_name_and_a_taken_name_refused():
    built = []

    @SCORER_BACKENDS.register("recorded")
    def recorded(cfg, cache, ledger, endpoint, checkpoint):
        built.append(cfg.scorer.backend)
        return JUDGE_SCORES

    try:
        cfg = load_config(JudgeRunConfig, TINY_CPU, ["scorer.backend=recorded", "judge.api_key_env=null"])
        assert build_scorer(cfg, None, UsageLedger()) is JUDGE_SCORES and built == ["recorded"]
        with pytest.raises(DuplicateName, match="scorer back-end 'openai' is registered already"):
            SCORER_BACKENDS.add("openai", recorded)
    finally:
        SCORER_BACKENDS.remove("recorded")


def test_scorer_urls_keep_the_configured_endpoint_and_more_than_one_is_a_pool(tmp_path, capsys):
    """--scorer-url: one URL is the scorer endpoint with the config's settings; two are a pool, each call to
    one of them (both asked here); given with --serve-scorer, refused in one line before any call."""
    from keyshot.infer.judge.scorer_factory import scorer_served_at
    from keyshot.infer.protocol.verdicts import read_verdicts

    cfg = load_config(JudgeRunConfig, TINY_CPU, [])
    one = scorer_served_at(cfg, ["http://10.0.0.7:9000/v1"]).scorer
    assert one.endpoints is None and one.endpoint.base_url == "http://10.0.0.7:9000/v1"
    assert (one.endpoint.model, one.endpoint.max_tokens) == (
        cfg.scorer.endpoint.model,
        cfg.scorer.endpoint.max_tokens,
    )
    with FakeOpenAI(make_judge()) as a, FakeOpenAI(make_judge()) as b:
        argv = judge_argv(a, tmp_path / "out") + ["--scorer-url", a.base_url, "--scorer-url", b.base_url]
        assert keyshot(argv) == 0
        scored = {server: sum("Score" in str(r) for r in server.requests) for server in (a, b)}
        assert all(scored.values()), scored
        assert keyshot([*argv, "--serve-scorer", str(tmp_path)]) == 2
    assert read_verdicts(tmp_path / "out" / "verdicts.jsonl")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "keyshot judge: error: --scorer-url and --serve-scorer: give one (where the scorer is, or what to serve)"
    )
