"""A small AgentLab 0.4.2 study written by AgentLab's own code: two agents on live MiniWoB pages in Chromium,
eight runs, one of them relaunched, one with an image in its goal.

    python -m tests.support.agentlab_study study ROOT     # writes ROOT/<date>_agentlab-study, prints JSON
    python -m tests.support.agentlab_study results STUDY  # AgentLab's load_result_df of STUDY, as JSON

Run as a module from the repository root, in a process of its own (as tests/support/browsergym_loop.py):
the runs' ``exp_args.pkl`` then name this module's classes, so AgentLab's readers can load them anywhere.

What AgentLab does, done by AgentLab's functions:
- the runs: ``agentlab.experiments.launch_exp.run_experiments`` (sequential backend) over
  ``agentlab.experiments.loop.ExpArgs`` of two ``AgentArgs`` subclasses named as AgentLab names its agents,
  ``<Agent>-<model>`` (GenericAgent's rule, a ``/`` in the model made ``_``). They call no model: the
  oracle clicks what the goal names, the other clicks at random; ``chat_model_args`` records the model.
- the relaunch: one random run fails at its first step the first time it runs (a transient error, as a
  browser crash, after the first page was recorded); ``find_incomplete`` then returns it and ``run_experiments`` runs it again, moving the
  failed folder aside as ``_<name>`` (``ExpArgs.prepare`` → ``_move_old_exp``): Study.run's relaunch.
- the study files after each trial, as ``Study.get_results`` names them (``result_df_<trial>.csv``,
  ``summary_df_<trial>.csv``; its ``error_report`` fails under pandas 3, and AgentLab's ``Study`` class
  itself does not import here: it needs browsergym-webarena, which downloads NLTK data on import), and
  ``get_study_summary``'s ``study_summary.csv`` and ``_last_modification_times.json``.
- the image goal: a MiniWoB click-button task whose goal is text and a picture of the page (OpenAI's
  content parts, as a BrowserGym task gives them), registered with BrowserGym's ``register_task``;
  BrowserGym puts "WARNING: This goal cannot be converted..." into ``obs["goal"]`` and AgentLab's loop
  moves the goal object to ``goal_object.pkl.gz``.
"""

from __future__ import annotations

import base64
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from agentlab.agents.agent_args import AgentArgs
from agentlab.experiments.launch_exp import find_incomplete, non_dummy_count, run_experiments
from agentlab.experiments.loop import EnvArgs, ExpArgs
from agentlab.llm.base_api import BaseModelArgs
from browsergym.core.registration import register_task
from browsergym.experiments.agent import Agent, AgentInfo
from browsergym.miniwob.all import ClickButtonTask

from keyshot.env.miniwob.agents import ScriptedAgent, random_action
from keyshot.env.miniwob.setup import prepare_browser
from keyshot.env.page import Page

STUDY_NAME = "agentlab-study"
IMAGE_TASK = "miniwob.click-button-image-goal"
ORACLE_MODEL = "gpt-4o-mini"
RANDOM_MODEL = "openai/gpt-4o-mini"  # AgentLab names the agent RandomAgent-openai_gpt-4o-mini
FLAKY_SEED = 1  # the random agent's run that fails once and is relaunched
#: (task, seed) of each agent's four runs
ORACLE_TASKS = [("miniwob.click-button", 0), ("miniwob.click-button", 1), ("miniwob.enter-text", 2)]
ORACLE_TASKS.append((IMAGE_TASK, 3))
RANDOM_TASKS = [("miniwob.click-button", 0), ("miniwob.click-button", FLAKY_SEED), ("miniwob.enter-text", 2)]
RANDOM_TASKS.append(("miniwob.click-button", 3))
_FAILED_ONCE: set[int] = set()  # in this process: the seeds whose random run already failed


class ImageGoalClickButtonTask(ClickButtonTask):
    """MiniWoB's click-button with a goal of two parts: its text and a picture of the page."""

    def setup(self, page):
        goal, info = super().setup(page)
        picture = base64.b64encode(page.screenshot()).decode()
        parts = [
            {"type": "text", "text": goal},
            {"type": "image_url", "image_url": f"data:image/png;base64,{picture}"},
        ]
        return parts, info


register_task(IMAGE_TASK, ImageGoalClickButtonTask)


@dataclass
class ConfiguredModelArgs(BaseModelArgs):
    """The model an agent is configured with; the agents of this study call none."""

    def make_model(self):
        raise RuntimeError("the agents of this study call no model")


def _goal_text(obs: dict) -> str:
    """The goal's text parts (obs["goal"] holds BrowserGym's warning when the goal has a picture)."""
    parts = obs.get("goal_object") or []
    return "\n".join(p["text"] for p in parts if p.get("type") == "text") or obs["goal"]


def _page(obs: dict) -> Page:
    return Page(f"Goal: {_goal_text(obs)}\n\nPage structure:\n{obs['axtree_txt']}", None, 0, False)


class OracleAgent(Agent):
    def __init__(self):
        self.script = ScriptedAgent()

    def get_action(self, obs: dict) -> tuple[str | None, AgentInfo]:
        action = self.script(_page(obs))
        return action, AgentInfo(think=f"the goal names it: {action}")


class RandomAgent(Agent):
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.seed = seed

    def get_action(self, obs: dict) -> tuple[str, AgentInfo]:
        if self.seed == FLAKY_SEED and self.seed not in _FAILED_ONCE:
            _FAILED_ONCE.add(self.seed)
            raise RuntimeError("transient failure: the run is relaunched")
        return random_action(_page(obs), self.rng), AgentInfo(think="a click at random")


@dataclass
class OracleAgentArgs(AgentArgs):
    chat_model_args: BaseModelArgs = None

    def __post_init__(self):
        self.agent_name = f"OracleAgent-{self.chat_model_args.model_name}".replace("/", "_")

    def make_agent(self) -> Agent:
        return OracleAgent()


@dataclass
class RandomAgentArgs(AgentArgs):
    chat_model_args: BaseModelArgs = None
    seed: int = 0

    def __post_init__(self):
        self.agent_name = f"RandomAgent-{self.chat_model_args.model_name}".replace("/", "_")

    def make_agent(self) -> Agent:
        return RandomAgent(self.seed)


def _exp_args() -> list[ExpArgs]:
    """Each agent on its tasks, in order (what Study.agents_on_benchmark builds)."""
    plan = [
        (OracleAgentArgs(chat_model_args=ConfiguredModelArgs(ORACLE_MODEL)), task, seed)
        for task, seed in ORACLE_TASKS
    ]
    plan += [
        (RandomAgentArgs(chat_model_args=ConfiguredModelArgs(RANDOM_MODEL), seed=seed), task, seed)
        for task, seed in RANDOM_TASKS
    ]
    runs = []
    for order, (agent, task, seed) in enumerate(plan):
        env = EnvArgs(task_name=task, task_seed=seed, max_steps=3, headless=True)
        runs.append(ExpArgs(agent_args=agent, env_args=env, order=order))
    return runs


def _study_files(study: Path, trial: str) -> None:
    """The study's result files of one trial, written by AgentLab's result functions."""
    from agentlab.analyze import inspect_results

    result_df = inspect_results.load_result_df(study, progress_fn=None)
    result_df.to_csv(study / f"result_df_{trial}.csv")
    inspect_results.summarize_study(result_df).to_csv(study / f"summary_df_{trial}.csv")
    inspect_results.get_study_summary(study, progress_fn=None)


def write_study(root: Path) -> dict:
    prepare_browser()
    study = root / STUDY_NAME
    study.mkdir(parents=True)
    run_experiments(1, _exp_args(), study, parallel_backend="sequential")
    _study_files(study, "trial_1_of_2")
    relaunch = find_incomplete(study, include_errors=True)
    relaunched = non_dummy_count(relaunch)
    run_experiments(1, relaunch, study, parallel_backend="sequential")
    _study_files(study, "trial_2_of_2")
    folders = sorted(p for p in study.iterdir() if p.is_dir())
    return {
        "study": str(study),
        "relaunched": relaunched,
        "runs": [str(p) for p in folders if not p.name.startswith("_")],
        "superseded": [str(p) for p in folders if p.name.startswith("_")],
        "image_goal": [str(p) for p in folders if IMAGE_TASK in p.name],
    }


def read_results(study: Path) -> list[dict]:
    """Every run's row of AgentLab's own result table (load_result_df), keyed by its folder's name."""
    from agentlab.analyze import inspect_results

    df = inspect_results.load_result_df(study, progress_fn=None).reset_index()
    rows = json.loads(df.to_json(orient="records", default_handler=str))
    for row in rows:
        row["exp_dir"] = Path(row["exp_dir"]).name
    return rows


def main(argv: list[str]) -> int:
    command, path = argv
    if command == "study":
        print(json.dumps(write_study(Path(path))))
    elif command == "results":
        print(json.dumps(read_results(Path(path))))
    else:
        raise SystemExit(f"unknown command {command!r}: study ROOT | results STUDY")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
