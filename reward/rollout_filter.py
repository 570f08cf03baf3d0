"""Rejection sampling: every rollout under some folders judged by the reward model, those at or above a
reward kept (``keyshot reward filter`` is its command line).

``OUT/rewards.jsonl`` holds every rollout's record (:func:`filter_record`; an unreadable one with its
reason), ``OUT/accepted.jsonl`` those with reward >= the minimum; with ``link``, each accepted trajectory
folder is linked into ``OUT/accepted/`` under the path it has below its input (AgentLab's
``<time>_<agent>_on_<task>`` names, Online-Mind2Web's ``<agent>/<task>`` folders), so that ``keyshot judge
OUT/accepted`` reads each with its own agent, task and run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.engines.ray_cluster import connect, require_ray
from keyshot.infer.engines.ray_engine import ClusterLedger, EngineOptions, run_rows
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.reward.model import RewardModel, RewardResult, reward_config

REWARDS_FILE = "rewards.jsonl"
ACCEPTED_FILE = "accepted.jsonl"
ACCEPTED_DIR = "accepted"


class RolloutFilterError(KeyshotError):
    """A filter that cannot run (no rollouts at all)."""


@dataclass(frozen=True)
class FilterResult:
    """What a filter wrote: every rollout's record, how many were accepted, how many got no reward (of
    them, how many because a call failed: neither accepted nor rejected), and the accepted rollouts that
    could not be linked (a JSONL line has no folder), each with the reason."""

    out: Path
    records: list[dict]
    accepted: int
    failed: int
    failed_calls: int
    not_linked: list[str]


def read_rollouts(paths: list[str]) -> tuple[list[tuple[Trajectory, Path]], list[TrajectoryError]]:
    """Every rollout under ``paths``, each with the input path it was found under."""
    found: list[tuple[Trajectory, Path]] = []
    errors: list[TrajectoryError] = []
    for path in paths:
        found.extend((t, Path(path)) for t in load_trajectories(path, on_error="skip", errors=errors))
    return found, errors


def filter_record(t: Trajectory, r: RewardResult) -> dict:
    """``t``'s line of ``OUT/rewards.jsonl``: who and what it is, and its reward or why it has none."""
    return {
        "id": t.uid,
        "agent": t.agent,
        "benchmark": t.benchmark,
        "task_id": t.task_id,
        "run": t.run,
        "source": str(t.source) if t.source else None,
        "reward": None if r.failed else r.reward,  # on_failure's stand-in value is no reward to filter by
        "progress": r.progress,
        "error": r.error,
        "kind": r.kind,
    }


def link_name(t: Trajectory, root: Path) -> Path:
    """Where ``t``'s folder is linked in ``OUT/accepted``: its path below the input it was found under
    (``<agent>/<task>`` of Online-Mind2Web, AgentLab's ``<time>_<agent>_on_<task>``), the names its
    identity is read from; its own name when the input was the folder itself."""
    source = Path(t.source)
    try:
        below = source.absolute().relative_to(root.absolute())
    except ValueError:
        below = Path(source.name)
    return below if below.parts and ".." not in below.parts else Path(source.name)


def link_accepted(out: Path, accepted: list[tuple[Trajectory, Path]]) -> list[str]:
    """Link each accepted trajectory's folder into ``OUT/accepted`` (:func:`link_name`); a JSONL line has no
    folder of its own: listed in the return, not linked."""
    folder = out / ACCEPTED_DIR
    folder.mkdir(parents=True, exist_ok=True)
    not_linked = []
    for t, root in accepted:
        if t.source is None or not Path(t.source).is_dir():
            not_linked.append(f"{t.uid}: its source {t.source} is not a folder (a JSONL line); not linked")
            continue
        link = folder / link_name(t, root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(Path(t.source).resolve(), target_is_directory=True)
    return not_linked


@dataclass
class RewardStage:
    """``--engine ray``: the reward model of the run's config, built on each actor
    (:class:`~keyshot.infer.engines.ray_engine.Stage`), scoring one rollout at a time."""

    config: str
    overrides: tuple[str, ...]
    ledger: ClusterLedger

    def __call__(self) -> RewardStage:
        self.model = RewardModel(*reward_config(self.config, *self.overrides), ledger=self.ledger)
        return self

    async def one(self, trajectory: Trajectory) -> dict:
        return {"result": (await self.model.score([trajectory]))[0]}

    def flush(self) -> None:
        return None


def score_on_ray(
    config: str, overrides: list[str], trajectories: list[Trajectory], engine: EngineOptions
) -> list[RewardResult]:
    """Each rollout's result, in order, scored on a Ray cluster (each actor its reward model, the config's
    ``concurrency`` shared out over them; one ledger, so the budget and, unless ``--ray-per-actor``, each
    endpoint's cap hold over the cluster, as for ``keyshot judge``)."""
    cfg = reward_config(config, *overrides)[0]  # a bad config is refused before the cluster
    cluster = connect(engine.address)
    try:
        items = [(str(i), t) for i, t in enumerate(trajectories)]
        stage = RewardStage(
            config, tuple(overrides), ClusterLedger.create(engine.slot_caps(cfg.called_endpoints()))
        )
        by_key = {
            k: r["result"] for k, r in run_rows(items, stage, engine.plan(cfg.concurrency, cluster.nodes))
        }
    finally:
        cluster.close()
    return [by_key[str(i)] for i in range(len(trajectories))]


def filter_rollouts(
    config: str,
    overrides: list[str],
    paths: list[str],
    out: str | Path,
    *,
    min_reward: float,
    link: bool,
    engine: EngineOptions | None = None,
) -> FilterResult:
    """Judge every rollout under ``paths`` with the reward model of ``config`` (and ``key=value``
    ``overrides``), write ``OUT/rewards.jsonl`` and ``OUT/accepted.jsonl`` (reward >= ``min_reward``), and
    with ``link`` link the accepted folders into ``OUT/accepted/``. ``engine``: score on a Ray cluster."""
    if engine is not None:
        require_ray()
    rm = RewardModel.from_config(config, *overrides) if engine is None else None
    try:
        found, errors = read_rollouts(paths)
        trajectories = [t for t, _ in found]
        if not trajectories and not errors:
            raise RolloutFilterError(f"no rollouts found in {', '.join(paths)}")
        if rm is None:
            results = score_on_ray(config, overrides, trajectories, engine)
        else:
            results = rm.score_sync(trajectories)
    finally:
        if rm is not None:
            rm.close()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    records = [filter_record(t, r) for t, r in zip(trajectories, results, strict=True)]
    records += [
        {
            "id": None,
            "source": str(e.path),
            "reward": None,
            "progress": None,
            "error": f"input: {e}",
            "kind": "input",
        }
        for e in errors
    ]
    accepted = [
        (t, root)
        for (t, root), r in zip(found, results, strict=True)
        if not r.failed and r.reward is not None and r.reward >= min_reward
    ]
    lines = lambda rows: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # noqa: E731
    write_text_atomic(out / REWARDS_FILE, lines(records))
    accepted_ids = {t.uid for t, _ in accepted}
    write_text_atomic(out / ACCEPTED_FILE, lines([r for r in records if r["id"] in accepted_ids]))
    return FilterResult(
        out=out,
        records=records,
        accepted=len(accepted),
        failed=sum(r.failed for r in results) + len(errors),
        failed_calls=sum(r.failed and r.kind != "input" for r in results),
        not_linked=link_accepted(out, accepted) if link else [],
    )
