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
import hashlib
import json
import os
import re
import types
import typing
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.protocol.images import DEFAULT_POLICY, ImagePolicy, pixel_bounds

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
    cannot be read, or a field of the wrong type, raises CheckpointError naming the file and field.
    Training reads back what it wrote with it; a scorer's users take :func:`describe_checkpoint`."""
    path = Path(checkpoint_dir) / META_FILE
    raw = _read_meta_bytes(path)
    return None if raw is None else _parse_meta(path, raw)


def _read_meta_bytes(path: Path) -> bytes | None:
    """The bytes of ``keyshot.json`` (None when there is none): its one opening per description."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _parse_meta(path: Path, raw: bytes) -> CheckpointMeta:
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: not UTF-8 text (byte {exc.start}); write it again as UTF-8") from None
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
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


# ---------------------------------------------------------------------------- the one reader
@dataclass(frozen=True)
class KnownCheckpoint:
    """A released scorer checkpoint without ``keyshot.json``: what keyshot knows of it."""

    prompt_variant: str
    base_model: str
    about: str


#: Released checkpoints trained on a prompt set keyshot ships, by hub id (compared case-insensitively).
KNOWN_CHECKPOINTS: dict[str, KnownCheckpoint] = {
    "osunlp/webjudge-7b": KnownCheckpoint(
        prompt_variant="online_mind2web",
        base_model="Qwen/Qwen2.5-VL-7B-Instruct",
        about="OSU's released WebJudge-7B (Apache-2.0, about 16.6 GB)",
    ),
}

#: The processor files that may hold a checkpoint's pixel bounds, in the order they are read.
PROCESSOR_FILES = ("processor_config.json", "preprocessor_config.json")


@dataclass(frozen=True)
class CheckpointDescription:
    """What a scorer checkpoint says about itself, read once by :func:`describe_checkpoint` and handed to
    ``keyshot serve``, ``keyshot judge``, the reward model and the in-process scorer.

    ``model``: the folder or hub id as given. ``meta``: its ``keyshot.json`` (None for a plain model folder
    or a hub id). ``prompt_variant``/``prompt_version``: the prompt set it was trained on (None: unknown,
    ``note`` says so). ``pixel_bounds``: its training pixel bounds (``keyshot.json``'s, else its processor
    config's; None: unknown). ``answer_tokens``: the longest answer it was trained on (None: unknown).
    ``hash``: a short hash of its identity (the run fingerprint records it). ``source``: where this was read.
    """

    model: str
    meta: CheckpointMeta | None
    prompt_variant: str | None
    prompt_version: str | None
    pixel_bounds: tuple[int, int] | None
    answer_tokens: int | None
    answer_tokens_p99: int | None
    hash: str | None
    base_model: str
    source: str
    note: str | None = None
    image_policy: ImagePolicy | None = None  # None: pixel bounds unknown

    @property
    def hub_id(self) -> bool:
        """Named by a Hugging Face hub id rather than a local folder."""
        return self.source.startswith("hub")

    def require_image_policy(self) -> ImagePolicy:
        """The image policy it was trained with, or CheckpointError saying why it is unknown."""
        if self.image_policy is None:
            raise CheckpointError(
                f"{self.model}: no keyshot.json and no processor pixel bounds; cannot tell which images it "
                "expects (set scorer.min_pixels and scorer.max_pixels, or give the folder its processor)"
            )
        return self.image_policy


def describe_checkpoint(model: str | os.PathLike) -> CheckpointDescription:
    """The one reader of a scorer checkpoint: a local folder (its ``keyshot.json``, else its processor
    config) or a Hugging Face hub id (its processor config from the local hub cache or the hub, its prompt
    set from :data:`KNOWN_CHECKPOINTS`). ``keyshot.json`` is opened once; a file that cannot be read or
    disagrees with itself raises CheckpointError naming it."""
    name = str(model)
    folder = Path(name).expanduser()
    if folder.is_dir():
        return _describe_folder(name, folder)
    if looks_like_local_path(name) or "/" not in name:
        raise CheckpointError(
            f"{name}: no such checkpoint folder; pass the folder a training run wrote (RUN/final) or a "
            "Hugging Face model id (org/name, e.g. osunlp/WebJudge-7B)"
        )
    return _describe_hub(name)


def _describe_folder(name: str, folder: Path) -> CheckpointDescription:
    meta_path = folder / META_FILE
    raw = _read_meta_bytes(meta_path)
    meta = None if raw is None else _parse_meta(meta_path, raw)
    digest = _folder_hash(folder, raw)
    if meta is not None:
        policy = _meta_policy(meta_path, meta)
        longest = meta.answer_tokens.get("max") if meta.answer_tokens else None
        p99 = meta.answer_tokens.get("p99") if meta.answer_tokens else None
        return CheckpointDescription(
            model=name,
            meta=meta,
            prompt_variant=meta.prompt_variant,
            prompt_version=meta.prompt_version,
            pixel_bounds=(meta.min_pixels, meta.max_pixels),
            answer_tokens=int(longest) if longest else None,
            answer_tokens_p99=int(p99) if p99 else None,
            hash=digest,
            base_model=meta.base_model,
            source=str(meta_path),
            image_policy=policy,
        )
    bounds = saved_pixel_bounds(folder)
    known = _known_snapshot(folder)
    return _plain(name, bounds, digest, known, source=f"{folder} (no {META_FILE})")


def _plain(
    name: str,
    bounds: tuple[int, int] | None,
    digest: str | None,
    known: tuple[str, KnownCheckpoint] | None,
    *,
    source: str,
) -> CheckpointDescription:
    """A checkpoint without ``keyshot.json``: pixel bounds from its processor, the prompt set from the
    table of released checkpoints when it is one of them."""
    variant = version = note = None
    base = ""
    if known is not None:
        from keyshot.infer.protocol.prompts import load_prompt_set

        hub_id, entry = known
        variant, version, base = (
            entry.prompt_variant,
            load_prompt_set(entry.prompt_variant).version,
            entry.base_model,
        )
        note = f"{hub_id} is {entry.about}, trained on keyshot's {variant!r} prompt set"
    else:
        note = f"{name} has no {META_FILE}: the prompt set it was trained on is unknown and not checked"
    return CheckpointDescription(
        model=name,
        meta=None,
        prompt_variant=variant,
        prompt_version=version,
        pixel_bounds=bounds,
        answer_tokens=None,
        answer_tokens_p99=None,
        hash=digest,
        base_model=base,
        source=source,
        note=note,
        image_policy=ImagePolicy(min_pixels=bounds[0], max_pixels=bounds[1]) if bounds else None,
    )


def _meta_policy(meta_path: Path, meta: CheckpointMeta) -> ImagePolicy:
    """``keyshot.json``'s image policy (its pixel bounds must equal the recorded ``min_pixels``/``max_pixels``),
    else keyshot's default policy with those bounds."""
    if not meta.image_policy:
        return ImagePolicy(
            min_pixels=meta.min_pixels,
            max_pixels=meta.max_pixels,
            max_aspect=DEFAULT_POLICY.max_aspect,
            jpeg_quality=DEFAULT_POLICY.jpeg_quality,
        )
    try:
        policy = ImagePolicy.from_dict(dict(meta.image_policy))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{meta_path}: bad image_policy ({exc})") from None
    if (policy.min_pixels, policy.max_pixels) != (meta.min_pixels, meta.max_pixels):
        raise CheckpointError(
            f"{meta_path}: image_policy pixel bounds ({policy.min_pixels}, {policy.max_pixels}) differ from "
            f"min_pixels/max_pixels ({meta.min_pixels}, {meta.max_pixels})"
        )
    return policy


def saved_pixel_bounds(folder: Path) -> tuple[int, int] | None:
    """(min_pixels, max_pixels) of the image processor saved in a model folder, if any."""
    for name in PROCESSOR_FILES:
        path = folder / name
        if path.is_file():
            bounds = _bounds_of(path)
            if bounds:
                return bounds
    return None


def _bounds_of(path: Path) -> tuple[int, int] | None:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the processor config ({exc.strerror or exc})") from None
    return _bounds_in(raw, str(path))


def _bounds_in(raw: bytes, where: str) -> tuple[int, int] | None:
    """The pixel bounds a processor config's bytes hold (None: none there)."""
    try:
        cfg = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{where}: cannot read the processor config ({exc})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{where}: expected a JSON object")
    settings = cfg.get("image_processor", cfg)
    return pixel_bounds(settings) if isinstance(settings, dict) else None


def _folder_hash(folder: Path, meta_raw: bytes | None) -> str:
    """A short hash of a checkpoint's identity: its config, keyshot metadata and weight files' sizes."""
    digest = hashlib.sha256()
    for name in ("config.json", META_FILE, "adapter_config.json"):
        if name == META_FILE:
            if meta_raw is not None:
                digest.update(name.encode() + meta_raw)
        elif (folder / name).is_file():
            digest.update(name.encode() + (folder / name).read_bytes())
    for weights in sorted(folder.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]


#: A snapshot folder of the Hugging Face hub cache: .../models--ORG--NAME/snapshots/COMMIT
_SNAPSHOT = re.compile(r"models--(?P<org>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{6,})/?$")


def _known_snapshot(folder: Path) -> tuple[str, KnownCheckpoint] | None:
    """A released checkpoint read from its hub-cache snapshot folder (the hub id is in the path)."""
    found = _SNAPSHOT.search(folder.resolve().as_posix())
    if not found:
        return None
    hub_id = f"{found['org']}/{found['name']}"
    entry = KNOWN_CHECKPOINTS.get(hub_id.lower())
    return (hub_id, entry) if entry else None


def _describe_hub(hub_id: str) -> CheckpointDescription:
    """A hub id: its processor config from the local hub cache, else from the hub (one small file, asked
    once; the weights are vLLM's to download)."""
    try:
        import huggingface_hub
    except ImportError:
        raise CheckpointError(
            f"{hub_id}: reading a Hugging Face model id needs huggingface_hub (pip install huggingface_hub, "
            "or pip install -e '.[train]'); or download the model and pass its folder"
        ) from None
    for name in PROCESSOR_FILES:
        try:
            cached = huggingface_hub.try_to_load_from_cache(hub_id, name)
        except ValueError as exc:  # the hub client's HFValidationError: not an org/name id
            raise CheckpointError(
                f"{hub_id}: neither a checkpoint folder nor a Hugging Face model id ({_first_line(exc)})"
            ) from None
        if isinstance(cached, str):
            path = Path(cached)
            found = _SNAPSHOT.search(path.parent.as_posix())
            return _hub_description(hub_id, path.read_bytes(), found["commit"] if found else None, str(path))
    raw, commit = _fetch_processor_config(huggingface_hub, hub_id)
    return _hub_description(hub_id, raw, commit, f"{hub_id}/{PROCESSOR_FILES[1]}")


def _fetch_processor_config(huggingface_hub: Any, hub_id: str) -> tuple[bytes, str | None]:
    """The hub's ``preprocessor_config.json`` of ``hub_id`` and the commit it was read at; one request,
    a CheckpointError in one line when it fails."""
    fix = (
        f"check the id, the network and HF_TOKEN, or download it first (hf download {hub_id} "
        "--local-dir DIR) and pass model=DIR"
    )
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        raise CheckpointError(
            f"{hub_id}: not in the Hugging Face hub cache and HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) is set; {fix}"
        )
    url = huggingface_hub.hf_hub_url(hub_id, PROCESSOR_FILES[1])
    try:
        reply = huggingface_hub.get_session().get(
            url, headers=huggingface_hub.utils.build_hf_headers(), timeout=15, follow_redirects=True
        )
    except Exception as exc:  # noqa: BLE001 (any transport error becomes the one line)
        raise CheckpointError(
            f"{hub_id}: cannot reach the Hugging Face hub for its {PROCESSOR_FILES[1]} "
            f"({_first_line(exc)}); {fix}"
        ) from None
    if reply.status_code != 200:
        raise CheckpointError(
            f"{hub_id}: the Hugging Face hub answered HTTP {reply.status_code} for its {PROCESSOR_FILES[1]} "
            f"({url}); {fix}"
        )
    return reply.content, reply.headers.get("x-repo-commit")


def _hub_description(hub_id: str, raw: bytes, commit: str | None, where: str) -> CheckpointDescription:
    bounds = _bounds_in(raw, where)
    digest = hashlib.sha256(f"{hub_id}@{commit}".encode() + raw).hexdigest()[:16]
    entry = KNOWN_CHECKPOINTS.get(hub_id.lower())
    return _plain(
        hub_id,
        bounds,
        digest,
        (hub_id, entry) if entry else None,
        source=f"hub {hub_id}" + (f"@{commit[:12]}" if commit else ""),
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
