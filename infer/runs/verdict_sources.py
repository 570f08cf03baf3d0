"""Verdicts from released judge records, and the one reader of verdicts of any source.

Released judge records (:func:`read_reference_records`) are the files the reference implementation
writes, converted to verdicts so that a run can resume from them and metrics can read them:

* Online-Mind2Web ``src/run.py`` output (``<mode>_<model>_score_threshold_<δ>_auto_eval_results.json``,
  one JSON object per line): the trajectory's ``result.json`` fields (``task``, ``action_history``,
  ...) plus ``task_id``, ``key_points``, ``image_judge_record`` (``[{"Response", "Score"}]``, one per
  screenshot in order), ``input_text`` / ``system_msg`` (the outcome prompt), ``evaluation_details``
  (``{"response": <outcome text>, "predicted_label": 0|1}``) and ``predicted_label``.
* AgentRewardBench WebJudge records (one JSON object per file, ``<benchmark>/<agent>/<task_id>.json``):
  ``goal``, ``benchmark``, ``agent``, ``judge_model_name``, ``key_points``, ``image_judge_record``,
  ``response`` (the outcome call's full chat-completion object, ``usage`` included) and
  ``trajectory_info.summary_info.cum_reward``. The task id is the file name.

Read from both: task id, task, agent, benchmark, key points, every screenshot's raw answer and score
(``thought`` re-derived with the reference parser), the kept screenshots (score ≥ δ, first 50, as the
reference keeps them), the outcome text and its verdict (``predicted_label`` when present, else the
reference status parser on the outcome text), the outcome call's token usage (ARB only) and the
rule-based reward (ARB only). Screenshot paths and judge-call counts are not in these files.

:func:`load_verdicts` reads a keyshot run folder or ``verdicts.jsonl`` and falls back to these records: the
reader of metrics and the report.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.judge_records import (
    outcome_text,
    outcome_variant,
    record_task,
    recorded_answers,
)
from keyshot.infer.protocol.messages import MAX_KEPT_IMAGES
from keyshot.infer.protocol.parsing import parse_status
from keyshot.infer.runs.run_record import read_inputs
from keyshot.infer.protocol.verdicts import (
    VERDICTS_FILE,
    OutcomeCall,
    ScreenshotRecord,
    Verdict,
    VerdictFileError,
    empty_usage,
    iter_json_lines,
    latest_verdicts,
    read_verdicts,
    select_kept,
)

FORMAT_REFERENCE = "online_mind2web_run"
FORMAT_ARB = "agentrewardbench_webjudge"


def load_verdicts(path: str | os.PathLike) -> tuple[list[Verdict], str]:
    """The latest verdict of each trajectory in a run folder, a ``verdicts.jsonl`` or released judge
    records (the reference implementation's outputs), and which kind it was (``keyshot`` or
    ``released records``). The one reader of verdicts for metrics and reports."""
    p = Path(path)
    if p.is_dir() and (p / VERDICTS_FILE).is_file():
        p = p / VERDICTS_FILE
    not_keyshot = None
    if p.is_file() and p.suffix == ".jsonl":
        try:
            verdicts = latest_verdicts(read_verdicts(p))
        except VerdictFileError as exc:
            not_keyshot = exc  # perhaps the reference implementation's output: read below
        else:
            if not verdicts:
                raise VerdictFileError(f"{p}: no verdicts in this file")
            return anchored(verdicts, p.parent), "keyshot"
    try:
        verdicts = latest_verdicts(read_reference_records(p))
    except VerdictFileError:
        if trajectories := trajectories_message(p):
            raise VerdictFileError(trajectories) from None
        if not_keyshot is not None:  # neither: say what is wrong with it as keyshot's own file
            raise not_keyshot from None
        raise
    if not verdicts:
        raise VerdictFileError(
            f"{p}: no verdicts (expected a keyshot run folder, a verdicts.jsonl or judge records)"
        )
    return verdicts, "released records"


def anchored(verdicts: list[Verdict], folder: Path) -> list[Verdict]:
    """``verdicts`` with their trajectory and screenshot paths found from any working folder. Verdicts
    record absolute paths; older run folders recorded them as given on the command line, relative to the
    folder ``keyshot judge`` ran in: that folder is found again from the inputs ``run.json`` records
    (absolute), the first of each input's folders from which the verdict's source exists."""
    inputs = [Path(p) for p in (read_inputs(folder) or {}).get("paths") or []]
    bases = [base for p in inputs for base in (p, *p.parents)]
    for v in verdicts:
        if not v.source or Path(v.source).is_absolute():
            continue
        base = next((b for b in bases if (b / v.source).exists()), None)
        if base is None:
            continue
        v.source = str(base / v.source)
        for shot in v.screenshots:
            if shot.path and not Path(shot.path).is_absolute():
                shot.path = str(base / shot.path)
    return verdicts


def trajectories_message(path: Path) -> str | None:
    """What to do when ``path`` holds agent trajectories (runs to judge) rather than verdicts; None when
    it holds none."""
    quiet = logging.getLogger("keyshot.infer.loaders")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # the loaders' warnings about other entries are not the point here
    try:
        first = next(iter(load_trajectories(path, on_error="skip", errors=[])), None)
    except (KeyshotError, ValueError, OSError):
        first = None
    finally:
        quiet.setLevel(level)
    if first is None:
        return None
    return (
        f"{path} is a trajectory folder (agent runs in the {first.format} format, such as "
        f"{first.source or first.task_id}), not judged verdicts: run keyshot judge {path} --config CONFIG "
        "first, then give its output folder (OUT, or OUT/verdicts.jsonl)"
    )


def read_reference_records(
    path: str | os.PathLike, *, threshold: int = 3, max_kept: int = MAX_KEPT_IMAGES
) -> list[Verdict]:
    """Convert the reference implementation's outputs (see the module docstring) to verdicts.

    ``path`` is an Online-Mind2Web ``run.py`` output (JSON lines), one AgentRewardBench record
    (a JSON object) or a folder searched recursively for ``*.json`` / ``*.jsonl`` files of either kind.
    ``threshold`` is the δ the run used (the kept set is recomputed from the recorded scores).
    """
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in (".json", ".jsonl"))
        if not files:
            raise VerdictFileError(f"{p}: no .json/.jsonl files in this folder")
    elif p.is_file():
        files = [p]
    else:
        raise VerdictFileError(f"{p}: no such file or folder")
    out: list[Verdict] = []
    for f in files:
        out.extend(_reference_file(f, threshold, max_kept))
    return out


def _reference_file(path: Path, threshold: int, max_kept: int) -> Iterator[Verdict]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise VerdictFileError(f"{path}: cannot read ({exc})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        records: Iterable[tuple[int | None, dict]] = [(None, whole)]
    else:
        records = iter_json_lines(path)
    for number, record in records:
        where = f"{path}:{number}" if number is not None else str(path)
        try:
            yield _convert_reference(record, path, threshold, max_kept)
        except (KeyError, TypeError, ValueError) as exc:
            raise VerdictFileError(f"{where}: not a WebJudge reference record ({exc})") from None


def _convert_reference(record: dict, path: Path, threshold: int, max_kept: int) -> Verdict:
    if "image_judge_record" not in record or "key_points" not in record:
        raise KeyError("needs 'image_judge_record' and 'key_points'")
    is_arb = "goal" in record and "task_id" not in record
    task_id = str(record["task_id"]) if "task_id" in record else path.stem
    task = record_task(record)
    if task is None:
        raise KeyError("no task text ('task', 'confirmed_task' or 'goal')")

    shots = [  # as the reference read them for the record's own outcome prompt: its prompt set's rule
        ScreenshotRecord(
            index=i, score=a.score, thought=a.thought, valid=a.score is not None, error=a.error, raw=a.text
        )
        for i, a in enumerate(recorded_answers(record["image_judge_record"]))
    ]
    kept = select_kept(shots, threshold, max_kept, mode="reference")

    outcome = outcome_text(record)
    label = record.get("predicted_label")
    if label is None and isinstance(record.get("evaluation_details"), dict):
        label = record["evaluation_details"].get("predicted_label")
    if label is not None:
        success: bool | None = bool(int(label))
        status_valid = True
    elif outcome is not None:
        status = parse_status(outcome, mode="reference")
        success, status_valid = status.success, status.valid
    else:
        success, status_valid = None, False

    usage = empty_usage()
    response = record.get("response")
    if isinstance(response, dict) and isinstance(response.get("usage"), dict):
        u = response["usage"]
        usage["judge"].add_call(
            int(u.get("prompt_tokens") or 0), int(u.get("completion_tokens") or 0), 0.0, False
        )

    info = record.get("trajectory_info") or {}
    reward = (info.get("summary_info") or {}).get("cum_reward") if isinstance(info, dict) else None
    return Verdict(
        task_id=task_id,
        task=task,
        agent=record.get("agent"),
        benchmark=record.get("benchmark") or (None if is_arb else "online_mind2web"),
        source=str(path),
        success=success,
        status_valid=status_valid,
        key_points=record["key_points"],
        outcome_text=outcome,
        outcome_calls=[OutcomeCall(text=outcome, success=success, valid=status_valid)] if outcome else [],
        screenshots=shots,
        kept=kept,
        usage=usage,
        config={
            "source_format": FORMAT_ARB if is_arb else FORMAT_REFERENCE,
            "judge_model": record.get("judge_model_name")
            or (response.get("model") if isinstance(response, dict) else None),
            "threshold": threshold,
            "parse_mode": "reference",
            # the prompt set of its outcome call, where its system prompt says it: what a sweep asks with
            **({"prompt_variant": asked} if (asked := outcome_variant(record)) else {}),
        },
        reward=float(reward) if isinstance(reward, int | float) else None,
        record_format=FORMAT_ARB if is_arb else FORMAT_REFERENCE,
    )
