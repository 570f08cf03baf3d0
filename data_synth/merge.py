"""``keyshot synth merge RUN``: join the shards of a synthesis run, then build the dataset.

``keyshot synth run --shard I/N`` labels shard I's trajectories into ``RUN/shard-I-of-N`` (a run folder of
its own: labels, call cache, usage, lock; 1/N of each budget). The merge checks that every shard finished
and that all were made under one prompt set, image policy and parse mode, then writes ``RUN/labels.jsonl``
(the shards' stores, streamed one after the other: their trajectories are disjoint), ``RUN/run.json`` and
``RUN/usage/`` (every shard's sessions), and builds ``RUN/dataset`` from them as ``keyshot synth build``
would. Nothing is written when a shard is missing or unfinished; the error names each one by number.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

from keyshot.data_synth.dataset import BuildConfig, BuildResult, build_dataset
from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.labels import LABELS_FILE
from keyshot.data_synth.run_folder import (
    MANIFEST_FILE,
    USAGE_DIR,
    manifest_conflict,
    read_manifest,
    write_json_atomic,
)
from keyshot.infer.common.fileio import atomic_output
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.shards import ShardError, find_shards, read_summary, refuse_unmergeable, unfinished

MERGED_FILE = "merged.json"


def _check(run_dir: Path) -> tuple[int, dict[int, Path]]:
    count, folders = find_shards(run_dir)
    problems: dict[int, str] = {}
    for index, folder in sorted(folders.items()):
        why = unfinished(folder, LABELS_FILE, "keyshot synth merge")
        code = (read_summary(folder) or {}).get("exit_code")
        if why is None and code:
            why = f"ended with exit code {code}: {read_summary(folder).get('summary', '')[-300:]}"
        if why is not None:
            problems[index] = why
    refuse_unmergeable(run_dir, count, folders, problems, "keyshot synth run … | slurm/synth.sh")
    return count, folders


def merge_synth_shards(
    run_dir: str | Path, build: BuildConfig | None = None
) -> tuple[dict, BuildResult | None]:
    """Merge ``RUN/shard-I-of-N`` into ``RUN`` and build the dataset (unless ``build`` is None)."""
    run_dir = Path(run_dir)
    find_shards(run_dir)  # before the lock, which would create a folder that is not there
    with RunLock(run_dir, what="keyshot synth merge"):
        count, folders = _check(run_dir)
        manifests = {i: read_manifest(f) for i, f in folders.items()}
        first = manifests[0]
        if first is None:
            raise ShardError(f"{folders[0]}: no {MANIFEST_FILE}; re-run shard 0")
        for index, m in sorted(manifests.items()):
            if m is None:
                raise ShardError(f"{folders[index]}: no {MANIFEST_FILE}; re-run shard {index}")
            conflict = manifest_conflict(first, m.prompt_version, m.image_policy, m.parse_mode)
            if conflict:
                raise SynthError(f"shard {index} cannot join shard 0: {conflict}; nothing was merged")
        labels = run_dir / LABELS_FILE
        if labels.exists() and not (run_dir / MERGED_FILE).exists():
            raise SynthError(
                f"{labels} exists and was not written by keyshot synth merge (labels imported or made "
                "without --shard); merge the shards into another run folder, nothing was merged"
            )
        with atomic_output(labels, sync=True) as writer:
            for index in sorted(folders):
                path = folders[index] / LABELS_FILE
                if path.is_file():
                    with open(path, "rb") as fh:
                        shutil.copyfileobj(fh, writer)
        manifest = asdict(first)
        manifest["sessions"] = [s for i in sorted(manifests) for s in manifests[i].sessions]  # type: ignore[union-attr]
        write_json_atomic(run_dir / MANIFEST_FILE, manifest)
        usage = run_dir / USAGE_DIR
        shutil.rmtree(usage, ignore_errors=True)
        for _, folder in sorted(folders.items()):
            for path in sorted((folder / USAGE_DIR).glob("*.json")):
                usage.mkdir(exist_ok=True)
                shutil.copy2(path, usage / f"{folder.name}-{path.name}")
        merged = {
            "shards": count,
            "summaries": {i: (read_summary(f) or {}).get("summary", "") for i, f in sorted(folders.items())},
        }
        write_json_atomic(run_dir / MERGED_FILE, merged)
    result = build_dataset(run_dir, build) if build is not None else None
    return merged, result
