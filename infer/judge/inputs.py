"""What a judging run reads: the trajectories of its input paths, each once (the ones that could not be
read and the duplicates accounted for; one shard's with ``--shard``), and verdicts imported from the
reference implementation's output (``--resume-from``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.protocol.verdicts import ResumeIndex, VerdictWriter, read_verdicts, verdict_key
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.verdict_sources import read_reference_records

logger = logging.getLogger(__name__)


def load_all(
    paths: list[str],
    cfg: JudgeRunConfig,
    allow_outside: tuple[str, ...] = (),
    shard: ShardSpec | None = None,
) -> tuple[list[Trajectory], list[TrajectoryError], list[str], int]:
    """The input's trajectories (one per identity; with ``shard``, only that shard's), the ones that
    could not be read (with ``shard``, reported by shard 0 alone), the duplicates, and how many
    trajectories the whole input holds."""
    trajectories: list[Trajectory] = []
    errors: list[TrajectoryError] = []
    for p in paths:
        trajectories.extend(
            load_trajectories(
                p,
                cfg.format,
                on_error="skip",
                agent=cfg.agent,
                benchmark=cfg.benchmark,
                errors=errors,
                allow_outside=allow_outside,
            )
        )
    found = len(trajectories)
    if shard is not None:
        trajectories = [t for t in trajectories if shard.holds(t, cfg.shard_by)]
        errors = errors if shard.index == 0 else []
    seen: dict[tuple[str, str, str], Trajectory] = {}
    unique = []
    duplicates: list[str] = []
    for t in trajectories:
        key = verdict_key(t.task_id, t.agent, t.run)
        if key in seen:
            first = seen[key].source
            if first == t.source:
                why = f"task {t.task_id} (agent {t.agent}, run {t.run}) is the same trajectory reached twice; judged once"
            elif t.agent is None:
                raise JudgeRunError(
                    f"{t.source}: task {t.task_id} is also in {first} and no agent name tells the two apart; "
                    "nothing was judged: put the agent folders under one parent folder and pass that (each "
                    "folder's name names its agent), or judge each folder with --agent NAME"
                )
            else:
                why = f"task {t.task_id} (agent {t.agent}, run {t.run}) is the same identity as {first}; judged once"
            duplicates.append(f"{t.source}: {why}")
            logger.warning("%s", duplicates[-1])
            continue
        seen[key] = t
        unique.append(t)
    if cfg.limit is not None:
        unique = unique[: cfg.limit]
    return unique, errors, duplicates, found


def import_reference_verdicts(
    path: str, out_file: Path, threshold: float, trajectories: list[Trajectory] | None = None
) -> tuple[int, int]:
    """Append the reference outputs' verdicts that ``out_file`` does not have yet, only for tasks of
    ``trajectories`` (when given); returns (imported, left out because not in the input)."""
    records = read_reference_records(path, threshold=int(threshold))
    left_out = 0
    if trajectories is not None:
        keys = {(t.task_id, t.agent or "") for t in trajectories}
        tasks = {t.task_id for t in trajectories}
        kept = [r for r in records if ((r.task_id, r.agent or "") in keys if r.agent else r.task_id in tasks)]
        left_out = len(records) - len(kept)
        records = kept
    have = ResumeIndex(read_verdicts(out_file))
    new = [r for r in records if not have.done(r.task_id, r.agent)]
    with VerdictWriter(out_file) as writer:
        for v in new:
            writer.append(v)
    logger.info("imported %d of %d reference records from %s", len(new), len(records), path)
    if left_out:
        logger.warning("%s: %d records are of tasks not in the input; left out", path, left_out)
    return len(new), left_out


def nothing_found_message(paths: list[str], load_errors: list[TrajectoryError]) -> str:
    """What was looked for and what was seen instead, when no trajectory could be read."""
    looked = (
        "looked for Online-Mind2Web task folders (result.json + trajectory/), per-agent folders of them, "
        "AgentLab runs (summary_info.json, screenshot_step_N.png) and .jsonl files"
    )
    if not load_errors:
        return f"no trajectories in {', '.join(paths)}: {looked}"
    shown = "; ".join(str(e) for e in load_errors[:3])
    more = f" (and {len(load_errors) - 3} more)" if len(load_errors) > 3 else ""
    return (
        f"no readable trajectory in {', '.join(paths)} ({looked}): {len(load_errors)} failed: {shown}{more}"
    )
