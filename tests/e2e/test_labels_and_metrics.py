"""A newcomer's first hour (issue 30): label files as people keep them, metrics of verdicts judged
without an agent or without any truth, tables that name their truth, config and flag messages that
say where the mistake is, and ids shortened in the middle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyshot.data_synth.sources import load_human_labels as synth_labels
from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.config import ConfigError, load_config
from keyshot.infer.common.text import shorten_middle
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.loaders.human_labels import labels_for_agent, read_label_file
from keyshot.infer.loaders.trajectory import TrajectoryError
from tests.support import paths

REPO = paths.REPO
OM2W_LABELS = paths.FIXTURES / "online_mind2web" / "human_label.json"
TINY_JUDGE = REPO / "configs" / "judge" / "tiny_cpu.yaml"

#: The judge's verdicts (task -> success) and the humans' labels (task -> 0/1): they agree on 3 of 4.
JUDGED = {"t1": True, "t2": False, "t3": True, "t4": False}
HUMAN = {"t1": 1, "t2": 0, "t3": 0, "t4": 0}


def write_verdicts(path: Path, agent: str | None = "Browser_Use", **extra) -> Path:
    rows = [
        {
            "task_id": task,
            "task": f"do {task}",
            "success": success,
            **({"agent": agent} if agent else {}),
            **extra,
        }
        for task, success in JUDGED.items()
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def label_files(folder: Path) -> dict[str, Path]:
    """The same labels in every accepted shape."""
    files = {
        "task map": ("labels.json", json.dumps(HUMAN)),
        "label objects": ("labels.json", json.dumps({t: {"label": v} for t, v in HUMAN.items()})),
        "label objects with agent": (
            "labels.json",
            json.dumps({t: {"label": v, "agent": "browser use"} for t, v in HUMAN.items()}),
        ),
        "csv": ("labels.csv", "task_id,label\n" + "".join(f"{t},{v}\n" for t, v in HUMAN.items())),
        "csv with agent": (
            "labels.csv",
            "task_id,label,agent\n"
            + "".join(f"{t},{v},Browser_Use\n{t},{1 - v},SeeAct\n" for t, v in HUMAN.items()),
        ),
        "online-mind2web list": (
            "human_label.json",
            json.dumps(
                [
                    {
                        "task_id": t,
                        "confirmed_task": f"do {t}",
                        "Browser_Use_human_label": str(v),
                        "SeeAct_human_label": "2",
                    }
                    for t, v in HUMAN.items()
                ]
            ),
        ),
    }
    out = {}
    for shape, (name, text) in files.items():
        (folder / shape.replace(" ", "_")).mkdir()
        out[shape] = folder / shape.replace(" ", "_") / name
        out[shape].write_text(text)
    return out


def run_metrics(capsys, *argv: str) -> tuple[int, str, str]:
    code = keyshot(["metrics", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize(
    "shape",
    [
        "task map",
        "label objects",
        "label objects with agent",
        "csv",
        "csv with agent",
        "online-mind2web list",
    ],
)
def test_every_label_shape_joins_with_the_verdicts(tmp_path, capsys, shape):
    labels = label_files(tmp_path)[shape]
    verdicts = write_verdicts(tmp_path / "verdicts.jsonl")
    code, out, err = run_metrics(capsys, verdicts, "--human-labels", labels, "--out", tmp_path / "m")
    assert code == 0, err
    report = json.loads((tmp_path / "m" / "metrics.json").read_text())
    overall = next(r for r in report["agreement"] if r["group"] == "Overall")
    assert (report["n_used"], overall["human_sr"], overall["agreement"]) == (4, 0.25, 0.75)
    assert report["truth"] == {"human labels": 4}
    assert "Truth: human labels." in out and "| human SR |" in out
    # data_synth's join: one agent's {task_id: label}, the agent matched loosely
    assert labels_for_agent(labels, "browser-use") == {
        t: ("success" if v else "failure") for t, v in HUMAN.items()
    }


def test_a_label_file_of_another_shape_is_refused_listing_the_accepted_shapes(tmp_path, capsys):
    verdicts = write_verdicts(tmp_path / "verdicts.jsonl")
    for name, text in (("labels.json", '"all good"'), ("labels.csv", "id,verdict\nt1,1\n")):
        bad = tmp_path / name
        bad.write_text(text)
        code, _, err = run_metrics(capsys, verdicts, "--human-labels", bad, "--out", tmp_path / "m")
        assert code == 2 and err.count("\n") == 1, err
        assert str(bad) in err
        for shape in (
            "{task_id: 0|1}",
            '{task_id: {"label": 0|1',
            "task_id,label[,agent]",
            "human_label.json",
        ):
            assert shape in err
    with pytest.raises(TrajectoryError, match=r"labels\.csv:3: task 't2' has label 'maybe'"):
        (tmp_path / "labels.csv").write_text("task_id,label\nt1,1\nt2,maybe\n")
        read_label_file(tmp_path / "labels.csv")
    assert not (tmp_path / "m").exists()


def test_synth_reads_the_label_files_it_read_before_with_the_same_answers():
    for agent in ("SeeAct", "browser use", "Agent-E"):
        assert labels_for_agent(OM2W_LABELS, agent) == synth_labels(OM2W_LABELS, agent)
    with pytest.raises(TrajectoryError, match="no human labels for agent 'Nobody'"):
        labels_for_agent(OM2W_LABELS, "Nobody")
    with pytest.raises(TrajectoryError, match="one column per agent"):
        labels_for_agent(OM2W_LABELS, None)


def test_metrics_agent_names_the_agent_of_verdicts_judged_without_one(tmp_path, capsys):
    labels = label_files(tmp_path)["online-mind2web list"]  # columns Browser_Use and SeeAct
    verdicts = write_verdicts(tmp_path / "verdicts.jsonl", agent=None)
    code, _, err = run_metrics(capsys, verdicts, "--human-labels", labels, "--out", tmp_path / "m")
    assert code == 2 and "only 0 of 4 verdicts matched" in err and "keyshot metrics --agent NAME" in err
    code, out, err = run_metrics(
        capsys,
        verdicts,
        "--human-labels",
        labels,
        "--agent",
        "browser use",
        "--benchmark",
        "mine",
        "--out",
        tmp_path / "m",
    )
    assert code == 0, err
    report = json.loads((tmp_path / "m" / "metrics.json").read_text())
    groups = {r["group"]: r for r in report["classification"]}
    assert groups["browser use"]["n"] == 4 and groups["mine"]["n"] == 4
    assert (groups["Overall"]["tp"], groups["Overall"]["fp"]) == (1, 1)


def test_metrics_with_nothing_joined_fails_naming_the_options_that_give_labels(tmp_path, capsys):
    verdicts = write_verdicts(tmp_path / "verdicts.jsonl")  # no human_label, no reward
    code, out, err = run_metrics(capsys, verdicts, "--out", tmp_path / "m")
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "nothing to compare" in err and "no_human_label 4" in err
    assert "--human-labels FILE" in err and "--arb-index" in err
    assert not (tmp_path / "m" / "metrics.json").exists()


def test_each_table_names_the_source_of_its_truth(tmp_path, capsys):
    verdicts = write_verdicts(tmp_path / "verdicts.jsonl", reward=1.0)  # AgentLab's recorded reward
    code, out, err = run_metrics(capsys, verdicts, "--out", tmp_path / "m")
    assert code == 0, err
    markdown = (tmp_path / "m" / "metrics.md").read_text()
    assert markdown.count("Truth: AgentLab reward.") == 2 and "| reward SR |" in markdown
    assert "human SR" not in markdown and "Human label" not in markdown and "Human label" not in out
    with pytest.raises(SystemExit):
        keyshot(["metrics", "--help"])
    usage = capsys.readouterr().out
    assert "the benchmark's own reward recorded with the run" in " ".join(usage.split())
    assert json.loads((tmp_path / "m" / "metrics.json").read_text())["truth"] == {"AgentLab reward": 4}


def test_an_override_typo_is_blamed_on_the_command_line_not_the_file(capsys):
    code = keyshot(["judge", "infer/samples", "--config", str(TINY_JUDGE), "judge.modle=foo"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert (
        "command line override 'judge.modle=foo': judge: unknown key(s) 'modle' (did you mean 'model'?)"
        in err
    )
    assert "tiny_cpu.yaml" not in err


def test_every_unknown_key_is_named_at_once_with_its_file_and_line(tmp_path):
    config = tmp_path / "judge.yaml"
    config.write_text(
        TINY_JUDGE.read_text().replace(
            "  model: fake-judge\n", "  modle: fake-judge\n  model: fake-judge\n", 1
        )
        + "concurency: 2\n"
    )
    lines = config.read_text().splitlines()
    modle_line = lines.index("  modle: fake-judge") + 1
    with pytest.raises(ConfigError) as err:
        load_config(JudgeRunConfig, config, ["scorer.batch_sise=2"])
    message = str(err.value)
    assert f"{config}:{modle_line}: judge: unknown key(s) 'modle' (did you mean 'model'?)" in message
    assert f"{config}:{len(lines)}: unknown key(s) 'concurency' (did you mean 'concurrency'?)" in message
    assert "command line override 'scorer.batch_sise=2': scorer: unknown key(s) 'batch_sise'" in message
    with pytest.raises(ConfigError, match=r"judge\.yaml:\d+: .*expected int, got 'lots'"):
        config.write_text(TINY_JUDGE.read_text() + "concurrency: lots\n")
        load_config(JudgeRunConfig, config)


def test_an_unknown_flag_after_a_subcommand_gets_that_subcommands_usage_and_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exit_:
        keyshot(["judge", "infer/samples", "--confg", str(TINY_JUDGE)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: keyshot judge ")
    assert "keyshot judge: error: unrecognized arguments: --confg (did you mean --config?)" in err


def test_ids_are_shortened_in_the_middle_keeping_what_tells_them_apart():
    ids = [
        "2024-12-18_12-49-54_DemoAgentArgs_on_workarena.servicenow.all-menu_4",
        "2024-12-18_12-49-54_DemoAgentArgs_on_workarena.servicenow.all-menu_5",
    ]
    short = [shorten_middle(i, 34) for i in ids]
    assert [len(s) for s in short] == [34, 34] and short[0] != short[1]
    assert short[0] == ids[0][:17] + "…" + ids[0][-16:]
    assert shorten_middle("t1", 34) == "t1" and shorten_middle("abcdef", 1) == "…"
