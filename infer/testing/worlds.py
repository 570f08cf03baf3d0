"""Synthetic trajectory sets of a chosen size, written as keyshot JSONL with PNG screenshots.

Each screenshot is a flat page with noise whose brightness varies, so the fake judge's ``brightness``
rule gives every screenshot a definite 1-5 score and the outcome depends on which are kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from keyshot.infer.loaders.jsonl import write_jsonl
from keyshot.infer.loaders.trajectory import Screenshot, Trajectory


def synthetic_trajectories(
    root: Path | str,
    n_trajectories: int,
    screenshots: int | list[int] = 4,
    *,
    seed: int = 0,
    size: tuple[int, int] = (320, 200),
    agent: str = "synthetic-agent",
) -> Path:
    """Write ``n_trajectories`` trajectories under ``root``; returns the JSONL file.

    ``screenshots`` is the count per trajectory, or one count per trajectory.
    """
    root = Path(root)
    shots_dir = root / "screenshots"
    shots_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    counts = screenshots if isinstance(screenshots, list) else [screenshots] * n_trajectories
    trajectories = []
    for t, count in enumerate(counts[:n_trajectories]):
        shots = []
        for i in range(count):
            level = int(rng.integers(0, 256))
            pixels = np.clip(rng.normal(level, 12, (size[1], size[0], 3)), 0, 255).astype(np.uint8)
            path = shots_dir / f"t{t:05d}_{i:03d}.png"
            Image.fromarray(pixels).save(path, compress_level=1)
            shots.append(Screenshot(path=path, index=i))
        trajectories.append(
            Trajectory(
                task_id=f"task-{t:05d}",
                task=f"Find the page number {t} and open its settings",
                actions=[f"click(step {i})" for i in range(count)],
                screenshots=shots,
                agent=agent,
                benchmark="synthetic",
            )
        )
    out = root / "trajectories.jsonl"
    write_jsonl(trajectories, out)
    return out
