"""``keyshot synth merge RUN``: join the shards of a synthesis run, then build the dataset.

``keyshot synth run --shard I/N`` labels shard I's trajectories into ``RUN/shard-I-of-N`` (a run folder of
its own: labels, call cache, usage, lock; 1/N of each budget). The merge checks that every shard finished
and that all were made under one prompt set, image policy and parse mode, then writes ``RUN/labels.jsonl``
(the shards' stores, streamed one after the other: their trajectories are disjoint), ``RUN/run.json`` and
``RUN/usage/`` (every shard's sessions), and builds ``RUN/dataset`` from them as ``keyshot synth build``
would. Nothing is written when a shard is missing or unfinished; the error names each one by number.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from keyshot.data_synth.dataset import BuildConfig, BuildResult, build_dataset
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import LABELS_FILE
from keyshot.data_synth.run_folder import (
    USAGE_DIR,
    RunManifest,
    manifest_conflict,
    read_manifest,
    write_json_atomic,
    write_manifest,
)
from keyshot.infer.runs.run_record import RUN_FILE
from keyshot.infer.runs.shard_merge import Shard, ShardKind, copy_shard, merging, stream_shards
from keyshot.infer.runs.shards import ShardError

MERGED_FILE = "merged.json"


def _problem(shard: Shard) -> str | None:
    """Why a finished label shard cannot be merged: its run ended with an error."""
    code = shard.summary.get("exit_code")
    if code:
        return f"ended with exit code {code}: {shard.summary.get('summary', '')[-300:]}"
    return None


LABEL_SHARDS = ShardKind(
    command="keyshot synth merge",
    data_file=LABELS_FILE,
    rerun="keyshot synth run … | slurm/synth.sh",
    problem=_problem,
    foreign="(labels imported or made without --shard); merge the shards into another run folder",
)


def common_manifest(shards: list[Shard]) -> RunManifest:
    """One manifest for the merged run: shard 0's settings, every shard's sessions. Raises naming a
    shard without a manifest or made under another prompt set, image policy or parse mode."""
    manifests = {}
    for shard in shards:
        manifests[shard.index] = read_manifest(shard.folder)
        if manifests[shard.index] is None:
            raise ShardError(f"{shard.folder}: no {RUN_FILE}; re-run shard {shard.index}")
    first = manifests[0]
    for index, m in sorted(manifests.items()):
        conflict = manifest_conflict(first, m.prompt_version, m.image_policy, m.parse_mode)
        if conflict:
            raise SynthError(f"shard {index} cannot join shard 0: {conflict}; nothing was merged")
    sessions = [s for i in sorted(manifests) for s in manifests[i].sessions]
    return dataclasses.replace(first, sessions=sessions)


def _copy_usage(run_dir: Path, shards: list[Shard]) -> None:
    """Every shard's usage files into ``RUN/usage``, named by their shard."""
    usage = run_dir / USAGE_DIR
    shutil.rmtree(usage, ignore_errors=True)
    for shard in shards:
        for path in sorted((shard.folder / USAGE_DIR).glob("*.json")):
            usage.mkdir(exist_ok=True)
            shutil.copy2(path, usage / f"{shard.folder.name}-{path.name}")


def merge_synth_shards(
    run_dir: str | Path, build: BuildConfig | None = None
) -> tuple[dict, BuildResult | None]:
    """Merge ``RUN/shard-I-of-N`` into ``RUN`` and build the dataset (unless ``build`` is None)."""
    run_dir = Path(run_dir)
    with merging(run_dir, LABEL_SHARDS) as shards:
        manifest = common_manifest(shards)
        stream_shards(
            run_dir,
            shards,
            LABEL_SHARDS,
            merged_before=(run_dir / MERGED_FILE).exists(),
            write=lambda shard, path, writer: copy_shard(path, writer),
        )
        write_manifest(run_dir, manifest)
        _copy_usage(run_dir, shards)
        merged = {"shards": len(shards), "summaries": {s.index: s.summary.get("summary", "") for s in shards}}
        write_json_atomic(run_dir / MERGED_FILE, merged)
    result = build_dataset(run_dir, build) if build is not None else None
    return merged, result
