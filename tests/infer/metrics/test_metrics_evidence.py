"""Metrics count only verdicts built on evidence (issue 28): a trajectory without readable scores, or whose
calls failed, is dropped with its reason, not counted as a failure; a finished run's verdict whose status
could not be read still counts as a failure, as AgentRewardBench counts it. A reference-mode verdict judged
without a readable score (issue 35) counts with the trajectories without readable scores."""

from __future__ import annotations

import json
import subprocess
import sys

from keyshot.infer.metrics.compute import (
    INCOMPLETE,
    NO_READABLE_SCORES,
    compute_metrics,
    records_from_verdicts,
)
from keyshot.infer.protocol.verdicts import ScreenshotRecord, Verdict, VerdictWriter, missing_evidence
from tests.support import paths

REPO = paths.REPO


def _unscored(index: int) -> ScreenshotRecord:
    return ScreenshotRecord(index=index, raw="I think it is relevant", error="no score", visual_tokens=64)


def verdicts() -> list[Verdict]:
    shots = [_unscored(0), _unscored(1)]
    no_scores = missing_evidence(shots)
    return [
        Verdict("judged-success", "t", agent="A", success=True, status_valid=True),
        Verdict("judged-failure", "t", agent="A", success=False, status_valid=True),
        # strict mode: no screenshot score read, so no verdict (error set: the next run judges it again)
        Verdict("no-scores", "t", agent="A", screenshots=shots, error=no_scores, no_evidence=no_scores),
        # a call failed for good: incomplete
        Verdict("failed-call", "t", agent="A", error="judge call failed", incomplete=["outcome"]),
        # the judge answered in full, its status unreadable: a failure, as AgentRewardBench counts it
        Verdict("no-status", "t", agent="A", status_valid=False),
        # reference mode judges without scores (the reference's behaviour): the verdict is kept in the
        # run, but it rests on no screenshot score, so metrics count it with the no-readable-scores ones
        Verdict(
            "reference",
            "t",
            agent="A",
            success=True,
            status_valid=True,
            screenshots=shots,
            no_evidence=no_scores,
        ),
    ]


LABELS = {
    (task, "a"): "success"
    for task in ("judged-success", "judged-failure", "no-scores", "failed-call", "no-status", "reference")
}


def test_verdicts_without_evidence_are_dropped_with_their_reason_not_counted_as_failures():
    report = compute_metrics(records_from_verdicts(verdicts(), human_labels=LABELS))
    assert report.n_records == 6 and report.n_used == 3
    assert report.dropped == {INCOMPLETE: 1, NO_READABLE_SCORES: 2}
    overall = report.row("agreement", "Overall")
    assert overall.n == 3 and overall.n_no_verdict == 1  # the unreadable status, counted as failure
    assert overall.judge_sr == 1 / 3 and overall.human_sr == 1.0  # 1 success of 3, not of 6
    classification = report.row("classification", "Overall")
    assert (classification.tp, classification.fn) == (1, 2)


def test_keyshot_metrics_names_the_dropped_reasons(tmp_path):
    path = tmp_path / "verdicts.jsonl"
    with VerdictWriter(path, fsync=False) as writer:
        for v in verdicts():
            writer.append(v)
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps({task: {"label": 1, "agent": "A"} for task, _ in LABELS}))
    out = tmp_path / "metrics"
    argv = [sys.executable, "-m", "keyshot.infer.cli", "metrics", str(path), "--human-labels", str(labels)]
    done = subprocess.run([*argv, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"dropped: {INCOMPLETE} 1, {NO_READABLE_SCORES} 2" in done.stdout, done.stdout
    assert "| **Overall** | 3 | 1 | 33.3 | 100.0 | 33.3 | 66.7 |" in done.stdout, done.stdout
    assert "1 judged anyway, parse_mode=reference" in done.stdout, done.stdout
