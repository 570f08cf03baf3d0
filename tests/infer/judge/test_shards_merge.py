"""Scale-out: ``judge --shard I/N`` + ``keyshot merge`` equal one process; the scorer pool fails over.

Every run here goes through the real CLI against the fake OpenAI server (judge and scorer roles).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.client.judge_client import EndpointConfig
from keyshot.infer.client.pool import EndpointPool
from keyshot.infer.judge.threshold_sweep import delta_folder
from keyshot.infer.protocol.verdicts import VERDICTS_FILE, read_verdicts
from keyshot.infer.runs.run_record import INPUTS, RUN_FILE
from keyshot.infer.runs.shards import ShardError, ShardSpec, shard_key, shard_of
from keyshot.infer.runs.summary import summarize
from keyshot.infer.testing.fake_openai import (
    FakeOpenAI,
    echo_responder,
    judge_responder,
    make_judge,
    spawn_fake_openai,
)
from keyshot.infer.testing.watch import kill_when, line_count
from tests.support import paths
from tests.support.nameless_inputs import nameless_inputs
from tests.support.shard_runs import agent_inputs, comparable, judge_config, totals

REPO = paths.REPO


def _rounded(value):
    if isinstance(value, float):
        return round(value, 9)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def test_shard_spec_parses_and_refuses():
    assert ShardSpec.parse("3/8") == ShardSpec(3, 8)
    assert ShardSpec.parse(" 0 / 1 ").folder == "shard-0-of-1"
    assert ShardSpec(3, 12).folder == "shard-03-of-12"
    for bad in ("8/8", "-1/4", "1", "a/b", "1/0"):
        with pytest.raises(ShardError, match="--shard"):
            ShardSpec.parse(bad)


def test_shard_of_a_slurm_array_task():
    whole = {
        "SLURM_ARRAY_TASK_ID": "2",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "7",
        "SLURM_ARRAY_TASK_COUNT": "8",
    }
    assert ShardSpec.parse("slurm", whole) == ShardSpec(2, 8)
    partial = {
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_ARRAY_TASK_MIN": "3",
        "SLURM_ARRAY_TASK_MAX": "7",
        "SLURM_ARRAY_TASK_COUNT": "2",
    }
    with pytest.raises(ShardError, match="SHARDS=N"):
        ShardSpec.parse("slurm", partial)
    assert ShardSpec.parse("slurm", {**partial, "SHARDS": "8"}) == ShardSpec(3, 8)
    with pytest.raises(ShardError, match="not a SLURM array task"):
        ShardSpec.parse("slurm", {})


def test_shards_are_stable_when_trajectories_are_added():
    keys = [shard_key(f"task-{i}", "agent", None, "trajectory") for i in range(2000)]
    before = {k: shard_of(k, 8) for k in keys[:1000]}
    after = {k: shard_of(k, 8) for k in keys}  # twice the input: the first thousand stay put
    assert all(after[k] == s for k, s in before.items())
    counts = [sum(1 for s in after.values() if s == i) for i in range(8)]
    assert min(counts) > 2000 / 8 * 0.8, counts  # and the hash spreads them
    # by task (default), every run of a task lands in one shard
    assert len({shard_of(shard_key("t1", a, r, "task"), 8) for a in "abc" for r in "xyz"}) == 1


def test_merged_shards_equal_one_process(tmp_path, capsys):
    inputs = agent_inputs(tmp_path)
    with FakeOpenAI(judge_responder) as server:
        cfg = judge_config(tmp_path, {"base_url": server.base_url})
        assert (
            keyshot(["judge", *inputs, "--config", cfg, "--out", str(tmp_path / "one"), "--no-progress"]) == 0
        )
        single_requests = len(server.requests)
        server.requests.clear()
        for i in range(3):
            code = keyshot(
                [
                    "judge",
                    *inputs,
                    "--config",
                    cfg,
                    "--out",
                    str(tmp_path / "many"),
                    "--shard",
                    f"{i}/3",
                    "--no-progress",
                ]
            )
            assert code == 0
        assert len(server.requests) == single_requests  # not one call more than one process pays
    capsys.readouterr()
    assert keyshot(["merge", str(tmp_path / "many")]) == 0
    assert "merged from 3 shards" in capsys.readouterr().out
    one = sorted(map(comparable, read_verdicts(tmp_path / "one/verdicts.jsonl")))
    many = sorted(map(comparable, read_verdicts(tmp_path / "many/verdicts.jsonl")))
    assert len(one) == 24 and one == many
    s1 = json.loads((tmp_path / "one/summary.json").read_text())
    s3 = json.loads((tmp_path / "many/summary.json").read_text())
    assert totals(s1) == totals(s3)
    # the merge summed the shards' own summaries: exactly what summarising the merged file says
    recount = summarize(read_verdicts(tmp_path / "many/verdicts.jsonl"), run=s3["run"])
    assert _rounded(json.loads(json.dumps(recount))) == _rounded(s3)  # (sums of costs in another order)
    assert s3["run"]["merged_shards"] == 3 and s3["run"]["found"] == 24
    owned = [
        json.loads((tmp_path / f"many/shard-{i}-of-3/summary.json").read_text())["run"]["owned"]
        for i in range(3)
    ]
    assert sum(owned) == 24 and all(owned)
    # the merged folder is a run folder like any other: report and metrics read it
    assert (tmp_path / "many/run.json").is_file()
    assert keyshot(["report", str(tmp_path / "many"), "--no-progress"]) == 0
    # merge --human-labels measures the merged verdicts as keyshot metrics measures the one process's
    labels = tmp_path / "labels.json"
    tasks = sorted({v.task_id for v in read_verdicts(tmp_path / "one/verdicts.jsonl")})
    labels.write_text(json.dumps({task: i % 2 for i, task in enumerate(tasks)}))
    assert keyshot(["merge", str(tmp_path / "many"), "--human-labels", str(labels)]) == 0
    argv = ["metrics", str(tmp_path / "one"), "--human-labels", str(labels), "--out", str(tmp_path / "m1")]
    assert keyshot(argv) == 0
    merged, single = (
        json.loads((tmp_path / f).read_text()) for f in ("many/metrics/metrics.json", "m1/metrics.json")
    )
    assert merged["n_used"] == single["n_used"] > 0
    assert merged["agreement"] == single["agreement"] and merged["classification"] == single["classification"]


def test_merge_refuses_missing_unfinished_and_mixed_shards(tmp_path, capsys):
    inputs = agent_inputs(tmp_path, n=6, shots=2)
    out = tmp_path / "run"
    with FakeOpenAI(judge_responder) as server:
        cfg = judge_config(tmp_path, {"base_url": server.base_url})
        for i in (0, 2):
            keyshot(
                ["judge", *inputs, "--config", cfg, "--out", str(out), "--shard", f"{i}/4", "--no-progress"]
            )
        capsys.readouterr()
        assert keyshot(["merge", str(out)]) == 2
        err = capsys.readouterr().err
        assert "shards that never ran: 1, 3" in err and "--array=1,3" in err
        assert not (out / "verdicts.jsonl").exists()

        for i in (1, 3):
            keyshot(
                ["judge", *inputs, "--config", cfg, "--out", str(out), "--shard", f"{i}/4", "--no-progress"]
            )
        # a half-written last line: the shard was killed mid-write
        victim = next(p for p in sorted(out.glob("shard-*/verdicts.jsonl")) if p.stat().st_size)
        with open(victim, "ab") as fh:
            fh.write(b'{"task_id": "torn')
        capsys.readouterr()
        assert keyshot(["merge", str(out)]) == 2
        err = capsys.readouterr().err
        assert (
            f"shard {victim.parent.name.split('-')[1].lstrip('0') or '0'}: " in err and "half-written" in err
        )
        # re-running that shard cuts the torn line and finishes
        index = int(victim.parent.name.split("-")[1])
        keyshot(
            ["judge", *inputs, "--config", cfg, "--out", str(out), "--shard", f"{index}/4", "--no-progress"]
        )
        assert keyshot(["merge", str(out)]) == 0
        total = len(read_verdicts(out / "verdicts.jsonl"))
        # a trajectory judged again later (its newer line supersedes the older): the newer one is merged
        first = json.loads(victim.read_text().splitlines()[0])
        with open(victim, "a") as fh:
            fh.write(json.dumps({**first, "outcome_text": "judged again"}) + "\n")
        assert keyshot(["merge", str(out)]) == 0
        merged = read_verdicts(out / "verdicts.jsonl")
        assert len(merged) == total
        again = [
            v.outcome_text for v in merged if v.task_id == first["task_id"] and v.agent == first["agent"]
        ]
        assert again == ["judged again"]

        # a shard judged under another protocol
        other = judge_config(tmp_path, {"base_url": server.base_url}, "other.yaml")
        Path(other).write_text(Path(other).read_text().replace("threshold: 3", "threshold: 4"))
        out2 = tmp_path / "mixed"
        keyshot(["judge", *inputs, "--config", cfg, "--out", str(out2), "--shard", "0/2", "--no-progress"])
        keyshot(["judge", *inputs, "--config", other, "--out", str(out2), "--shard", "1/2", "--no-progress"])
        capsys.readouterr()
    assert keyshot(["merge", str(out2)]) == 2
    assert "shard 1 was judged under another protocol" in capsys.readouterr().err

    # a shard whose run.json is not a run file: named among the shards to re-run, with merge's advice
    (out2 / "shard-0-of-2" / "run.json").write_text("{not json")
    assert keyshot(["merge", str(out2)]) == 2
    err = capsys.readouterr().err
    assert "shard 0: " in err and "shard-0-of-2/run.json: not a keyshot run file" in err
    assert "--out" not in err and "re-run them" in err


def _fake_endpoints(server: FakeOpenAI) -> list[str]:
    return [
        f"judge.base_url={server.base_url}",
        "judge.model=fake-judge",
        "judge.api_key_env=null",
        f"scorer.endpoint.base_url={server.base_url}",
        "scorer.endpoint.model=fake-scorer",
        "scorer.endpoint.api_key_env=null",
    ]


def _run_file(folder: Path) -> dict:
    return json.loads((folder / RUN_FILE).read_text(encoding="utf-8"))


def test_a_sweep_of_merged_shards_reads_the_trajectories_as_the_shards_did(tmp_path, capsys):
    """Shards judged with loader options (``agent=``, ``benchmark=``, ``--allow-outside``) merge into a
    run.json that records them as a one-process run does, and a sweep of the merged folder, given none of
    them, reads every trajectory with them."""
    inputs, screenshots = nameless_inputs(tmp_path, [2, 3, 2, 3, 2, 3])
    reading = [str(inputs), "--allow-outside", str(screenshots), "--no-progress"]
    named = ["agent=my-agent", "benchmark=my-bench"]
    sweep = [
        "sweep",
        str(tmp_path / "many"),
        "--out",
        str(tmp_path / "sweep"),
        "--deltas",
        "4",
        "--no-progress",
    ]
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        judge = ["judge", *reading, *named, *_fake_endpoints(server)]
        assert keyshot([*judge, f"out={tmp_path / 'one'}"]) == 0
        for i in range(2):
            assert keyshot([*judge, f"out={tmp_path / 'many'}", "--shard", f"{i}/2"]) == 0
        owned = [json.loads((tmp_path / f"many/shard-{i}-of-2/summary.json").read_text()) for i in range(2)]
        assert all(o["run"]["owned"] for o in owned)
        assert keyshot(["merge", str(tmp_path / "many")]) == 0
        one, merged = _run_file(tmp_path / "one"), _run_file(tmp_path / "many")
        assert merged == one and one[INPUTS]["agent"] == "my-agent"
        assert keyshot([*sweep, *_fake_endpoints(server)]) == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "sweep" / "sweep.json").read_text(encoding="utf-8"))
    assert result["not_swept"] == {} and result["sweepable"] == 6  # without them: "trajectory not readable"
    swept = delta_folder(tmp_path / "sweep", 4)
    assert _run_file(swept)[INPUTS] == one[INPUTS]
    verdicts = read_verdicts(swept / "verdicts.jsonl")
    assert {(v.agent, v.benchmark) for v in verdicts} == {("my-agent", "my-bench")}


def test_merge_refuses_shards_that_read_their_trajectories_otherwise(tmp_path, capsys):
    inputs, screenshots = nameless_inputs(tmp_path, [2, 3, 2, 3])
    out = tmp_path / "mixed"
    with FakeOpenAI(make_judge("any_image", "brightness")) as server:
        judge = ["judge", str(inputs), "--allow-outside", str(screenshots), "--no-progress", f"out={out}"]
        judge += _fake_endpoints(server)
        assert keyshot([*judge, "agent=my-agent", "--shard", "0/2"]) == 0
        assert keyshot([*judge, "agent=another-agent", "--shard", "1/2"]) == 0
    capsys.readouterr()
    assert keyshot(["merge", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "shard 1 read its trajectories otherwise than shard 0 (agent: 'my-agent' in shard 0, " in err
    assert "'another-agent' in shard 1)" in err and len(err.splitlines()) == 1
    assert not (out / VERDICTS_FILE).exists() and not (out / RUN_FILE).exists()  # nothing merged


def _verdict_merge(run: Path) -> None:
    from keyshot.infer.judge.verdict_merge import merge_shards

    merge_shards(run)


def _label_merge(run: Path) -> None:
    from keyshot.data_synth.label_merge import merge_synth_shards

    merge_synth_shards(run)


_MANIFEST = {"prompt_variant": "online_mind2web", "prompt_version": "v1", "parse_mode": "strict"}


def _finished_shard(folder: Path, data_file: str, record: dict, summary: dict) -> None:
    folder.mkdir(parents=True)
    (folder / data_file).write_text("")
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.mark.parametrize(
    "merge, data_file, record, summary, command",
    [
        (
            _verdict_merge,
            "verdicts.jsonl",
            {"protocol": {"threshold": 3}},
            {"run": {"shard_by": "task"}},
            "keyshot merge",
        ),
        (
            _label_merge,
            "labels.jsonl",
            {"manifest": _MANIFEST},
            {"exit_code": 0, "summary": "done"},
            "keyshot synth merge",
        ),
    ],
    ids=["verdicts", "labels"],
)
def test_both_merges_refuse_missing_unfinished_and_foreign_and_write_nothing(
    tmp_path, merge, data_file, record, summary, command
):
    """The one merge skeleton, through each kind's merge: shard 3 never ran, shard 1 was killed
    mid-write, shard 2 never wrote its summary; all three are named and nothing is written. A data file
    in the run folder that no merge wrote is refused too."""
    run = tmp_path / "run"
    for index in range(3):
        _finished_shard(run / f"shard-{index}-of-4", data_file, record, summary)
    with open(run / "shard-1-of-4" / data_file, "a") as fh:
        fh.write('{"task_id": "torn')
    (run / "shard-2-of-4" / "summary.json").unlink()
    before = sorted(p.name for p in run.iterdir())

    with pytest.raises(ShardError) as refused:
        merge(run)
    said = str(refused.value)
    assert "cannot merge 4 shards" in said and "shards that never ran: 3" in said
    assert "shard 1: " in said and "half-written" in said
    assert "shard 2: did not finish (no summary.json" in said
    assert "--array=1,2,3" in said and "nothing was merged" in said
    assert sorted(p.name for p in run.iterdir() if p.name != ".lock") == before  # nothing written

    (run / "shard-1-of-4" / data_file).write_text("")
    (run / "shard-2-of-4" / "summary.json").write_text(json.dumps(summary))
    _finished_shard(run / "shard-3-of-4", data_file, record, summary)
    (run / data_file).write_text("made by hand\n")
    with pytest.raises(ShardError, match=f"was not written by {command} "):
        merge(run)
    assert (run / data_file).read_text() == "made by hand\n"


def test_killed_shard_resumes_and_merges_without_loss(tmp_path, capsys):
    inputs = agent_inputs(tmp_path, n=16, shots=3)
    out = tmp_path / "run"
    with spawn_fake_openai("judge", latency_s=0.05) as (url, _):
        cfg = judge_config(tmp_path, {"base_url": url})
        argv = ["judge", *inputs, "--config", cfg, "--out", str(out), "--no-progress"]
        for i in (0, 1):
            assert keyshot([*argv, "--shard", f"{i}/2"]) == 0
        # shard 1 again from scratch, killed with SIGKILL while it writes
        (out / "shard-1-of-2/verdicts.jsonl").unlink()
        (out / "shard-1-of-2/calls.sqlite").unlink()
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "keyshot.infer.cli", *argv, "--shard", "1/2"],
            cwd=REPO,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        path = out / "shard-1-of-2/verdicts.jsonl"
        kill_when(proc, lambda: line_count(path) >= 3, "3 verdicts were written")
        capsys.readouterr()
        assert keyshot(["merge", str(out)]) == 2
        assert "shard 1: did not finish" in capsys.readouterr().err
        assert keyshot([*argv, "--shard", "1/2"]) == 0
    assert keyshot(["merge", str(out)]) == 0
    merged = read_verdicts(out / "verdicts.jsonl")
    keys = [v.key for v in merged]
    assert len(keys) == len(set(keys)) == 32 and all(v.finished for v in merged)


def test_scorer_pool_survives_an_endpoint_dying_mid_run(tmp_path, capsys, caplog):
    inputs = agent_inputs(tmp_path, n=16, shots=5)
    with (
        FakeOpenAI(judge_responder) as judge,
        FakeOpenAI(judge_responder, latency_s=0.03) as a,
        FakeOpenAI(judge_responder, latency_s=0.03) as b,
    ):
        pool = [
            {"base_url": s.base_url, "model": "webjudge-7b", "api_key_env": None, "max_concurrency": 4}
            for s in (a, b)
        ]
        cfg = judge_config(
            tmp_path, {"base_url": judge.base_url, "scorer": {"endpoints": pool, "cooldown_s": 60}}
        )
        out = tmp_path / "run"
        port_a, port_b = a.port, b.port

        def kill_b_soon() -> None:
            while len(b.requests) < 6:
                time.sleep(0.01)
            b.stop()

        import threading

        killer = threading.Thread(target=kill_b_soon, daemon=True)
        killer.start()
        code = keyshot(["judge", *inputs, "--config", cfg, "--out", str(out), "--no-progress"])
        killer.join(timeout=30)
    text = capsys.readouterr()
    assert code == 0, text.err
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert len(verdicts) == 32 and len({v.key for v in verdicts}) == 32
    assert all(v.finished for v in verdicts)
    ledger = json.loads((out / "summary.json").read_text())["run"]["ledger"]
    rows = {name: row for name, row in ledger.items() if name.startswith("webjudge-7b@")}
    assert len(rows) == 2  # one row per endpoint
    dead = next(row for name, row in rows.items() if name.endswith(f":{port_b}"))
    live = next(row for name, row in rows.items() if name.endswith(f":{port_a}"))
    assert dead["failures"] >= 1 and live["paid_requests"] > dead["paid_requests"]
    assert f"webjudge-7b@127.0.0.1:{port_b} taken out" in caplog.text


def test_pool_sends_identical_concurrent_requests_once():
    with FakeOpenAI(echo_responder, latency_s=0.2) as a, FakeOpenAI(echo_responder, latency_s=0.2) as b:
        pool = EndpointPool(
            [EndpointConfig(base_url=s.base_url, model="m", api_key_env=None) for s in (a, b)]
        )
        messages = [{"role": "user", "content": "Task: x\nKey points: y\nscore this"}]

        async def eight():
            try:
                return await asyncio.gather(*(pool.complete(messages, prompt_version="v") for _ in range(8)))
            finally:
                await pool.aclose()

        answers = asyncio.run(eight())
    assert len(a.requests) + len(b.requests) == 1
    assert sum(not c.cached for c in answers) == 1 and len({c.text for c in answers}) == 1


def test_synth_shards_merge_into_the_dataset_of_one_run(tmp_path, capsys):
    from datasets import load_from_disk

    from keyshot.data_synth.labelling_run import run_synth
    from keyshot.data_synth.labels import LABELS_FILE, read_store
    from keyshot.infer.testing.fake_openai import make_teacher
    from tests.support.synth_env import RULES, synth_config, teacher_set

    with FakeOpenAI(make_teacher(RULES["bright"])) as bright, FakeOpenAI(make_teacher(RULES["dark"])) as dark:
        teachers = teacher_set({"bright": bright.base_url, "dark": dark.base_url})
        one = synth_config(tmp_path / "one.yaml", tmp_path / "one", teachers)
        assert run_synth(one).exit_code == 0
        single_calls = len(bright.requests) + len(dark.requests)
        bright.requests.clear(), dark.requests.clear()
        many = synth_config(tmp_path / "many.yaml", tmp_path / "many", teachers)
        for i in range(3):
            argv = ["synth", "run", "--config", str(tmp_path / "many.yaml"), "--shard", f"{i}/3"]
            if i == 1:  # merging before every shard finished names the missing ones
                capsys.readouterr()
                assert keyshot(["synth", "merge", many.run_dir, "--config", str(tmp_path / "many.yaml")]) == 2
                assert "shards that never ran: 1, 2" in capsys.readouterr().err
            assert keyshot(argv) == 0
        assert len(bright.requests) + len(dark.requests) == single_calls  # no call more than one run pays
    # no run folder given: the config's run_dir; an override among the positional items is an override
    merge = ["synth", "merge", "aggregation.consensus=median", "--config", str(tmp_path / "many.yaml")]
    assert keyshot(merge) == 0

    def labels(run: str) -> dict:
        store = read_store(Path(run) / LABELS_FILE)
        return {k: sorted((r.teacher, r.score) for r in v) for k, v in store.labels_by_step().items()}

    assert labels(one.run_dir) == labels(many.run_dir) and labels(one.run_dir)
    rows = {
        split: sorted(map(str, ds["messages"]))
        for split, ds in load_from_disk(f"{one.run_dir}/dataset").items()
    }
    merged = {
        split: sorted(map(str, ds["messages"]))
        for split, ds in load_from_disk(f"{many.run_dir}/dataset").items()
    }
    assert rows == merged


def test_synth_teacher_replicas_carry_on_without_a_dead_one(tmp_path, caplog):
    from keyshot.data_synth.labelling_run import run_synth
    from keyshot.data_synth.labels import LABELS_FILE, read_store
    from keyshot.infer.testing.fake_openai import make_teacher
    from tests.support.synth_env import RULES, synth_config, teacher_set

    with FakeOpenAI(make_teacher(RULES["bright"])) as dead:
        dead_url = dead.base_url  # stopped at the end of the block: nothing answers there
    with FakeOpenAI(make_teacher(RULES["bright"])) as live:
        teachers = teacher_set({"bright": live.base_url})
        teachers["teachers"][0]["replicas"] = [dead_url]  # a replica that is down from the start
        one = synth_config(tmp_path / "one.yaml", tmp_path / "one", teachers)
        report = run_synth(one, build=False)
    assert report.exit_code == 0 and report.labels_new > 0 and not report.calls_failed
    store = read_store(Path(one.run_dir) / LABELS_FILE)
    assert all(not r.error for rs in store.labels_by_step().values() for r in rs)
    assert "1 of 2 endpoints of fake-bright's pool do not answer" in caplog.text
