"""What a judging run reads: the trajectories of its input paths, each once (the ones that could not be
read and the duplicates accounted for; one shard's with ``--shard``), and verdicts imported from the
reference implementation's output (``--resume-from``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.loaders import load_trajectories, released_records_hint
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.protocol.verdicts import ResumeIndex, Verdict, VerdictWriter, read_verdicts, verdict_key
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.verdict_sources import read_reference_records

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadOptions:
    """How a run reads its trajectories: the input paths, the format, the agent and benchmark of formats
    that name none, and the folders screenshots may point into (``--allow-outside``). ``keyshot judge``
    records them in ``run.json`` (:func:`~keyshot.infer.runs.run_record.record_inputs`) and ``keyshot sweep``
    reads each verdict's trajectory again with them."""

    paths: tuple[str, ...] = ()
    format: str = "auto"
    agent: str | None = None
    benchmark: str | None = None
    allow_outside: tuple[str, ...] = ()

    @classmethod
    def of(cls, paths: list[str], cfg: JudgeRunConfig, allow_outside: tuple[str, ...] = ()) -> ReadOptions:
        absolute = tuple(str(Path(p).resolve()) for p in paths)
        return cls(absolute, cfg.format, cfg.agent, cfg.benchmark).also_outside(allow_outside)

    @classmethod
    def recorded(cls, data: dict) -> ReadOptions:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields}
        return cls(**values)

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    def also_outside(self, folders: Iterable[str | Path]) -> ReadOptions:
        """These options, the screenshots also allowed to point into ``folders`` (``--allow-outside``)."""
        extra = (str(Path(p).resolve()) for p in folders)
        return dataclasses.replace(self, allow_outside=tuple(dict.fromkeys((*self.allow_outside, *extra))))

    def joined(self, earlier: ReadOptions | None) -> ReadOptions:
        """These options, keeping the paths and folders an earlier run of the same folder read too."""
        if earlier is None:
            return self
        return dataclasses.replace(
            self,
            paths=tuple(dict.fromkeys((*earlier.paths, *self.paths))),
            allow_outside=tuple(dict.fromkeys((*earlier.allow_outside, *self.allow_outside))),
        )

    def load(
        self, path: str | Path, errors: list[TrajectoryError], *, within_inputs: bool = False
    ) -> Iterator[Trajectory]:
        """The trajectories of ``path`` (one of the inputs, or a part of one: a verdict's ``source``), read as
        the run read them: ``within_inputs`` lets its screenshots point anywhere in the run's inputs, as they
        could when the run read the whole input."""
        outside = (*self.allow_outside, *(self.paths if within_inputs else ()))
        return load_trajectories(
            path,
            self.format,
            on_error="skip",
            agent=self.agent,
            benchmark=self.benchmark,
            errors=errors,
            allow_outside=outside,
        )


@dataclass
class Inputs:
    """What a run's input paths hold: the trajectories to judge (one per identity; with a shard, only
    its own; at most ``limit``), the ones that could not be read (with a shard, reported by shard 0
    alone), the duplicates, how many the whole input holds (``found``), how many the shard owns and how
    many the limit left out."""

    trajectories: list[Trajectory]
    errors: list[TrajectoryError]
    duplicates: list[str]
    found: int
    owned: int
    beyond_limit: int = 0
    read_with: ReadOptions = ReadOptions()


def load_all(
    paths: list[str],
    cfg: JudgeRunConfig,
    allow_outside: tuple[str, ...] = (),
    shard: ShardSpec | None = None,
) -> Inputs:
    """The input's trajectories, each once (:class:`Inputs`)."""
    trajectories: list[Trajectory] = []
    errors: list[TrajectoryError] = []
    options = ReadOptions.of(paths, cfg, allow_outside)
    for p in paths:
        trajectories.extend(options.load(p, errors))
    found = len(trajectories)
    if shard is not None:
        trajectories = [t for t in trajectories if shard.holds(t, cfg.shard_by)]
        errors = errors if shard.index == 0 else []
    owned = len(trajectories)
    unique, duplicates = _unique(trajectories)
    kept = unique if cfg.limit is None else unique[: cfg.limit]
    return Inputs(kept, errors, duplicates, found, owned, len(unique) - len(kept), options)


def _unique(trajectories: list[Trajectory]) -> tuple[list[Trajectory], list[str]]:
    """One trajectory per identity, and a line for each duplicate left out."""
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
    return unique, duplicates


def other_inputs_message(
    out: Path, existing: list[Verdict], trajectories: list[Trajectory], todo: list[Trajectory]
) -> str | None:
    """Why judging ``todo`` (of the input's ``trajectories``) into ``out`` would mix them with the
    verdicts of other inputs, or None.

    A verdict is of this input when its identity is one of the input's (one without an agent, imported
    from a reference output, when its task is). An input that covers the folder's verdicts (the same
    folders again, more of them, a larger limit) resumes; one with nothing left to judge adds nothing.
    """
    mine = {verdict_key(t.task_id, t.agent, t.run) for t in trajectories}
    tasks = {str(t.task_id) for t in trajectories}
    others = {v.key for v in existing if v.key not in mine and (v.agent or v.task_id not in tasks)}
    if not others or not todo:
        return None
    return (
        f"{out} holds verdicts of {len(others)} trajectories that are not in this input; of this input's "
        f"{len(trajectories)}, {len(trajectories) - len(todo)} are judged there and {len(todo)} would be "
        "added beside them: pass --append to mix them in one folder, or use another --out"
    )


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
    shown = "; ".join(str(e) for e in load_errors[:3])
    hints = "".join(h for h in map(released_records_hint, map(Path, paths)) if h not in shown)
    if not load_errors:
        return f"no trajectories in {', '.join(paths)}: {looked}{hints}"
    more = f" (and {len(load_errors) - 3} more)" if len(load_errors) > 3 else ""
    return (
        f"no readable trajectory in {', '.join(paths)} ({looked}): {len(load_errors)} failed: {shown}{more}"
        f"{hints}"
    )
