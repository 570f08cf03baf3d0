"""One count everywhere (issue 35 item 6): a run judged in reference parse mode where some trajectories have
no readable screenshot score (judged anyway) and one screenshot repeats. The terminal's lines,
summary.json, summary.md, the report's tiles, table and matrix input, and keyshot metrics give the same
numbers, each from :mod:`keyshot.infer.runs.counts`; the scorer's answers add up to the requests the
server saw, the cache and the identical screenshot scored once."""

from __future__ import annotations

from tests.support import paths

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.demo import outcome_counts, verdict_table
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.runs.counts import split_text, total_split
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge, make_teacher
from keyshot.infer.testing.worlds import synthetic_trajectories

REPO = paths.REPO
N = 8


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("counts")
    jsonl = synthetic_trajectories(root / "world", N, 3, seed=2)
    lines = [json.loads(line) for line in jsonl.read_text().splitlines()]
    for i, line in enumerate(lines):
        line["human_label"] = "failure" if i % 3 == 0 else "success"
    lines[2]["screenshots"][1] = lines[2]["screenshots"][0]  # the same image twice: scored once
    jsonl.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = root / "run"
    # about half the screenshots are answered without a score: some trajectories have none readable
    with FakeOpenAI(make_judge()) as judge, FakeOpenAI(make_teacher(garbage_rate=0.6, seed=3)) as scorer:
        argv = ["judge", str(jsonl), "--config", str(REPO / "configs/judge/webjudge7b.yaml"), "--no-progress"]
        argv += [f"out={out}", f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]
        argv += ["judge.model=fake-judge", f"scorer.endpoint.base_url={scorer.base_url}"]
        argv += ["scorer.endpoint.model=fake-scorer", "pipeline.parse_mode=reference"]
        assert keyshot(argv) == 0
        sent = sum(identify_step(r) == "key_screenshot" for r in scorer.requests)
    assert keyshot(["report", str(out), "--no-progress"]) == 0
    assert keyshot(["metrics", str(out), "--out", str(root / "metrics")]) == 0
    return {
        "out": out,
        "summary": json.loads((out / "summary.json").read_text()),
        "markdown": (out / "summary.md").read_text(),
        "metrics": json.loads((root / "metrics" / "metrics.json").read_text()),
        "index": (out / "report" / "index.html").read_text(),
        "scorer_requests": sent,
    }


def test_every_artefact_counts_the_outcomes_alike(run):
    s = run["summary"]
    judged = s["judged_without_scores"]
    assert 0 < judged < N and s["no_readable_scores"] == 0  # reference mode: judged anyway, none left
    outcomes = {
        "success": s["success"],
        "failure": s["failure"],
        "no-status": s["no_status"],
        "no-scores": judged,
        "incomplete": s["failed_calls"],
    }
    assert sum(outcomes.values()) == s["trajectories"] == N
    assert s["success_rate"] == s["success"] / (s["success"] + s["failure"] + s["no_status"])

    row = f"| {N} | {s['success']} | {s['failure']} | {s['no_status']} | {judged} ({judged} judged anyway) | 0 |"
    assert row in run["markdown"]

    # the report: its table's rows (which the matrix is drawn from) and its tiles
    rows = json.loads(
        re.search(r'<script id="rows" type="application/json">(.*?)</script>', run["index"]).group(1)
    )
    assert Counter(r["verdict"] for r in rows) == +Counter(outcomes)
    assert sum(r["judged"] is not None for r in rows) == judged
    tiles = dict(
        (label, n)
        for n, label in re.findall(r'<div class="n">([^<]*)</div><div class="l">([^<]*)</div>', run["index"])
    )
    assert tiles["success"] == str(s["success"]) and tiles["failure"] == str(s["failure"])
    assert tiles["no readable scores"] == str(judged) and tiles["failed calls"] == "0"

    # metrics count only verdicts resting on readable scores, and say how many they left out
    m = run["metrics"]
    assert m["dropped"] == {"no readable scores": judged}
    assert m["n_used"] == s["success"] + s["failure"] + s["no_status"]
    assert any(f"{judged} of {N} verdicts rest on no readable screenshot score" in n for n in m["notes"])

    # the terminal's lines (the demo prints them)
    verdicts = read_verdicts(run["out"] / "verdicts.jsonl")
    line = outcome_counts(verdicts)
    assert (
        f"{s['success']} success, {s['failure']} failure, {s['no_status']} verdict without a status, " in line
    )
    assert f"{judged} no readable scores, 0 failed calls ({judged} of them judged anyway" in line
    assert verdict_table(verdicts).count("no readable scores (judged anyway") == judged


def test_scorer_answers_add_up_to_requests_cache_and_identical_screenshots(run):
    calls = run["summary"]["calls"]["scorer"]
    usage = run["summary"]["usage"]["scorer"]
    assert calls["answers"] == usage["calls"] == calls["sent"] + calls["cache_hits"] + calls["same_image"]
    assert calls["same_image"] == 1 and calls["sent"] == run["scorer_requests"]  # what the server saw
    assert f"| scorer | {calls['answers']} | {calls['sent']} | {calls['cache_hits']} | 1 |" in run["markdown"]
    verdicts = read_verdicts(run["out"] / "verdicts.jsonl")
    assert split_text(total_split(verdicts, "scorer"), "scorer") == (
        f"{calls['answers']} scorer answers: {calls['sent']} sent, {calls['cache_hits']} from the cache, "
        "1 identical screenshots scored once"
    )
    tiles = run["index"]
    assert f"{calls['sent']} / {calls['cache_hits']} / 1" in tiles
