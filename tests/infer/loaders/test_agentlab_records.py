"""AgentLab runs without experiment_analysis.md: read from their step records, which are never executed."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import agentlab_records, load_trajectory, parse_experiment_analysis
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.protocol.verdicts import read_verdicts
from keyshot.infer.testing.fake_openai import FakeOpenAI, make_judge
from tests.support import paths

REPO = paths.REPO
AGENTLAB = paths.FIXTURES / "trajectories" / "agentlab"
RUN = next(p for p in sorted(AGENTLAB.iterdir()) if p.is_dir())  # a real WorkArena run (Apache-2.0)


def _module(name: str) -> types.ModuleType:
    """A module of BrowserGym's/AgentLab's name, so the pickles name their real classes."""
    parts = name.split(".")
    for i in range(1, len(parts)):  # parents first: pickle imports the module by its dotted name
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    module = types.ModuleType(name)
    sys.modules[name] = module
    return module


@pytest.fixture()
def agentlab_classes():
    loop, args, chat = (
        _module("browsergym.experiments.loop"),
        _module("agentlab.experiments.exp_utils"),
        _module("agentlab.llm.chat_api"),
    )

    @dataclass
    class StepInfo:
        step: int = 0
        obs: dict = None
        reward: float = 0
        action: str = None
        agent_info: dict = field(default_factory=dict)

    @dataclass
    class AgentInfo:
        think: str = None
        stats: dict = field(default_factory=dict)

    @dataclass
    class ChatModelArgs:
        model_name: str = None

    @dataclass
    class GenericAgentArgs:
        chat_model_args: ChatModelArgs = None

    @dataclass
    class ExpArgs:
        agent_args: GenericAgentArgs = None
        env_args: dict = None

    for module, cls in ((loop, StepInfo), (loop, AgentInfo), (chat, ChatModelArgs), (args, GenericAgentArgs)):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)
    ExpArgs.__module__, ExpArgs.__qualname__ = args.__name__, "ExpArgs"
    args.ExpArgs = ExpArgs
    yield types.SimpleNamespace(
        StepInfo=StepInfo,
        AgentInfo=AgentInfo,
        ChatModelArgs=ChatModelArgs,
        Agent=GenericAgentArgs,
        ExpArgs=ExpArgs,
    )
    for name in list(sys.modules):
        if name.split(".")[0] in ("browsergym", "agentlab"):
            sys.modules.pop(name, None)


def _dump(path: Path, obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    path.write_bytes(data)


def _run_without_analysis(tmp_path: Path, classes, *, extra_obs: dict | None = None) -> Path:
    """The real run's screenshots and summary, its steps as BrowserGym's records instead of the analysis."""
    run = tmp_path / RUN.name
    run.mkdir(parents=True)
    for p in RUN.iterdir():
        if p.name != "experiment_analysis.md":
            shutil.copy(p, run / p.name)
    steps = parse_experiment_analysis(RUN / "experiment_analysis.md")
    goal_object = [{"type": "text", "text": steps.goal}]
    for n in range(steps.num_steps):
        last = n == len(steps.actions)
        obs = {
            "goal_object": goal_object,
            "screenshot_som": np.zeros((4, 4, 3), np.uint8),
            **(extra_obs or {}),
        }
        info = classes.AgentInfo(think=None if last else steps.thoughts[n], stats={"n_tokens": 10})
        record = classes.StepInfo(step=n, obs=obs, action=None if last else steps.actions[n], agent_info=info)
        _dump(run / f"step_{n}.pkl.gz", record)
    agent = classes.Agent(chat_model_args=classes.ChatModelArgs(model_name=steps.model_name))
    _dump(run / "exp_args.pkl", classes.ExpArgs(agent_args=agent, env_args={"task_seed": 5}))
    return run


def test_a_run_without_analysis_reads_the_same_from_its_step_records(tmp_path, agentlab_classes):
    from_analysis = load_trajectory(RUN)
    run = _run_without_analysis(tmp_path, agentlab_classes)
    from_records = load_trajectory(run)
    for name in (
        "task_id",
        "task",
        "agent",
        "benchmark",
        "run",
        "reward",
        "actions",
        "thoughts",
        "final_answer",
    ):
        assert getattr(from_records, name) == getattr(from_analysis, name), name
    assert len(from_records.screenshots) == len(from_analysis.screenshots) == 7
    assert from_records.agent == "DemoAgent-gpt-4o"


class _Payload:
    """What a hostile record would carry: a call to run when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_records_are_never_executed(tmp_path, agentlab_classes):
    marker = tmp_path / "pwned"
    run = _run_without_analysis(
        tmp_path, agentlab_classes, extra_obs={"x": _Payload(marker), "y": [_Payload(marker)]}
    )
    trajectory = load_trajectory(run)
    assert not marker.exists()
    assert trajectory.task == load_trajectory(RUN).task
    record = agentlab_records.load_record(run / "step_0.pkl.gz")
    assert isinstance(record.fields()["obs"]["x"], agentlab_records.Opaque)
    assert repr(record.fields()["obs"]["x"]) in ("<opaque posix.system>", "<opaque os.system>")


def test_broken_records_are_named(tmp_path, agentlab_classes, monkeypatch):
    run = _run_without_analysis(tmp_path, agentlab_classes)
    (run / "step_2.pkl.gz").write_bytes(gzip.compress(b"\x80\x05 not a pickle")[:-9])  # cut short
    with pytest.raises(TrajectoryError, match=r"step_2\.pkl\.gz: cannot read the step record"):
        load_trajectory(run)
    _dump(run / "step_2.pkl.gz", {"obs": {}, "action": "click('1')"})
    monkeypatch.setattr(agentlab_records, "MAX_RECORD_BYTES", 64)
    with pytest.raises(TrajectoryError, match=r"step_0\.pkl\.gz: step record larger than"):
        load_trajectory(run)
    monkeypatch.undo()
    _dump(run / "step_1.pkl.gz", {"obs": {}, "action": None})  # an action missing before the last step
    with pytest.raises(TrajectoryError, match=r"step_1\.pkl\.gz: a step before the last has no action"):
        load_trajectory(run)


def test_runs_with_and_without_analysis_and_two_seeds_are_judged_apart(tmp_path, agentlab_classes):
    study = tmp_path / "study"
    study.mkdir()
    shutil.copytree(RUN, study / RUN.name)
    other_seed = RUN.name.rsplit("_", 1)[0] + "_9"  # the same task on another seed, no analysis
    no_analysis = _run_without_analysis(tmp_path / "made", agentlab_classes)
    shutil.copytree(no_analysis, study / other_seed)
    out = tmp_path / "judged"
    config = str(REPO / "configs/judge/reference_gpt4o.yaml")
    with FakeOpenAI(make_judge()) as judge:
        argv = ["judge", str(study), "--config", config, "--no-progress", f"out={out}"]
        assert keyshot([*argv, f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]) == 0
    verdicts = read_verdicts(out / "verdicts.jsonl")
    assert sorted(v.task_id for v in verdicts) == sorted(
        [RUN.name.split("_on_")[1], other_seed.split("_on_")[1]]
    )
    assert all(v.finished and v.success is not None for v in verdicts)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trajectories"] == 2 and not summary["run"]["duplicates"]


def _browsergym_run(root: Path) -> Path:
    """The real run's steps saved by BrowserGym's own ``StepInfo.save_step_info`` (step records and
    screenshots, no analysis), as its experiment loop writes them."""
    loop = pytest.importorskip("browsergym.experiments.loop")
    agent = pytest.importorskip("browsergym.experiments.agent")
    from PIL import Image

    run = root / RUN.name
    run.mkdir(parents=True)
    shutil.copy(RUN / "summary_info.json", run)
    steps = parse_experiment_analysis(RUN / "experiment_analysis.md")
    for n in range(steps.num_steps):
        last = n == len(steps.actions)
        obs = {
            "goal": steps.goal,
            "goal_object": [{"type": "text", "text": steps.goal}],
            "screenshot": np.asarray(Image.open(RUN / f"screenshot_step_{n}.png").convert("RGB")),
        }
        think = None if last else steps.thoughts[n]
        info = loop.StepInfo(
            step=n,
            obs=obs,
            action=None if last else steps.actions[n],
            agent_info=agent.AgentInfo(think=think),
        )
        info.save_step_info(run)
    return run


def test_a_missing_step_record_is_an_error_naming_it(tmp_path, capsys):
    from keyshot.data_synth.labelling_run import run_synth
    from tests.support.synth_env import synth_config, teacher_set

    study = tmp_path / "study"
    run = _browsergym_run(study)
    steps = parse_experiment_analysis(RUN / "experiment_analysis.md")
    assert load_trajectory(run).actions == steps.actions  # BrowserGym's own layout, read whole
    shutil.copytree(RUN, study / (RUN.name.rsplit("_", 1)[0] + "_9"))  # a readable run beside it

    last = run / f"step_{steps.num_steps - 1}.pkl.gz"
    saved = last.read_bytes()
    last.unlink()  # the last step's record: without the check its step would silently be the last one
    with pytest.raises(TrajectoryError, match=rf"^{last}: step record missing"):
        load_trajectory(run)
    last.write_bytes(saved)
    (run / "step_0.pkl.gz").unlink()  # the run did click('...') at step 0: never judged without it
    (run / "step_2.pkl.gz").unlink()
    with pytest.raises(TrajectoryError) as caught:
        load_trajectory(run)
    why = f"{run / 'step_0.pkl.gz'}: step record missing (and 1 more: step_2)"
    assert str(caught.value).startswith(why)

    config = str(REPO / "configs/judge/reference_gpt4o.yaml")
    argv = ["judge", str(study), "--config", config, "--dry-run", f"out={tmp_path / 'judged'}"]
    with FakeOpenAI(make_judge()) as judge:  # the dry run checks that the endpoint answers
        assert keyshot([*argv, f"judge.base_url={judge.base_url}", "judge.api_key_env=null"]) == 0
        assert not judge.requests
    printed = capsys.readouterr().out
    assert "not judged: 1 could not be loaded" in printed and f"  not loaded: {why}" in printed

    teachers = teacher_set({"bright": "http://127.0.0.1:9/v1"})  # a dry run calls nothing
    cfg = synth_config(tmp_path / "synth.yaml", tmp_path / "run", teachers, sources=[{"path": str(study)}])
    summary = run_synth(cfg, dry_run=True).summary()
    assert "Cost estimate: 1 trajectories" in summary and "unreadable, skipped: 1" in summary
    assert f"  unreadable, skipped: {why}" in summary
