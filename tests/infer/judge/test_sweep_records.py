"""What ``keyshot sweep`` records is what it sent: a δ folder's run.json is the run.json of a ``keyshot judge``
run at that δ with the same settings (plus ``swept_from``), a resumed sweep with other judge settings and a
pipeline setting the judged folder was not judged with are refused before any call, and the judged
trajectories are read again as the judged run read them (its agent, benchmark and ``--allow-outside``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import load_config
from keyshot.infer.common.errors import EXIT_PREFLIGHT
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.sweep_source import SWEPT_FROM
from keyshot.infer.judge.threshold_sweep import delta_folder, run_sweep
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.runs.run_record import PROTOCOL, RUN_FILE, protocol_differences
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from tests.support.nameless_inputs import nameless_inputs

JUDGE_SETTINGS = ["judge.temperature=0.9", "judge.max_tokens=777", "judge.seed=5"]


def _run_file(folder: Path) -> dict:
    return json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """Trajectories in a JSONL file whose screenshots lie outside its folder, naming no agent or benchmark,
    judged with ``agent=``, ``benchmark=`` and ``--allow-outside`` (a fake judge and scorer)."""
    root = tmp_path_factory.mktemp("sweep-records")
    inputs, screenshots = nameless_inputs(root, [3, 5, 2, 6])
    server = FakeOpenAI(make_judge("any_image", "brightness")).__enter__()
    base = [
        f"judge.base_url={server.base_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        "judge.backoff_base_s=0.01",
        f"scorer.endpoint.base_url={server.base_url}",
        "scorer.endpoint.model=fake-scorer",
        "scorer.endpoint.api_key_env=null",
        "agent=my-agent",
        "benchmark=my-bench",
    ]
    reading = [str(inputs), "--allow-outside", str(screenshots), "--no-progress"]
    judged = root / "judged"
    assert keyshot(["judge", *reading, *base, f"out={judged}"]) == 0
    yield {"root": root, "server": server, "base": base, "reading": reading, "judged": judged}
    server.__exit__(None, None, None)


def test_a_delta_folder_records_what_a_judge_run_at_that_delta_records(world, capsys):
    server, base, root = world["server"], world["base"], world["root"]
    out = root / "sweep"
    server.requests.clear()
    argv = ["sweep", str(world["judged"]), "--out", str(out), "--deltas", "2,3", "--no-progress"]
    assert keyshot([*argv, *base, *JUDGE_SETTINGS]) == 0, capsys.readouterr().err
    sent = [r for r in server.requests if identify_step(r) == "outcome"]
    assert sent and all((r["temperature"], r["max_tokens"], r["seed"]) == (0.9, 777, 5) for r in sent)
    result = json.loads((out / "sweep.json").read_text())
    # it said before any call what it would pay, and why the judged run's own answers do not count
    printed = capsys.readouterr().out
    said = f"Before any call: at most {len(sent)} outcome calls to pay (one outcome call per trajectory)."
    assert printed.index(said) < printed.index("| δ |")
    assert "for the judge settings it was sent with (judge_max_tokens 1024 there, 777 here; " in printed
    assert "judge_temperature 0.0 there, 0.9 here" in printed and printed.count("): paid.") == 1
    # read again as the judged run read them: its --allow-outside and agent= (they were all "not readable")
    assert result["not_swept"] == {} and result["sweepable"] == 4
    for delta in (2, 3):
        scratch = root / f"scratch-{delta}"
        judge = ["judge", *world["reading"], *base, *JUDGE_SETTINGS, f"pipeline.threshold={delta}"]
        assert keyshot([*judge, f"out={scratch}"]) == 0
        swept, judged = _run_file(delta_folder(out, delta)), _run_file(scratch)
        assert swept[PROTOCOL].pop(SWEPT_FROM) == str(world["judged"])
        assert swept == judged, protocol_differences(swept[PROTOCOL], judged[PROTOCOL], ("swept", "judged"))
        verdicts = read_verdicts(delta_folder(out, delta) / "verdicts.jsonl")
        assert {v.agent for v in verdicts} == {"my-agent"} and {v.benchmark for v in verdicts} == {"my-bench"}
        for v in verdicts:
            recorded = {k: x for k, x in v.config.items() if k not in ("outcome_mode_used", SWEPT_FROM)}
            assert recorded == judged[PROTOCOL]


def test_constrained_answers_are_recorded_as_sent(world, capsys):
    """``judge.constrained=true``: the requests carry the answer format and the δ protocol says so, as
    keyshot judge's run.json would (its protocol_fingerprint; its preflight wants a real vLLM)."""
    server, base, root = world["server"], world["base"], world["root"]
    out = root / "sweep-constrained"
    server.requests.clear()
    argv = ["sweep", str(world["judged"]), "--out", str(out), "--deltas", "4", "--no-progress"]
    # the command's preflight refuses the fake judge (not a vLLM), as keyshot judge's: the library sends
    assert keyshot([*argv, *base, "judge.constrained=true"]) == EXIT_PREFLIGHT
    assert "judge.constrained=true needs a vLLM server" in capsys.readouterr().err and not out.exists()
    cfg = load_config(JudgeRunConfig, None, [*base, "judge.constrained=true"])
    run_sweep(world["judged"], cfg, [4.0], out, progress=False)
    sent = [r for r in server.requests if identify_step(r) == "outcome"]
    assert sent and all("structured_outputs" in r for r in sent)
    swept = _run_file(delta_folder(out, 4))[PROTOCOL]
    swept.pop(SWEPT_FROM)
    cfg = load_config(JudgeRunConfig, None, [*base, "judge.constrained=true", "pipeline.threshold=4"])
    assert swept == protocol_fingerprint(cfg) and swept["constrained_answers"] == ["judge"]


def test_other_settings_are_refused_before_any_call(world, capsys, caplog):
    """A resumed sweep with another judge temperature, and a pipeline override the folder was not judged
    with, are refused in one line naming them; a setting equal to the folder's is taken, and a config
    file's gives way to the folder's, said once."""
    server, base, root = world["server"], world["base"], world["root"]
    out = root / "sweep-refused"
    argv = ["sweep", str(world["judged"]), "--out", str(out), "--deltas", "2", "--no-progress", *base]
    assert keyshot([*argv, "pipeline.outcome_mode=cot"]) == 0
    before = server.stats.requests
    capsys.readouterr()
    assert keyshot([*argv, "judge.temperature=0.5"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "judge_temperature: 0.0 in the folder, 0.5 now" in err
    assert keyshot([*argv, "pipeline.outcome_mode=key_point", "pipeline.max_kept=10"]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert (
        "pipeline.outcome_mode='key_point' (override 'pipeline.outcome_mode=key_point') where it was 'cot'"
        in err
    )
    assert "pipeline.max_kept=10" in err and "where it was 50" in err
    # a config file's setting gives way to the folder's, said once (a shipped config sweeps any folder)
    config = root / "other.yaml"
    config.write_text("pipeline:\n  outcome_images: none\n")
    caplog.set_level(logging.WARNING)
    assert keyshot([*argv, "--config", str(config)]) == 0
    said = [r.getMessage() for r in caplog.records if "give way" in r.getMessage()]
    assert said == [
        f"{config}'s pipeline settings give way to the judged folder's (a sweep changes only δ): "
        "outcome_images 'none' -> 'scorer'"
    ]
    assert server.stats.requests == before  # finished there already: nothing asked, no preflight
    assert len(read_verdicts(delta_folder(out, 2) / "verdicts.jsonl")) == 4
