"""One protocol record: ``run.json``'s (read from the config before any call) and every verdict's (said by the
live judge and scorer) come from one builder and agree key for key, for every kind of scorer."""

from __future__ import annotations

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.client.judge_client import JudgeClient
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.config import load_config
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.scorer_factory import build_scorer
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.runs.run_record import protocol_differences, read_protocol
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths

JUDGE = ["judge.base_url=http://127.0.0.1:9/v1", "judge.model=a-judge", "judge.api_key_env=null"]
SCORER = ["scorer.endpoint.base_url=http://127.0.0.1:9/v1", "scorer.endpoint.model=a-scorer"]
POOL = [
    "scorer.endpoints=[{base_url: 'http://127.0.0.1:8/v1', model: pooled}, "
    "{base_url: 'http://127.0.0.1:9/v1', model: pooled}]"
]
#: what a verdict's config adds to its protocol: the outcome mode a ``combined`` run used for it
PER_VERDICT = ("outcome_mode_used",)

CONFIGS = {
    "served scorer": [*JUDGE, *SCORER],
    "a pool of scorers": [*JUDGE, *POOL, "scorer.min_pixels=200704"],
    "the judge scores (reference)": [*JUDGE, "scorer.backend=none", "pipeline.parse_mode=reference"],
    "judge settings": [
        *JUDGE,
        *SCORER,
        "judge.temperature=0.7",
        "judge.max_tokens=777",
        "judge.seed=5",
        "pipeline.outcome_logprobs=5",
        "pipeline.p_success_threshold=0.6",
        "pipeline.outcome_images=none",
        "pipeline.allow_partial=true",
    ],
    "constrained answers": [*JUDGE, *SCORER, "judge.constrained=true", "scorer.endpoint.constrained=true"],
}


def _same(a: dict, b: dict) -> None:
    assert a == b, protocol_differences(a, b, ("in run.json", "in the verdict"))


def _described(cfg: JudgeRunConfig) -> dict:
    """What a verdict of a run of ``cfg`` carries: the judge and scorer built as ``keyshot judge`` builds them."""
    webjudge = WebJudge(JudgeClient(cfg.judge), build_scorer(cfg, None, UsageLedger()), cfg.pipeline)
    return webjudge.describe()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_verdicts_record_is_the_run_files_record(name):
    cfg = load_config(JudgeRunConfig, None, CONFIGS[name])
    _same(protocol_fingerprint(cfg), _described(cfg))


@pytest.mark.parametrize("backend", ["openai", "transformers"])
def test_a_scorer_checkpoint_is_recorded_alike(scorer_checkpoint, backend):
    """A checkpoint names the scorer, its hash and its image policy in both records (the verdict's said the
    served model's name and the scorer's class, "OpenAIScorer", where run.json said "openai")."""
    extra = SCORER if backend == "openai" else []
    cfg = load_config(
        JudgeRunConfig,
        None,
        [*JUDGE, *extra, f"scorer.backend={backend}", f"scorer.checkpoint={scorer_checkpoint}"],
    )
    recorded = protocol_fingerprint(cfg)
    assert recorded["scorer_backend"] == backend and recorded["scorer_model"] == str(scorer_checkpoint)
    assert recorded["scorer_checkpoint_hash"]
    _same(recorded, _described(cfg))


def test_a_runs_verdicts_carry_its_run_file_record(tmp_path, capsys):
    """``keyshot judge`` end to end, with a scorer endpoint and in the reference configuration: run.json's
    protocol is every verdict's config, key for key (less what a verdict adds of its own)."""
    trajectories = paths.FIXTURES / "trajectories" / "agentlab"
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        base = [f"judge.base_url={server.base_url}", "judge.model=fake-judge", "judge.api_key_env=null"]
        runs = {
            "scorer": [f"scorer.endpoint.base_url={server.base_url}", "scorer.endpoint.model=fake-scorer"],
            "reference": ["scorer.backend=none", "judge.temperature=0.3", "judge.seed=7"],
        }
        for name, extra in runs.items():
            out = tmp_path / name
            argv = ["judge", str(trajectories), "--no-progress", f"out={out}", *base, *extra]
            assert keyshot(argv) == 0, capsys.readouterr().err
            recorded = read_protocol(out)
            verdicts = read_verdicts(out / "verdicts.jsonl")
            assert verdicts
            for v in verdicts:
                _same(recorded, {k: x for k, x in v.config.items() if k not in PER_VERDICT})
