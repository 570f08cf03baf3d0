"""Trajectories that only their run's loader options read as judged: a JSONL file whose screenshots lie
outside its folder (readable only with ``--allow-outside``) and that names no agent or benchmark (named only
by ``agent=`` and ``benchmark=``). What reads them again (a sweep) must read them with those options."""

from __future__ import annotations

from pathlib import Path

from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.jsonl import write_jsonl
from keyshot.infer.testing.worlds import synthetic_trajectories


def nameless_inputs(root: Path, counts: list[int], seed: int = 2) -> tuple[Path, Path]:
    """``len(counts)`` such trajectories (``counts`` screenshots each) under ``root``: the JSONL file, and
    the folder of their screenshots (to pass to ``--allow-outside``)."""
    made = synthetic_trajectories(root / "world", len(counts), counts, seed=seed, size=(320, 200))
    trajectories = list(load_trajectories(made))
    for t in trajectories:
        t.agent = t.benchmark = None
    inputs = root / "inputs" / "trajectories.jsonl"
    inputs.parent.mkdir()
    write_jsonl(trajectories, inputs)
    return inputs, root / "world"
