"""One home for every fact (issue 63, point 4): a default, a rule or a pin written in one place and read
everywhere else. Each test fails when a copy comes back and drifts: the places that read the fact are
compared with its home, not with a number written here again."""

from __future__ import annotations

import argparse
import inspect
import re
import subprocess
import sys

import pytest

from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.judge.config import JudgeRunConfig
from tests.support import paths

REPO = paths.REPO
TINY_JUDGE = REPO / "configs" / "judge" / "tiny_cpu.yaml"


def test_the_tall_page_rule_has_one_default():
    """max_aspect: the image policy's, the training data's and the processor's policy take one default."""
    from keyshot.infer.protocol.chat_template import image_policy_for
    from keyshot.infer.protocol.images import DEFAULT_MAX_ASPECT, ImagePolicy
    from keyshot.train.train_config import DataSettings

    assert ImagePolicy().max_aspect == DEFAULT_MAX_ASPECT
    assert DataSettings().max_aspect == DEFAULT_MAX_ASPECT
    assert inspect.signature(image_policy_for).parameters["max_aspect"].default == DEFAULT_MAX_ASPECT


def _refused_setting(*overrides: str) -> str:
    with pytest.raises(ConfigError, match="leaves no room") as refused:
        load_config(JudgeRunConfig, TINY_JUDGE, ["pipeline.parse_mode=strict", *overrides])
    return re.search(r"JudgeRunConfig: ([\w.\[\]]+)=\d+ leaves no room", str(refused.value)).group(1)


def _named_when_cut(*overrides: str) -> tuple[str, str, str]:
    """The settings a run names a cut key-points, outcome and scorer answer under."""
    from keyshot.infer.client.judge_client import JudgeClient
    from keyshot.infer.client.usage import UsageLedger
    from keyshot.infer.judge.pipeline import WebJudge
    from keyshot.infer.judge.scorer_factory import build_scorer

    cfg = load_config(JudgeRunConfig, TINY_JUDGE, ["scorer.checkpoint=null", *overrides])
    ledger = UsageLedger()
    webjudge = WebJudge(JudgeClient(cfg.judge, None, ledger), build_scorer(cfg, None, ledger), cfg.pipeline)
    return (
        webjudge._judge_setting("key_points"),
        webjudge._judge_setting("outcome"),
        webjudge.scorer.max_tokens_setting,
    )


@pytest.mark.filterwarnings("ignore")
def test_the_setting_that_limits_an_answer_is_named_alike_by_the_config_and_the_run():
    """The config's check of constrained answers and a run's cut answers name the same setting: the
    judge step's own limit or the judge's, scorer.max_tokens or the endpoint's."""
    judge = ["judge.constrained=true"]
    scorer = ["scorer.endpoint.constrained=true"]
    outcome_set = _named_when_cut("pipeline.outcome_max_tokens=500")
    assert _refused_setting(*judge, "pipeline.outcome_max_tokens=5") == outcome_set[1]
    assert _refused_setting(*judge, "judge.max_tokens=5") == _named_when_cut()[0]
    assert _refused_setting(*scorer, "scorer.max_tokens=3") == _named_when_cut("scorer.max_tokens=500")[2]
    assert _refused_setting(*scorer, "scorer.endpoint.max_tokens=3") == _named_when_cut()[2]


def test_the_miniwob_check_opens_the_sessions_default_task():
    """``python -m keyshot.env.miniwob`` without a task opens the task a session opens by default."""
    from keyshot.env.miniwob.__main__ import COMMAND
    from keyshot.env.miniwob.settings import SessionSettings

    parsed = COMMAND.configure(argparse.ArgumentParser()).parse_args([])
    assert parsed.task == SessionSettings().task


def test_the_cost_of_tokens_and_the_characters_a_token_have_one_home():
    """The synthesis estimate prices tokens as the ledger does, and both estimates count characters alike."""
    from keyshot.data_synth.estimate import EndpointEstimate
    from keyshot.data_synth.teachers import TeacherConfig
    from keyshot.infer.client.endpoint import EndpointConfig
    from keyshot.infer.client.usage import CHARS_PER_TOKEN, token_cost_usd
    from keyshot.infer.judge import estimate as judge_estimate

    endpoint = EndpointConfig(
        base_url="http://127.0.0.1:9/v1", model="m", price_input_per_mtok=2.5, price_output_per_mtok=10.0
    )
    teacher = TeacherConfig(endpoint=endpoint, est_output_tokens=300)
    estimate = EndpointEstimate("m")
    estimate.add(teacher, 12_345)
    assert estimate.cost_usd == token_cost_usd(12_345, 300, 2.5, 10.0)
    assert teacher.chars_per_token == CHARS_PER_TOKEN == judge_estimate.CHARS_PER_TOKEN


def test_a_benchmark_page_and_the_gpu_kit_name_the_commit_alike(monkeypatch):
    """bench/record.py is the one lookup of the commit measured, $KEYSHOT_COMMIT first (a packed archive)."""
    from bench import record

    monkeypatch.setenv("KEYSHOT_COMMIT", "0123abc")
    assert record.commit() == "0123abc"
    monkeypatch.delenv("KEYSHOT_COMMIT")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    assert record.commit().startswith(head.stdout.strip() or "unknown")
    others = [
        p
        for p in (REPO / "bench").rglob("*.py")
        if p.name != "record.py" and '"rev-parse"' in p.read_text()  # a git call, not prose
    ]
    assert not others, f"{others} look the commit up again: use bench.record.commit"


def test_the_cpu_torch_build_is_pinned_in_the_constraints_alone():
    """The Makefile and the set-up scripts take torch's and torchvision's pins from .ci/constraints-cpu.txt."""
    constraints = (REPO / ".ci" / "constraints-cpu.txt").read_text()
    pinned = re.findall(r"^(torch(?:vision)?==\S+)$", constraints, re.M)
    assert len(pinned) == 2
    for path in [REPO / "Makefile", *sorted((REPO / "tools").glob("setup_*.sh"))]:
        copies = re.findall(r"torch(?:vision)?==[\w.+]+", path.read_text())
        assert not copies, f"{path.relative_to(REPO)} pins {copies}: read them from .ci/constraints-cpu.txt"
    printed = subprocess.run(
        [sys.executable, str(REPO / "tools" / "pyproject_deps.py"), "--cpu-pins", "torch", "torchvision"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert printed.stdout.split() == pinned


def test_the_routes_the_architecture_names_are_the_ones_the_reward_service_serves():
    service = (REPO / "reward" / "service.py").read_text()
    served = set(re.findall(r'@app\.(?:get|post)\("(/[^"]*)"\)', service))
    named = set(re.findall(r"`(/[a-z_][\w/]*)`", (REPO / "docs" / "architecture.md").read_text()))
    assert served and named and named <= served, f"docs/architecture.md names {sorted(named - served)}"


def test_the_documents_the_code_cites_are_in_the_repository():
    """A docstring or comment that cites docs/NAME.md or DESIGN.md names a file this repository has."""
    cited = []
    for folder in ("infer", "data_synth", "train", "reward", "env", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            text = path.read_text()
            for name in re.findall(r"\b(docs/[\w-]+\.md|DESIGN\.md|PROTOCOL\.md)", text):
                if not (REPO / name).is_file():
                    cited.append(f"{path.relative_to(REPO)}: {name}")
    assert not cited, f"cited but not in the repository: {cited}"
