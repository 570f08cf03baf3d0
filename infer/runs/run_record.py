"""A run folder's protocol: what decides its verdicts, recorded in ``OUT/run.json`` and checked on resume.

What goes into the record is the judge's business (:mod:`keyshot.infer.judge.fingerprint`); this
module reads, compares and writes it."""

from __future__ import annotations

import json
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic

RUN_FILE = "run.json"


class RunFolderError(KeyshotError):
    """A run folder that cannot be used: its run file is not one, or it was made with another protocol."""



def read_protocol(folder: Path) -> dict | None:
    """The protocol recorded in ``folder/run.json``, or None when the folder has none yet; a file that is
    not a run file raises RunFolderError naming it (each command adds what its user can do)."""
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        protocol = json.loads(path.read_text(encoding="utf-8")).get("protocol", {})
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise RunFolderError(f"{path}: not a keyshot run file ({exc})") from None
    if "variant" in protocol and "prompt_variant" not in protocol:  # folders written before the rename
        protocol["prompt_variant"] = protocol.pop("variant")
    return protocol


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
        write_text_atomic(out / RUN_FILE, json.dumps({"protocol": fingerprint}, indent=2) + "\n")
