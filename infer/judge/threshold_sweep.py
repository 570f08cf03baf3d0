"""The threshold sweep behind ``keyshot sweep`` (:mod:`keyshot.infer.judge.sweep` holds its arguments):
the paper's App. B.3 experiment (Table B.4) over a judged folder, where only the outcome call is asked again
for each δ.

The judged folder is a keyshot run folder (or its verdicts.jsonl) or released judge records
(AgentRewardBench WebJudge records, Online-Mind2Web ``src/run.py`` output): each verdict holds the key
points and every screenshot's score, so the sweep calls no scorer and asks no key points: it reuses them.
For each δ it keeps the screenshots scored at least δ (the one keep rule, ``select_kept``) and asks the
outcome call again, through the pipeline's own outcome step and the call cache (an outcome request already
answered, for another δ with the same kept screenshots or by the judged run itself, is not paid again).
Each δ gets its run folder, ``OUT/delta_<δ>``, whose ``run.json`` records the protocol with that δ and the
folder it was swept from; ``OUT/sweep.json`` counts, per δ, the outcome calls sent and served from the
cache, the key-point calls and screenshot scores reused (the calls saved), the outcome prompt tokens and
the seconds.

The outcome call of a keyshot folder shows the kept screenshots as the judged run did (its
``outcome_images``, its image policy), read from each verdict's trajectory (``source``). Released records
hold no pixels of the screenshots they did not keep, so their outcome calls read the kept screenshots'
descriptions (``outcome_images: none``, recorded in each δ's protocol), and the action history the record's
own outcome prompt showed. A verdict that cannot be swept (its run never finished it, its trajectory is
unreadable, a record without an action history) is counted with its reason in sweep.json and the summary.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import JudgeCallError, JudgeClient
from keyshot.infer.client.preflight import preflight
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.errors import EXIT_INCOMPLETE, RunStopError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.common.text import count_of
from keyshot.infer.judge.config import JudgeRunConfig
from keyshot.infer.judge.inputs import ReadOptions
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.run import CACHE_FILE, FirstVerdictRecord, judge_all
from keyshot.infer.judge.sweep_plan import DeltaForecast, forecast, forecast_lines
from keyshot.infer.judge.sweep_source import (
    JudgedFolder,
    RecordedScores,
    SweepError,
    SweepItem,
    delta_record,
    read_judged,
    sweep_pipeline,
    sweepable,
)
from keyshot.infer.loaders.trajectory import TrajectoryError
from keyshot.infer.metrics.sweep_compare import SWEEP_FILE
from keyshot.infer.protocol.images import DEFAULT_POLICY
from keyshot.infer.protocol.verdicts import (
    VERDICTS_FILE,
    ResumeIndex,
    Verdict,
    VerdictWriter,
    empty_usage,
    latest_verdicts,
    read_verdicts,
    select_kept,
)
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.run_record import check_fingerprint, mark_stand_in, stand_in_of

logger = logging.getLogger(__name__)

DEFAULT_DELTAS = (2, 3, 4)


def delta_folder(out: Path, delta: float) -> Path:
    """``OUT/delta_3`` (``delta_3.5`` for a δ between scores)."""
    return out / f"delta_{int(delta) if float(delta).is_integer() else delta}"


def parse_deltas(text: str) -> list[float]:
    """``"2,3,4"`` → ``[2, 3, 4]``; each within the score scale [1, 5], none twice."""
    try:
        deltas = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SweepError(f"--deltas {text!r}: give numbers separated by commas, such as 2,3,4") from None
    bad = [d for d in deltas if not 1 <= d <= 5]
    if not deltas or bad or len(set(deltas)) != len(deltas):
        raise SweepError(
            f"--deltas {text!r}: give distinct thresholds within the score scale 1..5, such as 2,3,4"
        )
    return [int(d) if d.is_integer() else d for d in deltas]


@dataclass
class DeltaCounts:
    """One δ of the sweep: what it asked, sent, reused, and left out."""

    delta: float
    folder: str
    trajectories: int = 0  # swept in this run
    already: int = 0  # finished in the δ folder by an earlier run, not asked again
    outcome_calls: int = 0  # asked through the call cache
    outcome_sent: int = 0  # of them, sent to the judge
    outcome_cached: int = 0  # of them, answered by the cache
    outcome_failed: int = 0
    incomplete: int = (
        0  # verdicts without a result (a failed call, an unreadable kept screenshot): asked again
    )
    failed: dict[str, int] = field(
        default_factory=dict
    )  # of them, by why (KEPT_UNREADABLE, CALL_FAILED, ...)
    outcome_prompt_tokens: int = 0
    outcome_completion_tokens: int = 0
    key_point_calls_reused: int = 0
    screenshot_scores_reused: int = 0
    #: what the swept verdicts' usage records beyond their outcome calls: 0 unless something asked again
    scorer_calls_sent: int = 0
    key_point_calls_sent: int = 0
    kept: int = 0  # screenshots shown to the outcome calls
    seconds: float = 0.0
    left_out: dict[str, int] = field(default_factory=dict)
    stopped: str | None = None  # why the judge stopped the sweep (a spent budget, an endpoint down)
    exit_code: int | None = None  # that stop's exit code (docs/reliability.md), as keyshot judge exits

    @property
    def calls_saved(self) -> int:
        return self.key_point_calls_reused + self.screenshot_scores_reused + self.outcome_cached


def _fresh(v: Verdict, config: dict) -> Verdict:
    """The judged verdict with its outcome, usage and errors cleared: what a δ's outcome call fills."""
    out = replace(
        v,
        screenshots=copy.deepcopy(v.screenshots),
        success=None,
        status_valid=False,
        outcome_text=None,
        outcome_calls=[],
        kept=[],
        usage=empty_usage(),
        error=None,
        errors=[],
        config=config,
        timing={},
        incomplete=[],
        cut=[],
    )
    return out


#: Why a swept verdict has no result, as sweep.json counts it (``failed``); each is asked again by the next run.
KEPT_UNREADABLE = "a kept screenshot is not readable"
CALL_FAILED = "the outcome call failed"
ANSWER_UNUSABLE = "the outcome answer cannot be read"
UNEXPECTED = "an unexpected failure (a bug: the log has its traceback)"


async def _sweep_one(
    judge: WebJudge, item: SweepItem, delta: float, record: dict, failed: Counter
) -> Verdict:
    """The outcome of one judged verdict asked again at ``delta``. What fails (a kept screenshot that cannot
    be read now, the call, its answer) fails this verdict alone, with its reason counted in ``failed``, as
    keyshot judge records such a failure on its verdict and goes on; a stop of the judge stops the sweep."""
    cfg = judge.config
    verdict = _fresh(item.verdict, dict(record))
    verdict.kept = select_kept(
        verdict.screenshots, delta, cfg.max_kept, mode=cfg.parse_mode, threshold_on=cfg.threshold_on
    )
    t0 = time.perf_counter()
    reason = None
    try:
        images = {}
        if cfg.outcome_images == "scorer":
            shots = {s.index: s for s in item.trajectory.screenshots}
            prepared = await asyncio.gather(
                *(asyncio.to_thread(shots[i].prepare, judge.policy) for i in verdict.kept)
            )
            images = dict(zip(verdict.kept, prepared, strict=True))
        await judge._outcome(item.trajectory, verdict, images)  # the pipeline's own outcome step
    except RunStopError:  # a RuntimeError, but not a failed call: the run stops (judge_all says why)
        raise
    except TrajectoryError as exc:  # "original" images are prepared inside the outcome step
        reason, error = KEPT_UNREADABLE, f"{KEPT_UNREADABLE}: {exc}"
    except JudgeCallError as exc:
        reason, error = CALL_FAILED, str(exc)
    except RuntimeError as exc:  # an answer the pipeline cannot go on from (cut, in strict mode)
        reason, error = ANSWER_UNUSABLE, str(exc)
    except Exception as exc:  # a bug or an unexpected input must not stop the sweep, as in keyshot judge
        logger.exception("%s: unexpected failure of the outcome at δ=%s", verdict.task_id, delta)
        reason, error = UNEXPECTED, f"{type(exc).__name__}: {exc}"
    if reason is not None:
        failed[reason] += 1
        verdict.success, verdict.status_valid = None, False
        verdict.error = f"outcome: {error}"
        verdict.errors.append(verdict.error)
        logger.warning("%s: δ=%s: %s", verdict.task_id, delta, verdict.error)
    verdict.timing = {"started": time.time(), "outcome_s": time.perf_counter() - t0}
    return verdict


def _read_with(judged: JudgedFolder, cfg: JudgeRunConfig, allow_outside: tuple[str, ...]) -> ReadOptions:
    """How the sweep reads the judged trajectories: as the judged run recorded it read them (else with the
    config's format, agent and benchmark), and ``--allow-outside`` beside."""
    base = judged.read_with or ReadOptions(format=cfg.format, agent=cfg.agent, benchmark=cfg.benchmark)
    return base.also_outside(allow_outside)


def run_sweep(
    source: Path,
    cfg: JudgeRunConfig,
    deltas: list[float],
    out: Path,
    *,
    concurrency: int | None = None,
    progress: bool = True,
    given: dict[str, str] | None = None,
    allow_outside: tuple[str, ...] = (),
) -> dict:
    """Sweep ``deltas`` over the judged ``source`` into ``out`` (see the module docstring and
    :func:`prepare_sweep`); the contents of ``OUT/sweep.json``."""
    sweep = prepare_sweep(source, cfg, deltas, out, given=given, allow_outside=allow_outside)
    for line in sweep.forecast_lines():
        logger.info("%s", line)
    return sweep.run(concurrency=concurrency, progress=progress)


def prepare_sweep(
    source: Path,
    cfg: JudgeRunConfig,
    deltas: list[float],
    out: Path,
    *,
    given: dict[str, str] | None = None,
    allow_outside: tuple[str, ...] = (),
) -> PreparedSweep:
    """Everything a sweep checks and reads before it sends anything: the judged folder and its settings
    (``given``: the pipeline settings the user gave, with where, from
    :func:`~keyshot.infer.judge.sweep_source.pipeline_keys_given`; one that differs from the judged folder's
    is refused), each δ's record (a δ folder that holds verdicts of other settings, another judge
    temperature say, is refused), the trajectories read again, and the forecast of the calls to pay."""
    judged = read_judged(source)
    pipeline = sweep_pipeline(cfg.pipeline, judged, given)
    records = {delta: delta_record(pipeline, delta, cfg.judge, judged) for delta in deltas}
    for delta, record in records.items():  # every δ folder, before anything is sent or written
        check_fingerprint(delta_folder(out, delta), record, record=False)
    read_with = _read_with(judged, cfg, allow_outside)
    items, left, named = sweepable(judged, read_with)
    for line in named:
        logger.warning("not swept: %s", line)
    own = judged.own_cache
    cache_path = Path(cfg.cache) if cfg.cache else (own if own and own.is_file() else out / CACHE_FILE)
    return PreparedSweep(
        source, cfg, deltas, out, judged, pipeline, records, read_with, items, left, cache_path
    )


@dataclass
class PreparedSweep:
    """A sweep checked and read, nothing sent yet (:func:`prepare_sweep`); :meth:`run` sends it."""

    source: Path
    cfg: JudgeRunConfig
    deltas: list[float]
    out: Path
    judged: JudgedFolder
    pipeline: PipelineConfig
    records: dict[float, dict]
    read_with: ReadOptions
    items: list[SweepItem]
    left: Counter
    cache_path: Path

    def forecast(self) -> list[DeltaForecast]:
        """The outcome calls each δ asks and pays at most (a verdict finished in its δ folder is not asked)."""
        done = {
            d: ResumeIndex(latest_verdicts(read_verdicts(delta_folder(self.out, d) / VERDICTS_FILE)))
            for d in self.deltas
        }
        return forecast(
            [i.verdict for i in self.items],
            self.deltas,
            self.pipeline,
            finished=lambda d, v: done[d].done(v.task_id, v.agent, v.run),
            judged_keeps=not self.judged.released,
        )

    def forecast_lines(self) -> list[str]:
        """What the sweep says before it sends anything: how many outcome calls it pays at most, and why."""
        record = next(iter(self.records.values()), {})
        return forecast_lines(self.forecast(), self.pipeline, self.judged, record, self.cache_path)

    def check_judge(self) -> None:
        """The judge's preflight, as keyshot judge's (docs/reliability.md): a judge that is down, its key
        missing or its model not served ends the sweep within seconds, exit 6, before anything is
        written; a sweep the cache answers whole needs no judge."""
        if any(row.at_most for row in self.forecast()):
            preflight([self.cfg.judge], sections=["judge"])

    def run(self, *, concurrency: int | None = None, progress: bool = True) -> dict:
        """Ask each δ's outcomes (resuming what an earlier run finished) and write ``OUT/sweep.json``; its
        contents."""
        t_all = time.perf_counter()
        cfg, judged, out = self.cfg, self.judged, self.out
        stand_in = None if judged.released else stand_in_of(judged.folder)
        out.mkdir(parents=True, exist_ok=True)
        rows: list[DeltaCounts] = []
        stopped: str | None = None
        exit_code: int | None = None
        with RunLock(out, what="keyshot sweep"):
            cache = CallCache(self.cache_path)
            ledger = UsageLedger()
            try:
                for delta in self.deltas:
                    sweep = _DeltaSweep(
                        delta, self.records[delta], judged, self.pipeline, self.read_with, stand_in
                    )
                    row = sweep.run(
                        self.items,
                        self.left,
                        out,
                        cfg,
                        cache,
                        ledger,
                        concurrency or cfg.concurrency,
                        progress,
                    )
                    rows.append(row)
                    if row.stopped:
                        stopped = f"δ={delta}: {row.stopped}"
                        if "re-run" not in row.stopped:  # the one thing to do, said once
                            stopped += "; re-run the same keyshot sweep to go on"
                        exit_code = row.exit_code
                        break
            finally:
                cache.close()
            result = {
                "source": str(self.source),
                "source_kind": judged.kind,
                "deltas": self.deltas,
                "cache": str(self.cache_path),
                "judge_model": cfg.judge.model,
                "outcome_images": self.pipeline.outcome_images,
                "verdicts": len(judged.verdicts),
                "sweepable": len(self.items),
                "not_swept": dict(sorted(self.left.items())),
                "stand_in": stand_in,
                "per_delta": [dict(r.__dict__, calls_saved=r.calls_saved) for r in rows],
                "totals": {
                    "outcome_calls_sent": sum(r.outcome_sent for r in rows),
                    "outcome_calls_cached": sum(r.outcome_cached for r in rows),
                    "scorer_calls_sent": sum(r.scorer_calls_sent for r in rows),
                    "key_point_calls_sent": sum(r.key_point_calls_sent for r in rows),
                    "calls_saved": sum(r.calls_saved for r in rows),
                    "outcome_prompt_tokens": sum(r.outcome_prompt_tokens for r in rows),
                    "seconds": time.perf_counter() - t_all,
                },
                "stopped": stopped,
                "exit_code": exit_code,
            }
            write_text_atomic(out / SWEEP_FILE, json.dumps(result, indent=2, ensure_ascii=False) + "\n")
        return result


@dataclass
class _DeltaSweep:
    """One δ of a sweep: its record, and the judged folder's verdicts asked again into ``OUT/delta_<δ>``."""

    delta: float
    record: dict
    judged: JudgedFolder
    pipeline: PipelineConfig
    read_with: ReadOptions
    stand_in: str | None

    def run(
        self,
        items: list[SweepItem],
        left: Counter,
        out: Path,
        cfg: JudgeRunConfig,
        cache: CallCache,
        ledger: UsageLedger,
        concurrency: int,
        progress: bool,
    ) -> DeltaCounts:
        t0 = time.perf_counter()
        delta = self.delta
        folder = delta_folder(out, delta)
        row = DeltaCounts(delta=delta, folder=folder.name, left_out=dict(sorted(left.items())))
        pipeline = replace(self.pipeline, threshold=delta)
        judge = WebJudge(
            JudgeClient(cfg.judge, cache, ledger),
            RecordedScores(self.judged, pipeline),
            pipeline,
            # released records show no screenshot (outcome images: none): no policy to warn about
            image_policy=self.judged.policy or (DEFAULT_POLICY if self.judged.released else None),
        )
        folder.mkdir(parents=True, exist_ok=True)
        check_fingerprint(folder, self.record, record=False)
        if self.stand_in:
            mark_stand_in(folder, self.stand_in)
        path = folder / VERDICTS_FILE
        done = ResumeIndex(latest_verdicts(read_verdicts(path)))
        todo = [i for i in items if not done.done(i.verdict.task_id, i.verdict.agent, i.verdict.run)]
        row.already = len(items) - len(todo)
        failed: Counter = Counter()
        with VerdictWriter(path) as writer:
            judged = asyncio.run(
                judge_all(
                    judge,
                    todo,
                    # run.json with the first verdict: the δ's record, and how its trajectories were read
                    FirstVerdictRecord(writer, folder, self.record, self.read_with.to_dict()),
                    concurrency,
                    progress=progress,
                    judge_one=lambda item: _sweep_one(judge, item, delta, self.record, failed),
                    desc=f"δ={delta}",
                )
            )
        for verdict in judged:
            _count(row, verdict)
        row.failed = dict(sorted(failed.items()))
        if judge.stop_error is not None:
            row.stopped, row.exit_code = str(judge.stop_error), judge.stop_error.exit_code
            logger.error("δ=%s: the judge stopped the sweep: %s", delta, judge.stop_error)
        row.seconds = time.perf_counter() - t0
        return row


def _count(row: DeltaCounts, v: Verdict) -> None:
    row.trajectories += 1
    row.incomplete += not v.finished
    row.key_point_calls_reused += 1
    row.screenshot_scores_reused += sum(s.score is not None and s.same_as is None for s in v.screenshots)
    row.kept += len(v.kept)
    usage = v.usage["judge"]
    asked = len(v.outcome_calls) if v.outcome_calls else usage.calls + usage.errors
    scorer = v.usage["scorer"]
    row.scorer_calls_sent += scorer.calls - scorer.cached
    row.key_point_calls_sent += max(usage.calls + usage.errors - asked, 0)
    row.outcome_calls += asked
    row.outcome_cached += usage.cached
    row.outcome_sent += usage.calls - usage.cached
    row.outcome_failed += usage.errors
    row.outcome_prompt_tokens += usage.prompt_tokens
    row.outcome_completion_tokens += usage.completion_tokens


def sweep_markdown(result: dict) -> str:
    """The sweep's counts as a table: what each δ sent, reused and left out."""
    lines = [
        f"Sweep of {result['source']} ({result['source_kind']}): {result['sweepable']} of {result['verdicts']} "
        f"verdicts swept; outcome images: {result['outcome_images']}.",
    ]
    if result["not_swept"]:
        lines.append("Not swept: " + ", ".join(f"{k} {n}" for k, n in result["not_swept"].items()) + ".")
    if result.get("stand_in"):
        lines.append(f"**{result['stand_in']}**")
    lines += [
        "",
        "| δ | trajectories | outcome calls sent | from cache | failed | scorer calls sent | key points reused | "
        "scores reused | calls saved | kept screenshots | outcome prompt tokens | seconds |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["per_delta"]:
        lines.append(
            f"| {r['delta']} | {r['trajectories']} | {r['outcome_sent']} | {r['outcome_cached']} | "
            f"{r['outcome_failed']} | {r['scorer_calls_sent']} | {r['key_point_calls_reused']} | "
            f"{r['screenshot_scores_reused']} | {r['calls_saved']} | {r['kept']} | {r['outcome_prompt_tokens']} | "
            f"{r['seconds']:.1f} |"
        )
    t = result["totals"]
    lines += [
        "",
        f"Sent: {t['outcome_calls_sent']} outcome calls, {t['scorer_calls_sent']} scorer calls, "
        f"{t['key_point_calls_sent']} key-point calls; saved: {t['calls_saved']} calls "
        f"({t['outcome_calls_cached']} outcome answers from the cache).",
    ]
    for r in result["per_delta"]:
        if r.get("failed"):
            said = ", ".join(f"{reason} ({n})" for reason, n in r["failed"].items())
            lines.append(
                f"δ={r['delta']}: {count_of(r['incomplete'], 'verdict', 'verdicts')} without a result: {said}."
            )
    if result.get("stopped"):
        lines.append(f"Stopped: {result['stopped']}")
    return "\n".join(lines) + "\n"


def closing_lines(result: dict, out: Path) -> tuple[list[str], int]:
    """What the terminal says after the sweep's table, and the exit code: as keyshot judge exits, a stop
    with its own code (a spent budget 5, a dead endpoint 4), and 3 while a swept verdict rests on a failed
    call (it is not a result)."""
    lines = [f"wrote {out / SWEEP_FILE} and {', '.join(r['folder'] for r in result['per_delta'])}"]
    if result["stopped"]:  # what to do is the Stopped line's: nothing else to do before it
        return lines, result["exit_code"] or EXIT_INCOMPLETE
    incomplete = sum(r["incomplete"] for r in result["per_delta"])
    if incomplete:
        why = Counter()
        for r in result["per_delta"]:
            why.update(r.get("failed") or {})
        said = "; ".join(f"{reason}: {n}" for reason, n in sorted(why.items())) or "a failed outcome call"
        lines.append(
            f"{incomplete} swept verdict(s) incomplete ({said}): run keyshot sweep again to ask them"
        )
        return lines, EXIT_INCOMPLETE
    lines.append(
        f"compare them: keyshot metrics {out} --human-labels LABELS (or --arb-index INDEX.csv) --out METRICS"
    )
    return lines, 0
