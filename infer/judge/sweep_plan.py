"""What a sweep of a judged folder keeps and asks, read from its verdicts alone: ``keyshot sweep --plan``
(no judge, no call), and the forecast a sweep says before it sends anything (how many outcome calls it
will pay, and why).

An outcome request is the same request, and the call cache answers it, when a trajectory keeps the same
screenshots at another δ and the judge and its settings are the same: one request per distinct kept set,
in ``cot`` mode one call per trajectory, in ``key_point`` mode one per key point. The judged run's own
requests (its δ's kept screenshots) are in its cache only for the judge settings it was sent with: the
cache key holds the model, the prompt, ``temperature``, ``max_tokens`` and the log-probabilities asked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from keyshot.infer.common.text import count_of
from keyshot.infer.judge.pipeline import PipelineConfig, outcome_calls
from keyshot.infer.judge.sweep_source import (
    JudgedFolder,
    none_readable,
    read_judged,
    source_missing,
    sweep_pipeline,
    unsweepable,
)
from keyshot.infer.protocol.verdicts import Verdict, select_kept

#: The recorded judge settings an answer in the judged run's cache was sent with (its cache key holds them).
JUDGE_SETTINGS = ("judge_model", "judge_max_tokens", "judge_temperature", "judge_seed")


@dataclass
class DeltaForecast:
    """One δ: the verdicts to ask, the outcome calls they need, and of those the ones the cache answers
    (``repeated``: an earlier δ of this sweep asks the same request) or may answer (``judged_own``: the
    judged run sent the same request)."""

    delta: float
    trajectories: int = 0  # to ask (not finished in the δ folder by an earlier sweep)
    already: int = 0  # finished by an earlier sweep: not asked
    kept: int = 0  # screenshots the asked trajectories keep
    calls: int = 0
    repeated: int = 0
    judged_own: int = 0

    @property
    def at_most(self) -> int:
        """Outcome calls paid at most: every request this sweep has not asked before."""
        return self.calls - self.repeated


def forecast(
    verdicts: list[Verdict],
    deltas: list[float],
    pipeline: PipelineConfig,
    *,
    finished: Callable[[float, Verdict], bool] = lambda delta, v: False,
    judged_keeps: bool = False,
) -> list[DeltaForecast]:
    """What a sweep of ``verdicts`` asks at each δ (``finished(δ, v)``: v is done there already);
    ``judged_keeps``: each verdict's ``kept`` is what the judged run's own request showed."""
    seen: dict[tuple, set[tuple[int, ...]]] = {v.key: set() for v in verdicts}
    rows = []
    for delta in deltas:
        row = DeltaForecast(delta)
        for v in verdicts:
            kept = tuple(
                select_kept(
                    v.screenshots,
                    delta,
                    pipeline.max_kept,
                    mode=pipeline.parse_mode,
                    threshold_on=pipeline.threshold_on,
                )
            )
            if finished(delta, v):
                row.already += 1
            else:
                calls = outcome_calls(v.key_points or "", pipeline)
                row.trajectories += 1
                row.kept += len(kept)
                row.calls += calls
                if kept in seen[v.key]:
                    row.repeated += calls
                elif judged_keeps and kept == tuple(v.kept):
                    row.judged_own += calls
            seen[v.key].add(kept)
        rows.append(row)
    return rows


def calls_rule(pipeline: PipelineConfig) -> str:
    """How many outcome calls a trajectory asks, in words."""
    if pipeline.outcome_mode == "key_point":
        return "one outcome call per key point"
    if pipeline.outcome_mode == "combined":
        return (
            f"one outcome call per key point for a trajectory of at most {pipeline.combined_max_key_points} "
            "key points, one per trajectory otherwise"
        )
    return "one outcome call per trajectory"


def judged_cache_words(judged: JudgedFolder, record: dict, cache: Path) -> tuple[bool, str]:
    """Whether the judged run's own requests can be answered by the sweep's ``cache`` (the judged run's is
    :attr:`~keyshot.infer.judge.sweep_source.JudgedFolder.own_cache`), and why: the judge settings it was
    judged with, as far as its run.json records them."""
    own = judged.own_cache
    if own is None or cache.resolve() != own.resolve():
        return False, f"not in this sweep's cache ({cache}): paid"
    differ = [
        f"{key} {judged.protocol.get(key)!r} there, {record.get(key)!r} here"
        for key in (*JUDGE_SETTINGS, "constrained_answers")
        if key in judged.protocol and judged.protocol.get(key) != record.get(key)
    ]
    if differ:
        return (
            False,
            f"its cache answers them only for the judge settings it was sent with ({'; '.join(differ)}): paid",
        )
    return True, (
        f"its cache ({cache}) answers them if the run asked the same log-probabilities and outcome token limit "
        "(pipeline.outcome_logprobs, pipeline.outcome_max_tokens; its run.json does not record them)"
    )


def forecast_lines(
    rows: list[DeltaForecast],
    pipeline: PipelineConfig,
    judged: JudgedFolder,
    record: dict,
    cache: Path,
) -> list[str]:
    """What a sweep says before it sends anything: per δ the outcome calls it pays at most, and why
    (``cache``: the sweep's call cache)."""
    total = sum(r.at_most for r in rows)
    lines = [
        f"Before any call: at most {count_of(total, 'outcome call', 'outcome calls')} to pay ({calls_rule(pipeline)})."
    ]
    for r in rows:
        said = f"δ={r.delta}: at most {r.at_most} paid of {count_of(r.calls, 'call', 'calls')} for "
        said += f"{count_of(r.trajectories, 'trajectory', 'trajectories')} to ask"
        if r.repeated:
            said += f"; {r.repeated} repeat an earlier δ's requests (the same kept screenshots: the cache answers them)"
        if r.judged_own:
            said += f"; {r.judged_own} repeat the judged run's own requests"
        if r.already:
            said += f"; {r.already} finished by an earlier sweep, not asked"
        lines.append(said + ".")
    repeats = sum(r.judged_own for r in rows)
    if repeats:
        usable, why = judged_cache_words(judged, record, cache)
        fewer = f": then {total - repeats} paid in all" if usable else ""
        lines.append(
            f"The judged run's own requests ({repeats}, at its δ={judged.protocol.get('threshold')}, the same kept "
            f"screenshots): {why}{fewer}."
        )
    return lines


def plan_sweep(source: Path, deltas: list[float], pipeline: PipelineConfig | None = None) -> list[dict]:
    """What a sweep of ``source`` would show and ask, read from the verdicts alone (no call, no judge):
    per δ the screenshots kept, and the outcome requests a sweep with an empty cache would send (a
    trajectory whose kept screenshots equal an earlier δ's asks the same request: the cache answers it)."""
    judged = read_judged(source)
    cfg = sweep_pipeline(pipeline or PipelineConfig(), judged)
    usable = [v for v in judged.verdicts if unsweepable(v) is None]  # what a sweep asks, as it decides
    if usable and all(source_missing(judged, v) for v in usable):
        raise none_readable(judged, f"no such file or folder: {usable[0].source}")
    usable = [v for v in usable if not source_missing(judged, v)]
    scores = sum(s.score is not None for v in usable for s in v.screenshots)
    return [
        {
            "delta": r.delta,
            "trajectories": r.trajectories,
            "kept": r.kept,
            "kept_per_trajectory": r.kept / r.trajectories if r.trajectories else None,
            "outcome_requests": r.at_most,
            "screenshot_scores_reused": scores,
        }
        for r in forecast(usable, deltas, cfg)
    ]


def plan_markdown(source: Path, rows: list[dict], verdicts: int | None = None) -> str:
    lines = [
        f"Plan of a sweep of {source}: no call sent (kept screenshots read from the recorded scores).",
        "",
        "| δ | trajectories | screenshots kept | kept / trajectory | outcome requests (empty cache) | scores reused |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        per = "—" if r["kept_per_trajectory"] is None else f"{r['kept_per_trajectory']:.2f}"
        lines.append(
            f"| {r['delta']} | {r['trajectories']} | {r['kept']} | {per} | {r['outcome_requests']} | "
            f"{r['screenshot_scores_reused']} |"
        )
    return "\n".join(lines) + "\n"
