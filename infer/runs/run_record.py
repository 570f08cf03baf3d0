"""A run folder's record, ``RUN/run.json``: what made its results, read, compared and written here only.

One file format for every kind of run: ``{"<payload>": {...}}``. A judge run records its ``protocol``
(what decides its verdicts: :mod:`keyshot.infer.judge.fingerprint`), checked on resume, and its ``inputs``
(how its trajectories were read, so that ``keyshot sweep`` reads them again the same way); a synthesis run
its ``manifest`` (prompt set, image policy, parse mode, sessions: :mod:`keyshot.data_synth.run_folder`).
What goes into a payload is its kind's business. Folders written by older versions are read as they
are (:func:`_current`): a synthesis run.json that was the manifest itself, a protocol that says
``variant``.
"""

from __future__ import annotations

import json
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic

RUN_FILE = "run.json"
#: A judge run's payload: the protocol fingerprint.
PROTOCOL = "protocol"
#: Where a run's work ran, beside its protocol (``--engine ray``: Ray's version, the cluster, the actors):
#: it decides no result, so it is not part of the protocol (docs/scaling.md: one pipeline, any engine).
ENGINE = "engine"
#: A synthesis run's payload: its manifest.
MANIFEST = "manifest"
#: A judge run's payload beside its protocol: how its trajectories were read (:func:`record_inputs`).
INPUTS = "inputs"
#: What a run of stand-in models (the demo's untrained model) records: the sentence every artefact shows.
STAND_IN = "stand_in"
#: The protocol's key for the roles (``judge``, ``scorer``) whose answers were held to the answer format
#: (``constrained: true``); absent when none were, so folders judged before the option keep their protocol.
CONSTRAINED = "constrained_answers"


class RunFolderError(KeyshotError):
    """A run folder that cannot be used: its run file is not one, or it was made with another protocol."""


def read_payload(folder: Path, payload: str) -> dict | None:
    """The ``payload`` recorded in ``folder/run.json``; None when the folder has no run file yet. A file
    that is not a run file raises RunFolderError naming it (each command adds what its user can do)."""
    record = _read_record(folder)
    if record is None or set(record) <= {STAND_IN, INPUTS, ENGINE}:  # no run file, or no payload recorded yet
        return None
    found = record.get(payload, {})
    if not isinstance(found, dict):
        raise RunFolderError(f"{folder / RUN_FILE}: not a keyshot run file ({payload} is not an object)")
    return found


def _read_record(folder: Path) -> dict | None:
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(record, dict):
            raise TypeError(f"a JSON {type(record).__name__}, not an object")
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, TypeError) as exc:
        raise RunFolderError(f"{path}: not a keyshot run file ({exc})") from None
    return _current(record)


def write_payload(folder: Path, payload: str, data: object) -> None:
    """Record ``data`` as the run's ``payload`` in ``folder/run.json`` (atomically), beside what the file
    records already (the stand-in mark, the inputs)."""
    try:
        record = _read_record(folder) or {}
    except RunFolderError:  # not a run file: replaced (the callers read it first and refuse what they must)
        record = {}
    record[payload] = data
    write_text_atomic(folder / RUN_FILE, json.dumps(record, indent=2, ensure_ascii=False) + "\n")


def record_inputs(folder: Path, inputs: dict) -> None:
    """Record how a judge run read its trajectories (its input paths, format, agent, benchmark and the
    folders its screenshots may point into), so that what re-reads them reads the same trajectories."""
    folder.mkdir(parents=True, exist_ok=True)
    write_payload(folder, INPUTS, inputs)


def record_engine(folder: Path, engine: dict) -> None:
    """Record where a run's latest work ran (:data:`ENGINE`), beside its protocol."""
    folder.mkdir(parents=True, exist_ok=True)
    write_payload(folder, ENGINE, engine)


def read_engine(folder: Path) -> dict | None:
    """What :func:`record_engine` recorded in ``folder``; None for a run of one process."""
    found = _beside(folder, ENGINE)
    return found if isinstance(found, dict) else None


def read_inputs(folder: Path) -> dict | None:
    """What :func:`record_inputs` recorded in ``folder`` (a judge run's, or its merged shards'); None for a
    folder that records none (older runs, released records)."""
    found = _beside(folder, INPUTS)
    return found if isinstance(found, dict) else None


def _beside(folder: Path, key: str) -> object:
    """What ``folder/run.json`` records under ``key`` beside its payload (the inputs, the stand-in mark);
    None without a readable run file."""
    try:
        return (_read_record(folder) or {}).get(key)
    except RunFolderError:
        return None


def mark_stand_in(folder: Path, sentence: str) -> None:
    """Record that ``folder``'s verdicts come from stand-in models: ``sentence`` says so in its summary,
    report and metrics."""
    folder.mkdir(parents=True, exist_ok=True)
    write_payload(folder, STAND_IN, sentence)


def stand_in_of(folder: Path) -> str | None:
    """The stand-in sentence of the run in ``folder`` (a run folder, or the folder of a verdict file), or
    None: a run of real models, or a folder without a readable run file."""
    mark = _beside(folder, STAND_IN)
    return mark if isinstance(mark, str) else None


def _current(record: dict) -> dict:
    """A run file of an older version in today's format."""
    if PROTOCOL not in record and MANIFEST not in record and "prompt_version" in record:
        return {MANIFEST: record}  # synthesis folders written before one format: the manifest itself
    protocol = record.get(PROTOCOL)
    if isinstance(protocol, dict) and "variant" in protocol and "prompt_variant" not in protocol:
        protocol["prompt_variant"] = protocol.pop("variant")  # judge folders written before the rename
    return record


def with_constrained(protocol: dict, roles: list[str]) -> dict:
    """``protocol`` with the roles whose answers were constrained recorded (unchanged when none were)."""
    return {**protocol, CONSTRAINED: sorted(roles)} if roles else protocol


def constrained_text(protocol: dict) -> str | None:
    """What a summary or report says of a protocol's constrained answers, or None when none were."""
    roles = protocol.get(CONSTRAINED) or []
    if not roles:
        return None
    return (
        f"the {' and '.join(roles)}'s answers were constrained to the prompt set's answer format "
        "(vLLM structured outputs): every answer parses, and a model could say nothing else"
    )


def read_protocol(folder: Path) -> dict | None:
    """The judge protocol recorded in ``folder/run.json`` (see :func:`read_payload`)."""
    return read_payload(folder, PROTOCOL)


def protocol_differences(a: dict, b: dict, names: tuple[str, str] = ("in the folder", "now")) -> str:
    """What differs between two protocols, ``key: <a's> in the folder, <b's> now; …`` ("" if nothing)."""
    differ = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    return "; ".join(f"{k}: {a.get(k)!r} {names[0]}, {b.get(k)!r} {names[1]}" for k in differ)


def check_fingerprint(out: Path, fingerprint: dict, *, record: bool = True) -> None:
    """Refuse a run folder made with another protocol; record the protocol in ``OUT/run.json``
    (unless ``record`` is False: a dry run writes nothing)."""
    try:
        recorded = read_protocol(out)
    except RunFolderError as exc:
        raise RunFolderError(f"{exc}; move it away or use another --out") from None
    if recorded is not None:
        shown = protocol_differences(recorded, fingerprint)
        if shown:
            raise RunFolderError(
                f"{out} holds verdicts of another protocol ({shown}); its verdicts cannot be reused: "
                "use a new --out (or the settings the folder was made with)"
            )
        return
    if record:
        write_payload(out, PROTOCOL, fingerprint)
