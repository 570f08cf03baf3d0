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
from keyshot.infer.client.usage import UsageLedger
from keyshot.infer.common.errors import EXIT_INCOMPLETE, RunStopError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.judge.pipeline import PipelineConfig, WebJudge
from keyshot.infer.judge.run import FirstVerdictRecord, judge_all
from keyshot.infer.judge.scorers import JUDGE_SCORES
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.judge_records import recorded_actions
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.protocol.images import ImagePolicy
from keyshot.infer.protocol.verdicts import (
    VERDICTS_FILE,
    ResumeIndex,
    Verdict,
    VerdictWriter,
    empty_usage,
    latest_verdicts,
    read_verdicts,
    select_kept,
    verdict_key,
)
from keyshot.infer.runs.counts import INCOMPLETE, NO_SCORES, outcome_of
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.run_record import check_fingerprint, mark_stand_in, read_protocol, stand_in_of
from keyshot.infer.runs.verdict_sources import load_verdicts, read_reference_records

logger = logging.getLogger(__name__)

DEFAULT_DELTAS = (2, 3, 4)
SWEEP_FILE = "sweep.json"
CACHE_FILE = "calls.sqlite"
#: What the protocol of a swept folder adds: where its key points and scores came from.
SWEPT_FROM = "swept_from"
#: The protocol keys a swept δ takes from the judged folder (what decides the verdict besides δ).
_FROM_FOLDER = ("prompt_variant", "outcome_mode", "parse_mode", "threshold_on", "max_kept", "outcome_images")


class SweepError(JudgeRunError):
    """A sweep that cannot start: no verdicts, a δ off the score scale, another protocol in OUT."""


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
    incomplete: int = 0  # verdicts built on a failed call: asked again by the next run
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


@dataclass
class _Item:
    verdict: Verdict
    trajectory: Trajectory


def _released_trajectory(v: Verdict) -> Trajectory:
    """The task and action history a released record's outcome call showed (no screenshots: no pixels)."""
    try:
        record = json.loads(Path(v.source or "").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TrajectoryError(Path(v.source or "?"), f"cannot read the record again ({exc})") from None
    actions = recorded_actions(record) if isinstance(record, dict) else None
    if actions is None:
        raise TrajectoryError(Path(v.source or "?"), "holds no action history (action_history or input_text)")
    return Trajectory(v.task_id, v.task, actions, agent=v.agent, benchmark=v.benchmark, run=v.run)


class _Sources:
    """The trajectories of each source a judged run read (a folder or a JSONL file may hold several),
    loaded once, found by the verdict's identity (task, agent, run; a trajectory that names no agent, judged
    with ``agent=``, by task and run)."""

    def __init__(self) -> None:
        self._loaded: dict[str, list[Trajectory]] = {}

    def find(self, v: Verdict) -> Trajectory:
        source = v.source or ""
        if source not in self._loaded:
            errors: list[TrajectoryError] = []
            self._loaded[source] = list(load_trajectories(source, on_error="skip", errors=errors))
        found = self._loaded[source]
        exact = [t for t in found if verdict_key(t.task_id, t.agent, t.run) == v.key]
        loose = [t for t in found if str(t.task_id) == str(v.task_id) and (t.run or "") == (v.run or "")]
        if len(exact) == 1 or len(loose) == 1:
            return (exact or loose)[0]
        raise TrajectoryError(
            Path(source),
            f"no trajectory of task {v.task_id!r} (agent {v.agent!r}) read from it ({len(found)} read)",
        )


def sweepable(verdicts: list[Verdict], released: bool) -> tuple[list[_Item], Counter, list[str]]:
    """The verdicts a sweep can ask the outcome of, each with its trajectory; the others counted by
    reason, with the first few named."""
    items: list[_Item] = []
    left: Counter = Counter()
    named: list[str] = []
    sources = _Sources()
    for v in verdicts:
        outcome = outcome_of(v)
        reason = None
        if not v.key_points:
            reason = "no key points in the judged verdict"
        elif outcome == NO_SCORES:
            reason = "no readable screenshot score in the judged verdict"
        elif outcome == INCOMPLETE and (v.incomplete or any(s.call_failed for s in v.screenshots)):
            reason = "judged verdict incomplete: finish it with keyshot judge first"
        if reason is None:
            try:
                trajectory = _released_trajectory(v) if released else sources.find(v)
            except (TrajectoryError, OSError, ValueError) as exc:
                reason = "trajectory not readable"
                if len(named) < 5:
                    named.append(f"{v.task_id}: {exc}")
            else:
                items.append(_Item(v, trajectory))
                continue
        left[reason] += 1
    return items, left, named


def one_judge(source: Path, verdicts: list[Verdict]) -> None:
    """Refuse released records of several judges: one trajectory's records would stand for one another."""
    every = read_reference_records(source)
    judges = sorted({str(v.config.get("judge_model")) for v in every})
    records = len(every)
    if records != len(verdicts):
        raise SweepError(
            f"{source}: {records} records of {len(verdicts)} trajectories, by {len(judges)} judges "
            f"({', '.join(judges)}): sweep one judge's folder at a time (such as {source}/<judge>)"
        )


def sweep_pipeline(base: PipelineConfig, protocol: dict, released: bool) -> PipelineConfig:
    """The pipeline of the swept δ's: the judged folder's protocol where it decides the verdict, the
    config's outcome settings (log-probabilities, token limits) beside it."""
    taken = {k: protocol[k] for k in _FROM_FOLDER if k in protocol and protocol[k] is not None}
    if released:
        taken["outcome_images"] = "none"
    return replace(base, **taken)


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


async def _sweep_one(judge: WebJudge, item: _Item, delta: float, swept_from: str) -> Verdict:
    cfg = judge.config
    verdict = _fresh(item.verdict, {**judge.describe(), "threshold": delta, SWEPT_FROM: swept_from})
    verdict.kept = select_kept(
        verdict.screenshots, delta, cfg.max_kept, mode=cfg.parse_mode, threshold_on=cfg.threshold_on
    )
    t0 = time.perf_counter()
    images = {}
    if cfg.outcome_images == "scorer":
        shots = {s.index: s for s in item.trajectory.screenshots}
        prepared = await asyncio.gather(
            *(asyncio.to_thread(shots[i].prepare, judge.policy) for i in verdict.kept)
        )
        images = dict(zip(verdict.kept, prepared, strict=True))
    try:
        await judge._outcome(item.trajectory, verdict, images)  # the pipeline's own outcome step
    except RunStopError:  # a RuntimeError, but not a failed call: the run stops (judge_all says why)
        raise
    except (JudgeCallError, RuntimeError) as exc:  # a failed call, or an answer the pipeline cannot read
        verdict.success, verdict.status_valid = None, False
        verdict.error = f"outcome: {exc}"
        verdict.errors.append(verdict.error)
    verdict.timing = {"started": time.time(), "outcome_s": time.perf_counter() - t0}
    return verdict


def _protocol_of(source: Path, verdicts: list[Verdict], released: bool) -> dict:
    if not released:
        folder = source if source.is_dir() else source.parent
        recorded = read_protocol(folder)
        if recorded:
            return dict(recorded)
    return dict(verdicts[0].config) if verdicts else {}


def run_sweep(
    source: Path,
    cfg: JudgeRunConfig,
    deltas: list[float],
    out: Path,
    *,
    concurrency: int | None = None,
    progress: bool = True,
) -> dict:
    """Sweep ``deltas`` over the judged ``source`` into ``out`` (see the module docstring); the
    contents of ``OUT/sweep.json``."""
    t_all = time.perf_counter()
    verdicts, kind = load_verdicts(source)
    released = kind != "keyshot"
    if released:
        one_judge(source, verdicts)
    protocol = _protocol_of(source, verdicts, released)
    pipeline = sweep_pipeline(cfg.pipeline, protocol, released)
    policy = (
        ImagePolicy.from_dict(protocol["image_policy"])
        if isinstance(protocol.get("image_policy"), dict)
        else None
    )
    items, left, named = sweepable(verdicts, released)
    for line in named:
        logger.warning("not swept: %s", line)
    stand_in = None if released else stand_in_of(source if source.is_dir() else source.parent)
    folder = source if source.is_dir() else source.parent
    own_cache = None if released else folder / CACHE_FILE
    cache_path = (
        Path(cfg.cache)
        if cfg.cache
        else (own_cache if own_cache and own_cache.is_file() else out / CACHE_FILE)
    )
    out.mkdir(parents=True, exist_ok=True)
    rows: list[DeltaCounts] = []
    stopped: str | None = None
    exit_code: int | None = None
    with RunLock(out, what="keyshot sweep"):
        cache = CallCache(cache_path)
        ledger = UsageLedger()
        try:
            for delta in deltas:
                row = _sweep_delta(
                    delta,
                    items,
                    left,
                    out,
                    cfg,
                    pipeline,
                    policy,
                    protocol,
                    str(source),
                    cache,
                    ledger,
                    stand_in,
                    concurrency or cfg.concurrency,
                    progress,
                )
                rows.append(row)
                if row.stopped:
                    stopped = f"δ={delta}: {row.stopped}; run keyshot sweep again to go on"
                    exit_code = row.exit_code
                    break
        finally:
            cache.close()
        result = {
            "source": str(source),
            "source_kind": kind,
            "deltas": deltas,
            "cache": str(cache_path),
            "judge_model": cfg.judge.model,
            "outcome_images": pipeline.outcome_images,
            "verdicts": len(verdicts),
            "sweepable": len(items),
            "not_swept": dict(sorted(left.items())),
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


def _sweep_delta(
    delta: float,
    items: list[_Item],
    left: Counter,
    out: Path,
    cfg: JudgeRunConfig,
    pipeline: PipelineConfig,
    policy: ImagePolicy | None,
    protocol: dict,
    swept_from: str,
    cache: CallCache,
    ledger: UsageLedger,
    stand_in: str | None,
    concurrency: int,
    progress: bool,
) -> DeltaCounts:
    t0 = time.perf_counter()
    folder = delta_folder(out, delta)
    row = DeltaCounts(delta=delta, folder=folder.name, left_out=dict(sorted(left.items())))
    judge = WebJudge(
        JudgeClient(cfg.judge, cache, ledger),
        JUDGE_SCORES,
        replace(pipeline, threshold=delta),
        image_policy=policy,
    )
    fingerprint = {
        **protocol,
        **{k: getattr(judge.config, k) for k in _FROM_FOLDER},
        "threshold": delta,
        "judge_model": cfg.judge.model,
        SWEPT_FROM: swept_from,
    }
    if pipeline.p_success_threshold is not None:  # the operating point decides the verdicts too
        fingerprint["p_success_threshold"] = pipeline.p_success_threshold
    if pipeline.outcome_images == "none" or policy is None:
        fingerprint["image_policy"] = protocol.get("image_policy")
    folder.mkdir(parents=True, exist_ok=True)
    check_fingerprint(folder, fingerprint, record=False)
    if stand_in:
        mark_stand_in(folder, stand_in)
    path = folder / VERDICTS_FILE
    done = ResumeIndex(latest_verdicts(read_verdicts(path)))
    todo = [i for i in items if not done.done(i.verdict.task_id, i.verdict.agent, i.verdict.run)]
    row.already = len(items) - len(todo)
    with VerdictWriter(path) as writer:
        judged = asyncio.run(
            judge_all(
                judge,
                todo,
                FirstVerdictRecord(writer, folder, fingerprint),  # run.json with the first verdict
                concurrency,
                progress=progress,
                judge_one=lambda item: _sweep_one(judge, item, delta, swept_from),
                desc=f"δ={delta}",
            )
        )
    for verdict in judged:
        _count(row, verdict)
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


def plan_sweep(source: Path, deltas: list[float], pipeline: PipelineConfig | None = None) -> list[dict]:
    """What a sweep of ``source`` would show and ask, read from the verdicts alone (no call, no judge):
    per δ the screenshots kept, and the outcome requests a sweep with an empty cache would send (a
    trajectory whose kept screenshots equal an earlier δ's asks the same request: the cache answers it)."""
    verdicts, kind = load_verdicts(source)
    released = kind != "keyshot"
    if released:
        one_judge(source, verdicts)
    cfg = sweep_pipeline(pipeline or PipelineConfig(), _protocol_of(source, verdicts, released), released)
    usable = [v for v in verdicts if v.key_points and outcome_of(v) != NO_SCORES]
    seen: dict[tuple, set] = {v.key: set() for v in usable}
    rows = []
    for delta in deltas:
        kept_total = requests = 0
        for v in usable:
            kept = tuple(
                select_kept(
                    v.screenshots, delta, cfg.max_kept, mode=cfg.parse_mode, threshold_on=cfg.threshold_on
                )
            )
            kept_total += len(kept)
            requests += kept not in seen[v.key]
            seen[v.key].add(kept)
        rows.append(
            {
                "delta": delta,
                "trajectories": len(usable),
                "kept": kept_total,
                "kept_per_trajectory": kept_total / len(usable) if usable else None,
                "outcome_requests": requests,
                "screenshot_scores_reused": sum(s.score is not None for v in usable for s in v.screenshots),
            }
        )
    return rows


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
    if result.get("stopped"):
        lines.append(f"Stopped: {result['stopped']}")
    return "\n".join(lines) + "\n"


def closing_lines(result: dict, out: Path) -> tuple[list[str], int]:
    """What the terminal says after the sweep's table, and the exit code: as keyshot judge exits, a stop
    with its own code (a spent budget 5, a dead endpoint 4), and 3 while a swept verdict rests on a failed
    call (it is not a result)."""
    lines = [
        f"wrote {out / SWEEP_FILE} and {', '.join(r['folder'] for r in result['per_delta'])}",
        f"compare them: keyshot metrics {out} --human-labels LABELS (or --arb-index INDEX.csv) --out METRICS",
    ]
    if result["stopped"]:
        return lines, result["exit_code"] or EXIT_INCOMPLETE
    incomplete = sum(r["incomplete"] for r in result["per_delta"])
    if incomplete:
        lines.append(
            f"{incomplete} swept verdict(s) incomplete (a failed outcome call): run keyshot sweep again to ask them"
        )
        return lines, EXIT_INCOMPLETE
    return lines, 0
