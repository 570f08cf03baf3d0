"""Self-describing scorer checkpoints (docs/architecture.md, "Self-describing checkpoints").

A keyshot checkpoint is a normal Hugging Face folder (weights, processor with its pixel bounds,
chat template, greedy ``generation_config.json``) plus ``keyshot.json``: the prompt set and version
the scorer was trained on, the image policy, the base model, a hash of the training data and the length
of the answers it was trained on. ``keyshot serve`` reads it to pass matching flags to vLLM and refuses a
prompt-version mismatch; ``keyshot serve`` and ``keyshot judge`` allow answers as long as the trained ones.

This module is about the *servable folder* (its ``keyshot.json``, read and written). Resumable training
state (optimizer, scheduler, RNG, ``trainer_state.json``) and the writing of the final folder at the end
of a run are :mod:`keyshot.train.checkpointing`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.protocol.images import pixel_bounds

META_FILE = "keyshot.json"


class CheckpointError(KeyshotError, ValueError):
    """A checkpoint folder that is missing something keyshot needs."""


def looks_like_local_path(model: str) -> bool:
    """A path rather than a hub id (``org/name``): it exists, starts with / . ~ or has more than one slash."""
    return model.startswith(("/", ".", "~")) or model.count("/") > 1 or Path(model).expanduser().exists()


def model_folder_problem(model: str | os.PathLike) -> str | None:
    """Why ``model``, a local path, is not a model folder ("no such folder", "a file", "a folder without
    config.json"), or None when it is one. The one check of ``keyshot serve``, ``keyshot judge`` and
    ``train/sft.py`` (each says what to pass instead)."""
    path = Path(model).expanduser()
    if not path.exists():
        return "no such folder"
    if path.is_file():
        return "a file"
    return None if (path / "config.json").is_file() else "a folder without config.json"


@dataclass
class CheckpointMeta:
    prompt_variant: str
    prompt_version: str
    min_pixels: int
    max_pixels: int
    base_model: str = ""
    max_length: int | None = None
    data_hash: str | None = None
    image_policy: dict = field(default_factory=dict)  # ImagePolicy fields, for the record
    # the answers trained on, in tokens with their <|im_end|>: {"max", "p99", "rows"} ({} when unknown)
    answer_tokens: dict = field(default_factory=dict)
    keyshot_version: str = ""
    created: str = ""
    extra: dict = field(default_factory=dict)


def write_meta(checkpoint_dir: str | os.PathLike, meta: CheckpointMeta) -> Path:
    """Write ``keyshot.json`` atomically (fills ``created`` and ``keyshot_version`` if empty)."""
    from importlib.metadata import PackageNotFoundError, version

    d = Path(checkpoint_dir)
    d.mkdir(parents=True, exist_ok=True)
    if not meta.created:
        meta.created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if not meta.keyshot_version:
        try:
            meta.keyshot_version = version("keyshot")
        except PackageNotFoundError:
            meta.keyshot_version = "unknown"
    return write_text_atomic(d / META_FILE, json.dumps(dataclasses.asdict(meta), indent=2))


def write_scorer_meta(
    folder: str | os.PathLike, policy, *, base_model: str, variant: str = "online_mind2web"
) -> Path:
    """Make a model folder a scorer checkpoint for ``variant``'s prompt set under image ``policy`` (an
    ``keyshot.infer.protocol.images.ImagePolicy``): the tiny test model, the GPU kit's random weights."""
    from keyshot.infer.protocol.prompts import load_prompt_set

    prompts = load_prompt_set(variant)
    meta = CheckpointMeta(
        prompt_variant=prompts.variant,
        prompt_version=prompts.version,
        min_pixels=policy.min_pixels,
        max_pixels=policy.max_pixels,
        base_model=base_model,
        image_policy=policy.to_dict(),
    )
    write_meta(folder, meta)
    return Path(folder)


def read_meta(checkpoint_dir: str | os.PathLike) -> CheckpointMeta | None:
    """Return the checkpoint's keyshot metadata, or None for a plain (e.g. base) model folder; a file that
    cannot be read, or a field of the wrong type, raises CheckpointError naming the file and field."""
    path = Path(checkpoint_dir) / META_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {exc.start}); write it again as UTF-8") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object of checkpoint fields")
    missing = {"prompt_variant", "prompt_version", "min_pixels", "max_pixels"} - set(data)
    if missing:
        raise CheckpointError(f"{path}: missing field(s) {sorted(missing)}")
    fields = {k: v for k, v in data.items() if k in _META_TYPES}
    for name, value in fields.items():
        if not _fits(value, _META_TYPES[name]):
            raise CheckpointError(
                f"{path}: field {name!r} must be {_type_words(_META_TYPES[name])}, got {value!r}; "
                "write the checkpoint again (or correct the field)"
            )
    if not 0 < fields["min_pixels"] <= fields["max_pixels"]:
        raise CheckpointError(
            f"{path}: fields 'min_pixels' ({fields['min_pixels']}) and 'max_pixels' ({fields['max_pixels']}) "
            "must be positive with min_pixels <= max_pixels"
        )
    return CheckpointMeta(**fields)


#: The type of each field of keyshot.json, from CheckpointMeta's annotations.
_META_TYPES = typing.get_type_hints(CheckpointMeta)


def _options(tp: Any) -> tuple:
    return typing.get_args(tp) if isinstance(tp, types.UnionType) else (tp,)


def _fits(value: Any, tp: Any) -> bool:
    """``value`` (read from JSON) is of type ``tp`` (a bool is no int)."""
    return any(
        value is None
        if option is type(None)
        else isinstance(value, option) and (option is bool or not isinstance(value, bool))
        for option in _options(tp)
    )


def _type_words(tp: Any) -> str:
    words = {str: "a string", int: "an integer", dict: "a JSON object", type(None): "null"}
    return " or ".join(words.get(option, option.__name__) for option in _options(tp))


def trained_answer_tokens(model: str | os.PathLike | None) -> int | None:
    """The longest answer (in tokens) the scorer in ``model`` was trained on, from its ``keyshot.json``;
    None when that is unknown (no local folder, no metadata, a checkpoint written before it was recorded)."""
    if not model or not Path(model).expanduser().is_dir():
        return None
    meta = read_meta(Path(model).expanduser())
    longest = meta.answer_tokens.get("max") if meta is not None and meta.answer_tokens else None
    return int(longest) if longest else None


def saved_pixel_bounds(checkpoint_dir: str | os.PathLike) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) of the image processor saved in a checkpoint folder, if any."""
    d = Path(checkpoint_dir)
    for name in ("processor_config.json", "preprocessor_config.json"):
        p = d / name
        if not p.exists():
            continue
        cfg = json.loads(p.read_text(encoding="utf-8"))
        bounds = pixel_bounds(cfg.get("image_processor", cfg))
        if bounds:
            return bounds
    return None
