"""A run folder's protocol: what decides its verdicts, recorded in ``OUT/run.json`` and checked on resume."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from infer.fileio import write_text_atomic
from infer.images import DEFAULT_POLICY, REFERENCE_POLICY
from infer.judge_config import JudgeRunConfig, JudgeRunError, scorer_policy
from infer.prompts import load_prompt_set

RUN_FILE = "run.json"


def protocol_fingerprint(cfg: JudgeRunConfig) -> dict:
    """What decides a run's verdicts: a run folder keeps its verdicts only for this protocol."""
    sc, pipe = cfg.scorer, cfg.pipeline
    if sc.backend == "none":
        policy, scorer_model = REFERENCE_POLICY, None
    else:
        policy = scorer_policy(sc) or DEFAULT_POLICY
        served = sc.endpoint or (sc.endpoints[0] if sc.endpoints else None)
        scorer_model = sc.checkpoint or (served.model if served else None)
    return {
        "prompt_version": load_prompt_set(pipe.prompt_variant).version,
        "prompt_variant": pipe.prompt_variant,
        "outcome_mode": pipe.outcome_mode,
        "parse_mode": pipe.parse_mode,
        "threshold": pipe.threshold,
        "threshold_on": pipe.threshold_on,
        "max_kept": pipe.max_kept,
        "outcome_images": pipe.outcome_images,
        "allow_partial": pipe.allow_partial,
        "judge_model": cfg.judge.model,
        "judge_max_tokens": cfg.judge.max_tokens,
        "judge_temperature": cfg.judge.temperature,
        "judge_seed": cfg.judge.seed,
        "scorer_backend": sc.backend,
        "scorer_model": scorer_model,
        "scorer_checkpoint_hash": checkpoint_hash(sc.checkpoint) if sc.checkpoint else None,
        "image_policy": policy.to_dict(),
    }


def checkpoint_hash(folder: str) -> str | None:
    """A short hash of a checkpoint's identity: its config, keyshot metadata and weight files' sizes."""
    root = Path(folder)
    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for name in ("config.json", "keyshot.json", "adapter_config.json"):
        if (root / name).is_file():
            digest.update(name.encode() + (root / name).read_bytes())
    for weights in sorted(root.glob("*.safetensors")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]


def read_protocol(folder: Path) -> dict | None:
    """The protocol recorded in ``folder/run.json``, or None when the folder has none yet; a file that is
    not a run file raises JudgeRunError naming it (each command adds what its user can do)."""
    path = folder / RUN_FILE
    if not path.exists():
        return None
    try:
        protocol = json.loads(path.read_text(encoding="utf-8")).get("protocol", {})
    except (OSError, json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise JudgeRunError(f"{path}: not a keyshot run file ({exc})") from None
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
    except JudgeRunError as exc:
        raise JudgeRunError(f"{exc}; move it away or use another --out") from None
    if recorded is not None:
        shown = protocol_differences(recorded, fingerprint)
        if shown:
            raise JudgeRunError(
                f"{out} holds verdicts of another protocol ({shown}); its verdicts cannot be reused: "
                "use a new --out (or the settings the folder was made with)"
            )
        return
    if record:
        write_text_atomic(out / RUN_FILE, json.dumps({"protocol": fingerprint}, indent=2) + "\n")
