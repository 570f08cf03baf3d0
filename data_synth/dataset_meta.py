"""A built dataset's description, ``keyshot_dataset.json``: prompt version, image policy, data hash,
rows per split, teachers, aggregation and split summaries. The dataset build writes it, the card
quotes it and training copies it into the checkpoint metadata."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyshot.data_synth.errors import SynthError
from keyshot.data_synth.run_folder import write_json_atomic

META_FILE = "keyshot_dataset.json"


@dataclass
class DatasetMeta:
    """What training writes into the checkpoint metadata (``keyshot_dataset.json``)."""

    prompt_variant: str
    prompt_version: str
    image_policy: dict
    data_hash: str
    rows: dict[str, int]
    teachers: list[str]
    aggregation: dict
    splits: dict
    duplicates: dict = field(default_factory=dict)  # rows collapsed into an identical row


def read_dataset_meta(dataset_dir: str | os.PathLike) -> DatasetMeta:
    """The prompt version, image policy and data hash of a dataset built by keyshot."""
    path = Path(dataset_dir) / META_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SynthError(f"{path}: missing; {dataset_dir} was not built by keyshot synth build") from None
    except json.JSONDecodeError as exc:
        raise SynthError(f"{path}: not valid JSON ({exc.msg})") from None
    try:
        return DatasetMeta(**data)
    except TypeError as exc:
        raise SynthError(f"{path}: not a keyshot dataset description ({exc})") from None


def write_dataset_meta(dataset_dir: Path, meta: DatasetMeta) -> Path:
    """Write ``keyshot_dataset.json`` into ``dataset_dir`` atomically."""
    path = dataset_dir / META_FILE
    write_json_atomic(path, asdict(meta))
    return path
