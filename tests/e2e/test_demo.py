"""make demo's judging with constrained answers (issue 50) on a real vLLM server (the shared ``vllm_server``,
the tiny untrained model): every score and outcome is read from an answer, run.json and the report say the
answers were constrained, and the AgentLab sample's recorded reward gives the agreement a row."""

from __future__ import annotations

import html
import re

import pytest

from keyshot.infer.common.config import load_config
from keyshot.infer.demo import CONFIGS, MEANINGLESS, SAMPLES, agreement_line, success_rate_line, verdict_table
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.run import run_judge
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, latest_verdicts, read_verdicts
from keyshot.infer.report import build_report
from keyshot.infer.runs.run_record import CONSTRAINED, mark_stand_in, read_protocol

pytestmark = pytest.mark.slow


def test_the_demo_reads_every_answer_of_the_untrained_model(vllm_server, scorer_checkpoint, tmp_path):
    out = tmp_path / "judged"
    cfg = load_config(
        JudgeRunConfig,
        CONFIGS / "judge.yaml",
        [
            f"judge.base_url={vllm_server.base_url}",
            f"judge.model={vllm_server.model_name}",
            f"scorer.endpoint.base_url={vllm_server.base_url}",
            f"scorer.endpoint.model={vllm_server.model_name}",
            f"scorer.checkpoint={scorer_checkpoint}",
            "pipeline.max_kept=1",  # the shared server takes one image per prompt (the demo's takes 4)
            f"out={out}",
        ],
    )
    mark_stand_in(out, MEANINGLESS)
    run_judge([str(SAMPLES)], cfg, progress=False)  # its preflight accepts the vLLM server

    verdicts = latest_verdicts(read_verdicts(out / VERDICTS_FILE))
    assert len(verdicts) == 3
    for v in verdicts:
        assert v.screenshots and all(s.valid and not s.cut and s.score in range(1, 6) for s in v.screenshots)
        assert v.finished and v.status_valid and v.success in (True, False) and v.no_evidence is None
        assert len(v.kept) <= 1
    assert "no readable scores" not in verdict_table(verdicts)
    assert re.fullmatch(
        r"success rate: \d+% \(\d of 3 verdicts that rest on readable scores\)", success_rate_line(verdicts)
    )
    assert "(AgentLab reward): " in agreement_line(verdicts, out)  # the truth's one name

    assert read_protocol(out)[CONSTRAINED] == ["judge", "scorer"]
    index = html.unescape(build_report(out, out / "report", progress=False).read_text())
    assert MEANINGLESS in index
    assert "scorer's answers were constrained to the prompt set's answer format" in index
    agreement = index[index.index("Agreement and success rates") :]
    assert re.search(r"Overall</td>\s*<td[^>]*>1</td>", agreement), agreement[:1500]
