"""AgentLab / BrowserGym run folders (AgentRewardBench, WorkArena, WebArena).

A run folder is named ``<date>_<time>_<AgentArgs>_on_<task>`` and holds ``screenshot_step_N.png``
(one per step, ordered by N), ``summary_info.json`` (``cum_reward``: the benchmark's rule-based
reward) and ``experiment_analysis.md``, AgentLab's text rendering of the run: ``## Task`` →
``**Derived Goal**``, then one ``## InstanceStepNNN`` per step whose ``### Next Action`` holds the
agent's thought and, in a triple-backtick span, its action (``No next action available`` on the last
step). A run without the analysis (AgentLab writes it only when asked) is read from its own step records
``step_N.pkl.gz`` and ``exp_args.pkl``, unpickled inertly (:mod:`keyshot.infer.loaders.agentlab_records`).

A study folder holds its runs beside study files (:data:`STUDY_FILES`: results tables, the pickled
study, logs), which are not inputs. A run AgentLab relaunched was moved aside as ``_<name>``
(``_move_old_exp``) and AgentLab's own results skip it: so does keyshot, listing it with the reason
(:func:`superseded_reason`).
"""

from __future__ import annotations

import ast
import fnmatch
import logging
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.loaders.agentlab_records import (
    EXP_ARGS_FILE,
    STEP_RECORD,
    AnalysisSteps,
    read_step_records,
)
from keyshot.infer.loaders.common import (
    InputScope,
    check_counts,
    read_json,
    require_regular_file,
    screenshot_file,
)
from keyshot.infer.loaders.formats import FolderFormat, register_folder_format
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory, TrajectoryError

logger = logging.getLogger(__name__)

FORMAT = "agentlab"
ANALYSIS_FILE = "experiment_analysis.md"
SUMMARY_FILE = "summary_info.json"
NO_ACTION = "No next action available"

_RUN_NAME = re.compile(r"^(?P<stamp>\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})_(?P<agent>.+?)_on_(?P<task>.+)$")
_SCREENSHOT = re.compile(r"^screenshot_step_(?P<n>\d+)\.(?:png|jpe?g|webp)$", re.IGNORECASE)
_HEADING = re.compile(r"^(?P<hashes>#{1,6})\s+(?P<title>.*?)\s*$")
_GOAL = re.compile(r"^\s*[*-]\s*\*\*(?:Derived )?Goal\*\*\s*:?\s*(?P<rest>.*)$")
_BULLET_FIELD = re.compile(r"^\s*[*-]\s*\*\*(?P<key>[^*]+)\*\*\s*:\s*(?P<value>.*)$")
_INSTANCE_STEP = re.compile(r"^InstanceStep(?P<n>\d+)$")
_INLINE_CODE = re.compile(r"```(?P<code>.+?)```", re.DOTALL)
_UNSAFE = re.compile(r"[\\/:*?<>|]")  # what AgentLab replaces with "_" in a run folder's name


#: What AgentLab 0.4.2 writes at a study's top, beside its runs: ``Study.save`` (study.pkl.gz),
#: ``Study.get_results`` (result_df / summary_df / error_report, with a ``_trial_i_of_n`` suffix while it
#: relaunches), agent-xray (summary_df.csv), ``get_study_summary`` (study_summary.csv and its
#: _last_modification_times.json), the archiver (reason_to_archive.txt); and what users keep beside them
#: (a launch script's ``*.log``, a ``study.json``).
STUDY_FILES = (
    "study.pkl.gz",
    "study.json",
    "result_df*.csv",
    "summary_df*.csv",
    "error_report*.md",
    "study_summary.csv",
    "_last_modification_times.json",
    "reason_to_archive.txt",
    "*.log",
)
SUPERSEDED = "_"  # AgentLab's prefix of a run folder moved aside by a relaunch


def is_agentlab_run(folder: Path) -> bool:
    """True when the folder has AgentLab's files (analysis, summary, step screenshots or step pickles)."""
    if (folder / ANALYSIS_FILE).is_file() or (folder / SUMMARY_FILE).is_file():
        return True
    return any(_SCREENSHOT.match(p.name) or STEP_RECORD.match(p.name) for p in folder.iterdir())


def is_study_file(path: Path) -> bool:
    """A file AgentLab writes at a study's top (:data:`STUDY_FILES`); the caller knows the folder holds runs."""
    return path.is_file() and any(fnmatch.fnmatch(path.name, pattern) for pattern in STUDY_FILES)


def superseded_reason(folder: Path) -> str | None:
    """Why a run folder of a study is not judged when AgentLab moved it aside for a relaunch (``_<name>``:
    its results loaders skip it), naming the run that replaced it; None for any other folder."""
    name = folder.name
    if not name.startswith(SUPERSEDED) or not ((folder / EXP_ARGS_FILE).is_file() or is_agentlab_run(folder)):
        return None
    return (
        f"superseded by a relaunch: AgentLab moved this run aside as {SUPERSEDED}<name> when it ran the "
        f"experiment again, and its own results skip such folders; {_relaunch_of(folder)} (pass this "
        "folder itself to judge it anyway)"
    )


def _relaunch_of(superseded: Path) -> str:
    """Which sibling run replaced a superseded one: the same agent on the same task, run later."""
    old = _RUN_NAME.match(superseded.name.lstrip(SUPERSEDED))
    later = []
    for sibling in superseded.parent.iterdir():
        new = _RUN_NAME.match(sibling.name)
        if old and new and sibling.is_dir() and (new["agent"], new["task"]) == (old["agent"], old["task"]):
            later += [sibling.name] if new["stamp"] >= old["stamp"] else []
    return f"its relaunch {max(later)} is judged" if later else "its relaunch is not in this folder"


@dataclass(frozen=True)
class _Section:
    level: int
    title: str
    lines: list[str]


def _sections(text: str) -> list[_Section]:
    """Split markdown into headed sections, ignoring '#' lines inside fenced blocks."""
    sections = [_Section(0, "", [])]
    in_fence = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```") and stripped.count("```") == 1:
            in_fence = not in_fence
        heading = None if in_fence else _HEADING.match(line)
        if heading:
            sections.append(_Section(len(heading.group("hashes")), heading.group("title"), []))
        else:
            sections[-1].lines.append(line)
    return sections


def _strip_fence(lines: list[str]) -> str:
    """The body of the first fenced block in ``lines`` (or the text itself when there is none)."""
    text = "\n".join(lines).strip()
    body = text.splitlines()
    if body and body[0].strip() == "```":
        end = max(i for i, line in enumerate(body) if line.strip() == "```")
        return "\n".join(body[1:end] if end > 0 else body[1:]).strip()
    return text


def _split_thought_action(body: str) -> tuple[str, str | None]:
    """Thought text and the action in the LAST triple-backtick span of a Next Action block."""
    matches = list(_INLINE_CODE.finditer(body))
    if not matches:
        return body.strip(), None
    last = matches[-1]
    code = last.group("code").strip()
    first, _, rest = code.partition("\n")
    if rest and re.fullmatch(r"[A-Za-z0-9_+-]+", first.strip()):  # ```python\n...\n``` language tag
        code = rest.strip()
    thought = (body[: last.start()] + body[last.end() :]).strip()
    return thought, code


def parse_experiment_analysis(path: Path) -> AnalysisSteps:
    """Goal, model name and per-step thought/action from an AgentLab ``experiment_analysis.md``."""
    try:
        require_regular_file(path)
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TrajectoryError(path, f"cannot read file: {exc}") from exc
    sections = _sections(text)

    goal: str | None = None
    model_name: str | None = None
    steps: list[tuple[int, list[str]]] = []
    current_step: int | None = None
    for section in sections:
        if section.level == 1:
            current_step = None
        if section.level == 2:
            match = _INSTANCE_STEP.match(section.title)
            current_step = int(match.group("n")) if match else None
            if section.title == "Task" and goal is None:
                goal = _goal_from(section.lines)
        elif section.title == "Model Configuration":
            for line in section.lines:
                field_match = _BULLET_FIELD.match(line)
                if field_match and field_match.group("key").strip() == "model_name":
                    model_name = field_match.group("value").strip() or None
        elif section.level == 3 and section.title == "Next Action" and current_step is not None:
            steps.append((current_step, section.lines))
    if not goal:
        raise TrajectoryError(path, "no task goal found (expected '## Task' with a '**Derived Goal**:' item)")
    if not steps:
        raise TrajectoryError(path, "no '## InstanceStepNNN' sections with a '### Next Action'")

    steps.sort(key=lambda item: item[0])
    actions: list[str] = []
    thoughts: list[str] = []
    for position, (number, lines) in enumerate(steps):
        body = _strip_fence(lines)
        if body.startswith(NO_ACTION):
            if position != len(steps) - 1:
                logger.warning("%s: InstanceStep%03d has no action but is not the last step", path, number)
            continue
        thought, action = _split_thought_action(body)
        if action is None:
            logger.warning(
                "%s: InstanceStep%03d has no action in backticks; using its whole text", path, number
            )
            thought, action = "", body
        actions.append(action)
        thoughts.append(thought)
    return AnalysisSteps(
        goal=goal, model_name=model_name, actions=actions, thoughts=thoughts, num_steps=len(steps)
    )


def _goal_from(lines: list[str]) -> str | None:
    goal_lines: list[str] | None = None
    for line in lines:
        if goal_lines is None:
            match = _GOAL.match(line)
            if match:
                goal_lines = [match.group("rest")] if match.group("rest").strip() else []
        elif _BULLET_FIELD.match(line):
            break
        else:
            goal_lines.append(line)
    if goal_lines is None:
        return None
    return textwrap.dedent("\n".join(goal_lines)).strip() or None


def _screenshot_files(run_dir: Path) -> list[tuple[int, Path]]:
    """``(N, path)`` of every ``screenshot_step_N``, by N."""
    return sorted((int(m.group("n")), p) for p in run_dir.iterdir() if (m := _SCREENSHOT.match(p.name)))


def _screenshots(files: list[tuple[int, Path]], summary_path: Path, scope: InputScope) -> list[Screenshot]:
    return [screenshot_file(path, i, summary_path, scope=scope) for i, (_, path) in enumerate(files)]


def _summary(summary_path: Path) -> dict:
    if not summary_path.is_file():
        return {}
    data = read_json(summary_path)
    if not isinstance(data, dict):
        raise TrajectoryError(summary_path, f"expected a JSON object, found a {type(data).__name__}")
    return data


def _one_line(text: object, limit: int = 200) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _message_of(action: str) -> str | None:
    """The text of a ``send_msg_to_user("...")`` action (the agent's answer), if it is one."""
    match = re.fullmatch(r"\s*send_msg_to_user\((?P<arg>.*)\)\s*", action, re.DOTALL)
    if not match:
        return None
    try:
        value = ast.literal_eval(match.group("arg").strip())
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, str) else None


def agent_name_of(named: str, model_name: str | None) -> str:
    """The agent's name from the run folder's (``named``) and the run's model.

    AgentRewardBench's released runs are named after the agent's AgentArgs class (``DemoAgentArgs``):
    the agent is ``<class>-<model>``, as AgentRewardBench names it (``DemoAgent-gpt-4o``). AgentLab names
    agents itself, usually ``<Agent>-<model>`` (``GenericAgent-gpt-4o-mini``, ``/`` made ``_``): a name
    that holds the model already is kept as it is; another name gets the model appended."""
    base = named[: -len("Args")] if named.endswith("Args") else named
    if not model_name:
        return named
    if re.search(rf"(?:^|[-_]){re.escape(_UNSAFE.sub('_', model_name))}(?:$|[-_])", base):
        return base
    return f"{base}-{model_name.replace('/', '_')}"


def load_agentlab(
    run_dir: Path, *, agent: str | None = None, benchmark: str | None = None, scope: InputScope | None = None
) -> Trajectory:
    """Load one AgentLab run folder (see the module docstring for the layout); screenshots must lie
    inside ``scope`` (default: the run folder)."""
    summary_path = run_dir / SUMMARY_FILE
    summary = _summary(summary_path)
    files = _screenshot_files(run_dir)
    screenshots = _screenshots(files, summary_path, scope or InputScope.of(run_dir))
    analysis_path = run_dir / ANALYSIS_FILE
    if not screenshots:
        crashed = f"; the run failed: {_one_line(summary['err_msg'])}" if summary.get("err_msg") else ""
        raise TrajectoryError(run_dir, f"trajectory has no screenshots (no screenshot_step_N.png){crashed}")
    if analysis_path.is_file():
        steps, steps_source = parse_experiment_analysis(analysis_path), analysis_path
    elif any(STEP_RECORD.match(p.name) for p in run_dir.iterdir()):
        steps, steps_source = read_step_records(run_dir, (n for n, _ in files)), run_dir
    else:
        raise TrajectoryError(
            run_dir,
            f"no {ANALYSIS_FILE} and no step_N.pkl.gz records: the task goal and actions are read from them",
        )
    if steps.num_steps != len(screenshots):
        logger.warning("%s: %d steps but %d screenshots", steps_source, steps.num_steps, len(screenshots))
    check_counts(steps.actions, screenshots, steps_source)

    name_match = _RUN_NAME.match(run_dir.name.lstrip(SUPERSEDED))  # a superseded run passed by itself
    task_id = name_match.group("task") if name_match else run_dir.name
    agent_name = agent
    if name_match:
        agent_name = agent_name_of(name_match.group("agent"), steps.model_name)
    elif agent_name is None and steps.model_name:
        agent_name = steps.model_name.replace("/", "_")
    bench = task_id.split(".", 1)[0] if name_match and "." in task_id else benchmark

    reward = summary.get("cum_reward")
    if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))):
        raise TrajectoryError(summary_path, f"cum_reward must be a number, found {reward!r}")
    final_answer = _message_of(steps.actions[-1]) if steps.actions else None
    extra = {"run": run_dir.name}
    if steps.model_name:
        extra["model_name"] = steps.model_name
    if steps.goal_images:
        extra["goal_images"] = steps.goal_images
        logger.info("%s: the goal holds %d image(s); the judge reads its text", run_dir, steps.goal_images)
    if summary.get("err_msg"):
        extra["err_msg"] = str(summary["err_msg"])
    return Trajectory(
        task_id=task_id,
        task=steps.goal,
        actions=steps.actions,
        thoughts=steps.thoughts,
        screenshots=screenshots,
        agent=agent_name,
        benchmark=bench,
        reward=float(reward) if reward is not None else None,
        source=run_dir,
        format=FORMAT,
        final_answer=final_answer,
        extra=extra,
        run=name_match.group("stamp") if name_match else run_dir.name,
    )


register_folder_format(
    FolderFormat(
        names=(FORMAT,),
        label="AgentLab",
        expects=f"{ANALYSIS_FILE} / {SUMMARY_FILE} / screenshot_step_N.png",
        holds=is_agentlab_run,
        detect=lambda folder: FORMAT if is_agentlab_run(folder) else None,
        load=lambda folder, name=None, **where: load_agentlab(folder, **where),
    )
)
