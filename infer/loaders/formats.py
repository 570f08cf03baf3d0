"""The trajectory formats read from a folder, by name: each module of ``infer/loaders/`` that reads one
registers it here (:func:`register_folder_format`, at its end), and :func:`keyshot.infer.loaders.load_trajectories`
asks this registry which format a folder is and which reader loads it. Every module of the package is
imported with it, so a new format is one module (and its test), nothing else (docs/contributing.md).

A format's folder is found by :attr:`FolderFormat.holds` (the folder walk: its files are there, maybe
broken), told apart by :attr:`FolderFormat.detect` (which of the format's names the folder is, in the
order the formats registered; a folder of the format that cannot be read raises its
:class:`~keyshot.infer.loaders.trajectory.TrajectoryError`) and read by :attr:`FolderFormat.load`.
JSONL files are the one file format (:mod:`keyshot.infer.loaders.jsonl`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.registry import Registry
from keyshot.infer.loaders.trajectory import Trajectory


@dataclass(frozen=True)
class FolderFormat:
    """A trajectory format read from a folder.

    ``names``: its names, as ``Trajectory.format`` and ``--format`` say them (a format with versions has
    one each); ``any_name``: a name that reads any of them (``online-mind2web``); ``label`` and
    ``expects``: how the line that finds no format names it ("result.json (Online-Mind2Web)");
    ``holds(folder)``: the folder has the format's files; ``detect(folder)``: which of ``names`` the folder
    is, or None when it is not of this format; ``problem(folder)``: why a folder that ``holds`` its files
    but is not of it cannot be read, or None; ``load(folder, name=, agent=, benchmark=, scope=)``: the
    trajectory (``name``: the one of ``names`` the user insisted on, else None)."""

    names: tuple[str, ...]
    label: str
    expects: str
    holds: Callable[[Path], bool]
    detect: Callable[[Path], str | None]
    load: Callable[..., Trajectory]
    problem: Callable[[Path], str | None] = lambda folder: None
    any_name: str | None = None


#: Every folder format, under each of its names and its ``any_name``.
FOLDER_FORMATS: Registry[FolderFormat] = Registry("trajectory format", "format")


def register_folder_format(fmt: FolderFormat) -> FolderFormat:
    """Register ``fmt`` under its names (a name taken already is refused)."""
    for name in (*fmt.names, *([fmt.any_name] if fmt.any_name else [])):
        FOLDER_FORMATS.add(name, fmt)
    return fmt


def folder_formats() -> list[FolderFormat]:
    """The folder formats, each once, in the order they registered."""
    found: list[FolderFormat] = []
    for _, fmt in FOLDER_FORMATS.items():
        if not any(f is fmt for f in found):
            found.append(fmt)
    return found


def format_names() -> tuple[str, ...]:
    """The names of the folder formats' versions (``Trajectory.format``'s values), without the
    ``any_name`` ones."""
    return tuple(name for fmt in folder_formats() for name in fmt.names)
