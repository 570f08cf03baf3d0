"""``keyshot synth run --engine ray``: a labelling run's shards labelled on a Ray cluster, then merged.

The engine is the judge's (:mod:`keyshot.infer.engines.ray_engine`); its rows here are the run's shards,
one per actor (``--ray-actors``, default one per node): each actor runs the one-process labelling of its
shard (:func:`~keyshot.data_synth.labelling_run.run_synth` with ``RUN/shard-I-of-N``, 1/N of each budget,
its own call cache), and the driver joins them with the merge ``keyshot synth merge`` runs
(:func:`~keyshot.data_synth.label_merge.merge_synth_shards`): the labels and dataset rows of one process.
A lost actor's shard is run again by Ray and resumes from what it wrote; a re-run of the same command
labels only what is missing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from keyshot.data_synth.label_merge import merge_synth_shards
from keyshot.data_synth.labelling_run import run_synth
from keyshot.data_synth.synth_config import BuildConfig, SynthConfig
from keyshot.infer.engines.ray_cluster import connect, require_ray
from keyshot.infer.engines.ray_engine import EngineOptions, EnginePlan, run_rows
from keyshot.infer.runs.shards import ShardSpec


@dataclass
class SynthShardStage:
    """Built on each actor (:class:`~keyshot.infer.engines.ray_engine.Stage`): labels one shard."""

    cfg: SynthConfig
    retry_failed: bool

    def __call__(self) -> SynthShardStage:
        return self

    async def one(self, shard: ShardSpec) -> dict:
        report = await asyncio.to_thread(
            run_synth, self.cfg, retry_failed=self.retry_failed, build=False, shard=shard
        )
        return {"exit_code": report.exit_code, "summary": report.summary()}

    def flush(self) -> None:
        return None


@dataclass
class RaySynth:
    """What a run on Ray did: each shard's summary and exit code, and the merge (None when a shard did
    not finish: the same command finishes it)."""

    summaries: list[str]
    exit_code: int
    merged: dict | None
    built: object | None


def synth_on_ray(
    cfg: SynthConfig, engine: EngineOptions, *, retry_failed: bool, build: BuildConfig | None
) -> RaySynth:
    require_ray()
    cluster = connect(engine.address)
    try:
        count = engine.actors or cluster.nodes
        items = [(str(i), ShardSpec(i, count)) for i in range(count)]
        done = dict(
            run_rows(items, SynthShardStage(cfg, retry_failed), EnginePlan(actors=count, per_actor=1))
        )
    finally:
        cluster.close()
    results = [done[str(i)] for i in range(count)]
    code = max(r["exit_code"] for r in results)
    summaries = [f"shard {i}/{count}: {r['summary']}" for i, r in enumerate(results)]
    if code:
        return RaySynth(summaries, code, None, None)
    merged, built = merge_synth_shards(Path(cfg.run_dir), build)
    return RaySynth(summaries, 0, merged, built)
