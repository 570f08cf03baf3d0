"""A synthesis run folder: its manifest (the payload of ``run.json``), its lock, and where things live in it.

::

    RUN/
      run.json        the manifest: prompt set and image policy the labels were made with (keyshot.infer.runs.run_record)
      labels.jsonl    the label store (keyshot.data_synth.labels)
      calls.sqlite    the client's call cache: no call is ever paid twice
      usage/          per-endpoint calls, tokens and dollars, one file per run session
      images/         screenshots recovered from imported logs
      dataset/        the built DatasetDict (keyshot synth build)

Labels made by API teachers saw the screenshot under the run's image policy; the dataset must hold
exactly those pixels, so a build refuses another policy or prompt set for such a run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyshot.data_synth.errors import SynthError
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.fileio import write_bytes_atomic
from keyshot.infer.protocol.images import sniff_image_type
from keyshot.infer.runs.run_record import MANIFEST, RUN_FILE, read_payload, write_payload

logger = logging.getLogger(__name__)

CACHE_FILE = "calls.sqlite"
USAGE_DIR = "usage"
IMAGES_DIR = "images"


def store_image(run_dir: Path, uid: str, step: int, data: bytes) -> str:
    """Keep the encoded screenshot ``step`` of trajectory ``uid`` in ``RUN/images`` (written once,
    atomically) and return its path: embedded screenshots and imported records' pixels alike."""
    folder = run_dir / IMAGES_DIR / hashlib.sha256(uid.encode()).hexdigest()[:16]
    path = folder / f"{step}{sniff_image_type(data)[1]}"
    if not path.exists():
        write_bytes_atomic(path, data)
    return str(path)


DATASET_DIR = "dataset"


@dataclass
class RunManifest:
    """``image_policy`` is None while only imported labels exist (their teachers saw the original
    screenshots); the first ``keyshot synth run`` fixes it."""

    prompt_variant: str
    prompt_version: str
    image_policy: dict | None = None
    parse_mode: str = "strict"
    sessions: list[dict] = field(default_factory=list)  # {"kind", "started", "source"}


def write_json_atomic(path: Path, data: object) -> None:
    write_bytes_atomic(path, (json.dumps(data, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))


def read_manifest(run_dir: Path) -> RunManifest | None:
    """The run's manifest, None before its first session (folders of any keyshot version)."""
    data = read_payload(run_dir, MANIFEST)
    if data is None:
        return None
    try:
        return RunManifest(**data)
    except TypeError as exc:
        raise SynthError(f"{run_dir / RUN_FILE}: not a keyshot run manifest ({exc})") from None


def write_manifest(run_dir: Path, manifest: RunManifest) -> None:
    write_payload(run_dir, MANIFEST, asdict(manifest))


def manifest_conflict(
    manifest: RunManifest, prompt_version: str, image_policy: dict | None, parse_mode: str
) -> str | None:
    """Why labels made under these settings cannot join a run with ``manifest``, or None."""
    if manifest.prompt_version != prompt_version:
        return (
            f"the run's labels use prompt version {manifest.prompt_version!r}, these use {prompt_version!r}"
        )
    if image_policy is not None and manifest.image_policy not in (None, image_policy):
        return (
            f"the run's teachers saw images under policy {manifest.image_policy}, these under {image_policy}"
        )
    if manifest.parse_mode != parse_mode:
        return f"the run parses scores in {manifest.parse_mode!r} mode, these in {parse_mode!r}"
    return None


def open_manifest(
    run_dir: Path,
    *,
    prompt_variant: str,
    prompt_version: str,
    image_policy: dict | None,
    parse_mode: str,
    kind: str,
    source: str,
) -> RunManifest:
    """Create the manifest, or check that a new session fits the existing one, and log the session."""
    manifest = read_manifest(run_dir)
    if manifest is None:
        manifest = RunManifest(prompt_variant, prompt_version, image_policy, parse_mode)
    else:
        conflict = manifest_conflict(manifest, prompt_version, image_policy, parse_mode)
        if conflict:
            raise SynthError(f"{run_dir / RUN_FILE}: {conflict}; use another run folder")
        if image_policy is not None and manifest.image_policy is None:
            manifest.image_policy = image_policy
    manifest.sessions.append(
        {"kind": kind, "source": source, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    )
    write_manifest(run_dir, manifest)
    return manifest


class UsageRecorder:
    """Keeps ``RUN/usage/<session>.json`` (per-endpoint calls, tokens, dollars of one session)
    up to date: rewritten atomically at most every ``interval_s`` and at the end, so a killed
    session loses a few seconds of accounting at most."""

    def __init__(self, run_dir: Path, kind: str, ledger: UsageLedger, interval_s: float = 2.0):
        stamp = time.strftime("%Y%m%dT%H%M%S")
        # unique per session even for two sessions of one process within a second (each its own file)
        self.path = run_dir / USAGE_DIR / f"{stamp}-{os.getpid()}-{uuid.uuid4().hex[:8]}-{kind}.json"
        self.kind = kind
        self.ledger = ledger
        self.interval_s = interval_s
        self._last = 0.0

    def maybe_write(self) -> None:
        if time.monotonic() - self._last >= self.interval_s:
            self.write()

    def write(self) -> None:
        self._last = time.monotonic()
        data = {
            "kind": self.kind,
            "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "endpoints": self.ledger.as_dict(),
        }
        write_json_atomic(self.path, data)


def read_usage(run_dir: Path) -> dict[str, dict[str, float]]:
    """Per-endpoint totals over all sessions of a run."""
    totals: dict[str, dict[str, float]] = {}
    folder = run_dir / USAGE_DIR
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            logger.warning("%s: skipping an unreadable usage file", path)
            continue
        for name, counters in (entry.get("endpoints") or {}).items():
            total = totals.setdefault(name, {})
            for key, value in counters.items():
                if isinstance(value, int | float):
                    total[key] = total.get(key, 0) + value
    return totals
