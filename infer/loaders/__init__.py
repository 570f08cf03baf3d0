"""Trajectory loaders: Online-Mind2Web v1/v2 folders, AgentLab/BrowserGym runs, keyshot JSONL.

:func:`load_trajectories` accepts one trajectory
folder, a folder of trajectory folders (and/or JSONL files), or a JSONL file, and detects each
trajectory's format unless one is forced. The folder formats are those the modules of this package
register (:mod:`keyshot.infer.loaders.formats`); every module here is imported with the package, so a
module that registers a format is all a new format needs.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from keyshot.infer.loaders.agentlab import (
    is_agentlab_run,
    is_study_file,
    load_agentlab,
    parse_experiment_analysis,
    superseded_reason,
)
from keyshot.infer.loaders.common import InputScope, account_for
from keyshot.infer.loaders.formats import FOLDER_FORMATS, folder_formats, format_names
from keyshot.infer.loaders.human_labels import (
    HumanLabels,
    LabelTable,
    attach_human_labels,
    read_human_labels,
    read_label_file,
)
from keyshot.infer.loaders.jsonl import FORMAT as JSONL
from keyshot.infer.loaders.jsonl import JSONL_SUFFIXES, iter_jsonl, write_jsonl
from keyshot.infer.loaders.mind2web import RESULT_FILE, SCREENSHOT_DIR, load_online_mind2web
from keyshot.infer.loaders.trajectory import OnError, SkippedEntry, Trajectory, TrajectoryError

logger = logging.getLogger(__name__)

# every module of the package, so that each format module's registration has run
for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

#: Formats a trajectory can have (``Trajectory.format``): the folder formats' and JSONL; ``fmt=`` also
#: takes "auto" and a format's name for all its versions ("online-mind2web").
FORMATS: tuple[str, ...] = (*format_names(), JSONL)


def _format_choices() -> tuple[str, ...]:
    """What ``fmt=`` takes: "auto", every registered folder format's names, "jsonl"."""
    return ("auto", *FOLDER_FORMATS.names(), JSONL)


__all__ = [
    "FORMATS",
    "HumanLabels",
    "LabelTable",
    "attach_human_labels",
    "detect_format",
    "iter_jsonl",
    "load_trajectories",
    "load_trajectory",
    "load_agentlab",
    "load_online_mind2web",
    "parse_experiment_analysis",
    "read_human_labels",
    "read_label_file",
    "write_jsonl",
]


Job = tuple[Path, Callable[[], Iterator[Trajectory]]]
ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".7z", ".rar")


def _has_trajectory_files(folder: Path) -> bool:
    """Has the files of one trajectory of a registered format (maybe broken)."""
    return any(fmt.holds(folder) for fmt in folder_formats())


def _loose_result_json(folder: Path) -> bool:
    """A result.json beside task folders rather than in one (no trajectory/ of its own): the folder holds
    trajectories and the file is listed as skipped."""
    return (
        (folder / RESULT_FILE).is_file()
        and not (folder / SCREENSHOT_DIR).is_dir()
        and not is_agentlab_run(folder)
        and any(_has_trajectory_files(c) for c in _subfolders(folder))
    )


def _is_trajectory_folder(folder: Path) -> bool:
    return _has_trajectory_files(folder) and not _loose_result_json(folder)


MAX_DEPTH = 4  # levels below the input searched for trajectories (AgentRewardBench: benchmark/agent/run)


def _entries(folder: Path) -> list[Path]:
    """The entries of a folder, hidden ones (.DS_Store, __MACOSX) left out."""
    try:
        return [c for c in sorted(folder.iterdir()) if not c.name.startswith((".", "__"))]
    except OSError:
        return []


def _subfolders(folder: Path) -> list[Path]:
    return [c for c in _entries(folder) if c.is_dir()]


def _study_entries(folder: Path) -> list[Path]:
    """The entries of a folder of trajectories, less an AgentLab study's own files (results tables, the
    pickled study, logs: part of the study, not inputs), which are named in one line."""
    entries = _entries(folder)
    study_files = [c for c in entries if is_study_file(c)]
    if not study_files or not any(is_agentlab_run(c) for c in entries if c.is_dir()):
        return entries
    logger.info(
        "%s: AgentLab's study files, not trajectories: %s", folder, ", ".join(c.name for c in study_files)
    )
    return [c for c in entries if c not in study_files]


def _superseded(entry: Path) -> str | None:
    """Why an AgentLab run folder inside the input is not judged: AgentLab relaunched it; else None."""
    return superseded_reason(entry) if entry.is_dir() else None


def _skip_reason(entry: Path, fmt: str) -> str:
    """Why an entry of an input folder that is neither a folder nor a JSONL file read is not judged."""
    name = entry.name.lower()
    if entry.is_symlink() and not entry.exists():
        return "a dangling symlink or a symlink loop; not read"
    if not entry.is_file():
        return "not a file or folder (a FIFO, socket or device); not read"
    if name.endswith(ARCHIVE_SUFFIXES):
        return "an archive: unpack it (e.g. unzip) and pass the folder it makes to judge what it holds"
    if name == RESULT_FILE:
        return (
            f"a {RESULT_FILE} outside a task folder: an Online-Mind2Web task folder holds {RESULT_FILE} and "
            f"{SCREENSHOT_DIR}/; move it into its task folder"
        )
    if name.endswith(JSONL_SUFFIXES):
        return f"a JSONL file, not read with format {fmt} (it reads folders); leave format at auto"
    return f"not a trajectory file: trajectories are folders or {' / '.join(JSONL_SUFFIXES)} files"


def _skipped(entry: Path, reason: str) -> Callable[[], Iterator[Trajectory]]:
    def report() -> Iterator[Trajectory]:
        raise SkippedEntry(entry, reason)
        yield  # a generator, like every job

    return report


def _holds_trajectories(folder: Path, depth: int) -> bool:
    """A folder (not itself a trajectory) with a trajectory folder inside, at most ``depth`` levels down."""
    children = _subfolders(folder)
    if any(_is_trajectory_folder(c) for c in children):
        return True
    return depth > 1 and any(_holds_trajectories(c, depth - 1) for c in children)


def _nested_jobs(
    folder: Path, fmt: str, agent: str | None, benchmark: str | None, scope: InputScope, depth: int
) -> list[Job]:
    """Every trajectory under a folder of folders. A trajectory folder's parent names its agent unless the
    user named one (the Online-Mind2Web release: SeeAct/<task_id>/...; AgentLab runs name their own).
    A subfolder that is neither a trajectory nor holds one becomes a job that fails with the reason; a
    file there, one that reports it skipped."""
    jobs: list[Job] = []
    for child in _study_entries(folder):
        if why := _superseded(child):
            jobs.append((child, _skipped(child, why)))
        elif not child.is_dir():
            reason = _skip_reason(child, fmt)
            if child.is_file() and child.name.lower().endswith(JSONL_SUFFIXES):
                reason = "a JSONL file inside a folder of trajectory folders is not read: pass it as an input"
            jobs.append((child, _skipped(child, reason)))
        elif not _is_trajectory_folder(child) and depth > 1 and _holds_trajectories(child, depth - 1):
            jobs.extend(_nested_jobs(child, fmt, agent, benchmark, scope, depth - 1))
        else:
            jobs.append((child, _single(child, fmt, agent or folder.name, benchmark, scope)))
    return jobs


def detect_format(path: Path | str) -> str:
    """The format of one trajectory (a folder, or a JSONL file); raises TrajectoryError if none fits."""
    path = Path(path)
    if path.is_file():
        if path.suffix.lower() in JSONL_SUFFIXES:
            return JSONL
        raise TrajectoryError(path, f"not a trajectory file: expected a {' or '.join(JSONL_SUFFIXES)} file")
    if not path.is_dir():
        raise TrajectoryError(path, "no such file or folder")
    formats = folder_formats()
    for fmt in formats:  # in the order they registered
        if found := fmt.detect(path):
            return found
    for fmt in formats:
        if problem := fmt.problem(path):
            raise TrajectoryError(path, problem)
    expected = " or ".join(f"{fmt.expects} ({fmt.label})" for fmt in formats)
    raise TrajectoryError(path, f"not a trajectory folder: expected {expected}" + released_records_hint(path))


def released_records_hint(path: Path) -> str:
    """For a folder of AgentRewardBench's released judge records (its index.csv beside them, or one folder
    down): what reads them instead ("; ..."), else ""."""
    try:
        index = next((i for i in (path / "index.csv", *path.glob("*/index.csv")) if i.is_file()), None)
    except OSError:
        return ""
    if index is None:
        return ""
    judges = sorted(d.name for d in index.parent.iterdir() if d.is_dir())
    return (
        f"; {index} looks like AgentRewardBench's released judge records, which are verdicts, not "
        f"trajectories: score them with `keyshot metrics --arb-index {index} --arb-judge "
        f"{judges[0] if judges else 'NAME'} --out DIR` (judges there: {', '.join(judges) or 'none'}), "
        f"or import them as teacher labels with `keyshot synth import-arb {index.parent} --run RUN`"
    )


def _load_folder(
    folder: Path, fmt: str, *, agent: str | None, benchmark: str | None, scope: InputScope
) -> Trajectory:
    scope = scope.holding(folder)  # a trajectory folder the input holds as a link: read as its target
    found = detect_format(folder) if fmt == "auto" else fmt
    if found not in FOLDER_FORMATS:
        raise TrajectoryError(
            folder, f"format {found!r} is not a folder format (a JSONL trajectory set is a file)"
        )
    reader = FOLDER_FORMATS.get(found)
    insisted = found if fmt != "auto" and found in reader.names else None  # a version the user named
    return reader.load(folder, name=insisted, agent=agent, benchmark=benchmark, scope=scope)


def load_trajectories(
    path: Path | str,
    fmt: str = "auto",
    *,
    on_error: OnError = "raise",
    agent: str | None = None,
    benchmark: str | None = None,
    errors: list[TrajectoryError] | None = None,
    allow_outside: tuple[Path | str, ...] = (),
) -> Iterator[Trajectory]:
    """Yield the trajectories in a trajectory folder, a folder of trajectory folders, or a JSONL file.

    Args:
        path: the folder or JSONL file.
        fmt: ``"auto"`` (detect per trajectory) or one of :data:`keyshot.infer.loaders.FORMATS` to force one.
        on_error: ``"raise"`` stops at the first bad trajectory; ``"skip"`` logs a warning naming the
            file, appends the error to ``errors`` (when given) and goes on.
        agent, benchmark: defaults for trajectories whose format does not name them.
        allow_outside: folders outside ``path`` that screenshot references may point into (by
            default a reference that resolves outside ``path`` fails its trajectory).

    A missing ``path`` raises :class:`TrajectoryError` at once, whatever ``on_error`` says.
    """
    path = Path(path)
    if fmt not in (choices := _format_choices()):
        raise FOLDER_FORMATS.unknown(fmt, choices)
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    if not path.exists():
        raise TrajectoryError(
            path, "a dangling symlink or a symlink loop" if path.is_symlink() else "no such file or folder"
        )
    if not (path.is_file() or path.is_dir()):
        raise TrajectoryError(
            path,
            "not a file or folder (a FIFO, socket or device): give a trajectory folder, a folder of them "
            f"or a {' or '.join(JSONL_SUFFIXES)} file",
        )
    scope = InputScope.of(path, allow_outside=allow_outside)
    if path.is_file():
        if path.name == RESULT_FILE and fmt != JSONL:
            path = path.parent  # a result.json stands for its task folder
        elif fmt in ("auto", JSONL):
            if fmt == "auto" and path.suffix.lower() not in JSONL_SUFFIXES:
                raise TrajectoryError(
                    path, f"not a trajectory file: expected a {' or '.join(JSONL_SUFFIXES)} file"
                )
            return iter_jsonl(
                path, on_error=on_error, agent=agent, benchmark=benchmark, errors=errors, scope=scope
            )
        else:
            raise TrajectoryError(path, f"format {fmt} is read from a folder, not a file")
    elif fmt == JSONL:
        raise TrajectoryError(path, "format jsonl is read from a .jsonl file, not a folder")

    if _is_trajectory_folder(path):
        jobs = [(path, _single(path, fmt, agent, benchmark, scope))]
    else:
        jobs = _folder_jobs(
            path, fmt, on_error=on_error, agent=agent, benchmark=benchmark, errors=errors, scope=scope
        )
    loaded = _run(jobs, on_error, errors)
    return loaded if agent is None else _say_recorded_agents(loaded, agent)


#: The ``agent=`` names :func:`_say_recorded_agents` has said were not used.
_SAID_AGENTS: set[str] = set()


def _say_recorded_agents(trajectories: Iterator[Trajectory], agent: str) -> Iterator[Trajectory]:
    """``trajectories``, saying once that ``agent`` was not used for those that record their own agent
    (AgentLab runs name theirs): ``agent=`` names the agent of trajectories that record none."""
    for t in trajectories:
        if t.agent != agent and agent not in _SAID_AGENTS:
            _SAID_AGENTS.add(agent)  # once in a process (a command may read its inputs twice)
            logger.warning(
                "agent=%r is not used for %s and the others that record their own agent (%r here): it names "
                "the agent of trajectories that record none",
                agent,
                t.source or t.task_id,
                t.agent,
            )
        yield t


def _single(
    folder: Path, fmt: str, agent: str | None, benchmark: str | None, scope: InputScope
) -> Callable[[], Iterator[Trajectory]]:
    def load() -> Iterator[Trajectory]:
        yield _load_folder(folder, fmt, agent=agent, benchmark=benchmark, scope=scope)

    return load


def _folder_jobs(
    folder: Path,
    fmt: str,
    *,
    on_error: OnError,
    agent: str | None,
    benchmark: str | None,
    errors: list[TrajectoryError] | None,
    scope: InputScope,
) -> list[Job]:
    """A job per entry of an input folder: a trajectory folder, a folder of them, a JSONL file, or an
    entry that is reported skipped with the reason."""
    jobs: list[Job] = []
    skipped: list[Job] = []
    children = _study_entries(folder)
    # Beside JSONL files, a subfolder that is no trajectory holds their screenshots; elsewhere it is an error.
    has_jsonl = any(c.is_file() and c.suffix.lower() in JSONL_SUFFIXES for c in children)
    for child in children:
        if child.is_dir() and has_jsonl and not _is_trajectory_folder(child):
            logger.debug(
                "%s: %s is not a trajectory folder (screenshots of the JSONL files?)", folder, child.name
            )
        elif child.is_dir() and fmt == JSONL:
            logger.debug("%s: %s is a folder, not read with format jsonl (screenshots?)", folder, child.name)
        elif why := _superseded(child):
            skipped.append((child, _skipped(child, why)))
        elif (
            child.is_dir() and not _is_trajectory_folder(child) and _holds_trajectories(child, MAX_DEPTH - 1)
        ):
            # a folder of folders: one per agent (Online-Mind2Web), or per benchmark and agent (AgentRewardBench)
            jobs.extend(_nested_jobs(child, fmt, agent, benchmark, scope, MAX_DEPTH - 1))
        elif child.is_dir():
            jobs.append((child, _single(child, fmt, agent, benchmark, scope)))
        elif child.suffix.lower() in JSONL_SUFFIXES and fmt in ("auto", JSONL):
            # (a FIFO, dangling link or symlink loop named .jsonl is refused by name, never opened)
            jobs.append(
                (
                    child,
                    lambda c=child: iter_jsonl(
                        c, on_error=on_error, agent=agent, benchmark=benchmark, errors=errors, scope=scope
                    ),
                )
            )
        else:
            skipped.append((child, _skipped(child, _skip_reason(child, fmt))))
    if not jobs:
        seen = "".join(f"; {where.name}: {_skip_reason(where, fmt)}" for where, _ in skipped[:3])
        raise TrajectoryError(
            folder,
            f"no trajectories found: expected {RESULT_FILE} (Online-Mind2Web), AgentLab run files, "
            f"trajectory folders or .jsonl files{seen}",
        )
    return jobs + skipped


def _run(jobs: list[Job], on_error: OnError, errors: list[TrajectoryError] | None) -> Iterator[Trajectory]:
    for _where, job in jobs:
        try:
            yield from job()
        except TrajectoryError as exc:
            account_for(exc, on_error, errors)


def load_trajectory(path: Path | str, fmt: str = "auto", **defaults: Any) -> Trajectory:
    """Load exactly one trajectory (a trajectory folder, or a JSONL file with one line)."""
    found = list(load_trajectories(path, fmt, on_error="raise", **defaults))
    if len(found) != 1:
        raise TrajectoryError(path, f"expected one trajectory, found {len(found)}")
    return found[0]
