"""What ``keyshot metrics`` adds about the judge's operating point: p_success's calibration against the
truth for any run whose verdicts carry it, and for a threshold sweep (``keyshot sweep``'s folder) the δ's
side by side. The pieces are :mod:`~keyshot.infer.metrics.calibration`,
:mod:`~keyshot.infer.metrics.sweep_compare` and their files (:mod:`~keyshot.infer.metrics.operating_files`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from keyshot.infer.loaders.judge_records import ArbIndexRow
from keyshot.infer.metrics.calibration import LABEL_NOT_JUDGED, Calibration, compute_calibration
from keyshot.infer.metrics.compute import JudgedRecord, labels_not_judged, records_from_verdicts
from keyshot.infer.metrics.config import DEFAULTS
from keyshot.infer.metrics.operating_files import (
    calibration_markdown,
    sweep_markdown,
    write_calibration,
    write_sweep,
)
from keyshot.infer.metrics.sweep_compare import compare_sweep
from keyshot.infer.protocol.verdicts import Verdict
from keyshot.infer.runs.run_record import stand_in_of

NO_P_SUCCESS_NOTE = (
    "no verdict carries p_success: judge with pipeline.outcome_logprobs=5 (the endpoint must return "
    "log-probabilities) to read the judge's confidence"
)


def calibration_of(
    records: Sequence[JudgedRecord],
    human_labels: Mapping[tuple[str, str], str] | None,
    arb_index: Sequence[ArbIndexRow] | None,
    *,
    label_2: str = DEFAULTS.label_2,
    objective: str = DEFAULTS.objective,
    seed: str = DEFAULTS.split_seed,
    n_bins: int = DEFAULTS.n_bins,
) -> Calibration:
    """The calibration of ``records``, with the labels no verdict met counted (those of agents the run
    did not judge named in a note, not counted as missing)."""
    mine, other = labels_not_judged(records, human_labels, arb_index)
    cal = compute_calibration(
        records, label_2=label_2, n_bins=n_bins, objective=objective, seed=seed, labels_not_judged=mine
    )
    if other:
        cal.notes.append(f"{other} labels are of agents this run did not judge (not counted)")
    if not any(r.p_success is not None for r in records):
        cal.notes.append(NO_P_SUCCESS_NOTE)
    return cal


def write_operating_point(
    records: Sequence[JudgedRecord],
    out: Path,
    human_labels: Mapping[tuple[str, str], str] | None,
    arb_index: Sequence[ArbIndexRow] | None,
    *,
    stand_in: str | None = None,
    **options,
) -> tuple[str, dict[str, Path]]:
    """Calibration files of one run into ``out``; the Markdown and the paths. A run whose verdicts carry no
    p_success gets one line saying how to have it, and no files."""
    if not any(r.p_success is not None for r in records):
        mine, other = labels_not_judged(records, human_labels, arb_index)
        unmet = f"{LABEL_NOT_JUDGED}: {mine}" + (f" (and {other} of agents not judged)" if other else "")
        return (
            f"p_success: {NO_P_SUCCESS_NOTE}.\n{unmet}.\n"
            if mine or other
            else f"p_success: {NO_P_SUCCESS_NOTE}.\n",
            {},
        )
    cal = calibration_of(records, human_labels, arb_index, **options)
    if stand_in:
        cal.notes.insert(0, stand_in)
    return calibration_markdown(cal), write_calibration(cal, out, stand_in)


def write_sweep_metrics(
    path: Path,
    out: Path,
    human_labels: Mapping[tuple[str, str], str] | None,
    arb_index: Sequence[ArbIndexRow] | None,
    *,
    agent: str | None = None,
    benchmark: str | None = None,
    label_2: str = DEFAULTS.label_2,
    objective: str = DEFAULTS.objective,
    seed: str = DEFAULTS.split_seed,
    n_bins: int = DEFAULTS.n_bins,
) -> tuple[str, dict[str, Path]]:
    """The δ's of the sweep in ``path`` side by side (and each δ's calibration) into ``out``."""
    calibrations: dict[float, Calibration] = {}
    stand_in = None

    def records_of(verdicts: list[Verdict]) -> list[JudgedRecord]:
        return records_from_verdicts(
            verdicts, human_labels=human_labels, arb_index=arb_index, agent=agent, benchmark=benchmark
        )

    cmp = compare_sweep(path, records_of, label_2=label_2)
    for d in cmp.per_delta:
        stand_in = stand_in or stand_in_of(path / d.folder)
        calibrations[d.delta] = calibration_of(
            d.records, human_labels, arb_index, label_2=label_2, objective=objective, seed=seed, n_bins=n_bins
        )
    if stand_in:
        cmp.notes.insert(0, stand_in)
    with_p = {d: c for d, c in calibrations.items() if c.n_used}
    return sweep_markdown(cmp, with_p), write_sweep(cmp, out, with_p, stand_in)
