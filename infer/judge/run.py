"""A ``keyshot judge`` run: its inputs and protocol, the dry run's plan, judging with resume, the summary.

The library side of ``keyshot judge`` (:mod:`keyshot.infer.judge.command` holds its arguments only):
:func:`run_judge` is the whole run, :func:`dry_run` what a run would judge and cost, the demo and tests
call them directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from pathlib import Path

from tqdm import tqdm

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import JudgeClient
from keyshot.infer.client.preflight import preflight
from keyshot.infer.client.usage import BudgetExceededError, UsageLedger
from keyshot.infer.common.config import config_to_dict
from keyshot.infer.common.errors import (
    RunStopError,
    require_training_stack,
)
from keyshot.infer.common.redaction import redact_config
from keyshot.infer.common.text import count_of
from keyshot.infer.engines.ray_cluster import connect, require_ray
from keyshot.infer.engines.ray_engine import EngineOptions
from keyshot.infer.judge.agentlab_summary import write_agentlab_summaries
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.judge.estimate import ANSWER_TOKENS, estimate_run, estimate_table
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.inputs import (
    Inputs,
    ReadOptions,
    import_reference_verdicts,
    load_all,
    nothing_found_message,
    other_inputs_message,
)
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.ray_judge import judge_on_ray
from keyshot.infer.judge.scorer_factory import (
    apply_serve_scorer,
    build_scorer,
    check_model_folder,
    describe_scorer,
    scorer_max_tokens,
    scorer_policy,
    served_scorer,
    warn_default_policy,
)
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.metrics.files import agreement_summary
from keyshot.infer.model.checkpoint import CheckpointDescription
from keyshot.infer.protocol.images import ImagePolicy
from keyshot.infer.protocol.verdicts import (
    VERDICTS_FILE,
    ResumeIndex,
    Verdict,
    VerdictWriter,
    latest_verdicts,
    read_verdicts,
)
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.run_record import (
    RunFolderError,
    check_fingerprint,
    read_inputs,
    record_engine,
    record_inputs,
)
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.summary import (
    SUMMARY_FILE,
    cut_lines,
    input_figures,
    judged_without_scores_line,
    summarize,
    unreadable_images_line,
    write_summary,
)
from keyshot.infer.serve.plan import check_prompt_version

logger = logging.getLogger(__name__)

CACHE_FILE = "calls.sqlite"


async def judge_all(
    webjudge: WebJudge,
    trajectories: list[Trajectory],
    writer: VerdictWriter | FirstVerdictRecord,
    concurrency: int,
    *,
    progress: bool = True,
    judge_one=None,
    desc: str = "judging",
) -> list[Verdict]:
    """Judge ``trajectories`` (at most ``concurrency`` at once), appending each verdict as it is done;
    ``judge_one(item)`` in place of ``webjudge.judge`` judges another kind of item (``keyshot sweep``: a
    judged verdict's outcome asked again).

    Stops starting new trajectories once an endpoint's budget is spent, an endpoint is down or the first
    answers under a token limit were all cut (they are judged on resume).
    """
    judge_one = judge_one or webjudge.judge
    slots = asyncio.Semaphore(max(1, concurrency))
    done: list[Verdict] = []
    bar = tqdm(total=len(trajectories), desc=desc, unit="traj", disable=not progress)
    stop = asyncio.Event()

    async def one(t: Trajectory) -> None:
        async with slots:
            if stop.is_set():
                return
            try:
                verdict = await judge_one(t)
            except RunStopError as exc:
                webjudge.stop_error = webjudge.stop_error or exc  # what the run (or the sweep) reports
                if not stop.is_set():
                    logger.error("%s; stopping%s", exc, f": {exc.advice}" if exc.advice else "")
                stop.set()
                return  # not judged: left for a resumed run
            writer.append(verdict)
            done.append(verdict)
            bar.update(1)
            bar.set_postfix(incomplete=sum(not v.finished for v in done))

    try:
        await asyncio.gather(*(one(t) for t in trajectories))
    finally:
        bar.close()
        await webjudge.aclose()
    return done


def run_folder(cfg: JudgeRunConfig, shard: ShardSpec | None) -> Path:
    """Where a run writes: ``OUT``, or ``OUT/shard-I-of-N`` for one shard."""
    return Path(cfg.out) / shard.folder if shard else Path(cfg.out)


def check_endpoints(cfg: JudgeRunConfig, serve_scorer: str | None) -> None:
    """Preflight of the judge and the scorer endpoint(s) a run will call (not a scorer it serves itself)."""
    served = cfg.scorer.backend == "openai" and not serve_scorer
    preflight(
        [cfg.judge, cfg.scorer.endpoint if served else None],
        pool=cfg.scorer.endpoints if served else None,
        sections=["judge", "scorer.endpoint"],
        pool_section="scorer.endpoints",
    )


def check_scorer_limit(cfg: JudgeRunConfig, checkpoint: CheckpointDescription | None) -> None:
    """Refuse, before any server starts or call is paid, a ``scorer.max_tokens`` below the answer length
    the scorer checkpoint was trained on (:func:`~keyshot.infer.judge.scorer_factory.scorer_max_tokens`)."""
    if not cfg.scorer.judge_scores and cfg.scorer.max_tokens is not None:
        scorer_max_tokens(cfg.scorer, cfg.scorer.max_tokens, checkpoint)


def record_run(out: Path, fingerprint: dict, inputs: dict | None) -> None:
    """Record the run folder's protocol in ``run.json`` (or find it the same; another is refused) and, when
    given, how its trajectories were read (:class:`~keyshot.infer.judge.inputs.ReadOptions`)."""
    check_fingerprint(out, fingerprint)
    if inputs is not None:
        record_inputs(out, inputs)


class FirstVerdictRecord:
    """A verdict writer that records the run folder's protocol (``run.json``, with how its trajectories were
    read) with its first verdict, so a run that stops before judging (an endpoint down at preflight) leaves a
    folder any config may use."""

    def __init__(self, writer: VerdictWriter, out: Path, fingerprint: dict, inputs: dict | None = None):
        self.writer, self.out, self.fingerprint, self.inputs = writer, out, fingerprint, inputs
        self.recorded = False

    def append(self, verdict: Verdict) -> None:
        if not self.recorded:
            record_run(self.out, self.fingerprint, self.inputs)
            self.recorded = True
        self.writer.append(verdict)


def todo_of(out: Path, trajectories: list[Trajectory], *, append: bool) -> list[Trajectory]:
    """The trajectories ``out`` has no finished verdict of; refuses to add them beside the verdicts of
    other inputs unless ``append``."""
    existing = read_verdicts(out / VERDICTS_FILE)
    index = ResumeIndex(existing)
    todo = [t for t in trajectories if not index.done(t.task_id, t.agent, t.run)]
    if not append and (mixed := other_inputs_message(out, existing, trajectories, todo)):
        raise RunFolderError(mixed)
    return todo


def not_judged_lines(inputs: Inputs, todo: list[Trajectory], out: Path, cfg: JudgeRunConfig) -> list[str]:
    """Why the input's other trajectories would not be judged, one line per reason (then the files)."""
    figures = input_figures(inputs.errors)
    reasons = [
        (len(inputs.trajectories) - len(todo), f"already judged in {out}"),
        (inputs.found - inputs.owned, "in other shards"),
        (len(inputs.duplicates), "duplicates of another trajectory"),
        (inputs.beyond_limit, f"beyond limit={cfg.limit}"),
        (figures["load_errors"], "could not be loaded"),
        (figures["not_trajectories"], "not a trajectory"),
    ]
    said = [f"{n} {why}" for n, why in reasons if n]
    lines = [f"not judged: {'; '.join(said) if said else 'none'}"]
    lines += [f"  not loaded: {m}" for m in figures["load_error_messages"][:20]]
    lines += [f"  not a trajectory: {m}" for m in figures["not_trajectory_messages"][:20]]
    lines += [f"  duplicate: {d}" for d in inputs.duplicates[:20]]
    shown = (figures["load_error_messages"], figures["not_trajectory_messages"], inputs.duplicates)
    hidden = sum(max(0, len(listed) - 20) for listed in shown)
    return lines + ([f"  (and {hidden} more)"] if hidden else [])


def _inputs_and_protocol(
    paths: list[str], cfg: JudgeRunConfig, serve_scorer: str | None, allow_outside, shard: ShardSpec | None
) -> tuple[Inputs, dict, CheckpointDescription | None]:
    """The run's inputs, its protocol fingerprint and the scorer checkpoint's description (read here, once
    per run), once the scorer's settings are checked; refuses an input that holds no trajectory."""
    if serve_scorer:
        apply_serve_scorer(cfg, serve_scorer)
    checkpoint = describe_scorer(cfg.scorer) if not cfg.scorer.judge_scores else None
    if checkpoint is not None and not serve_scorer:  # a served one is checked by its server's plan
        check_prompt_version(checkpoint, cfg.pipeline.prompt_variant)
    check_scorer_limit(cfg, checkpoint)
    fingerprint = protocol_fingerprint(cfg, checkpoint)
    inputs = load_all(paths, cfg, allow_outside, shard)
    if not inputs.found:
        raise JudgeRunError(nothing_found_message(paths, inputs.errors))
    return inputs, fingerprint, checkpoint


def dry_run(
    paths: list[str],
    cfg: JudgeRunConfig,
    *,
    serve_scorer: str | None,
    allow_outside: tuple[str, ...],
    shard: ShardSpec | None = None,
    append: bool = False,
) -> str:
    """What a run would judge and what it would cost, checked as far as it can be without an endpoint
    (the caller checks the endpoints after printing it)."""
    for folder in filter(None, [serve_scorer, cfg.scorer.checkpoint]):
        check_model_folder(folder)
    inputs, fingerprint, checkpoint = _inputs_and_protocol(paths, cfg, serve_scorer, allow_outside, shard)
    if not cfg.scorer.judge_scores:
        warn_default_policy(cfg.scorer, scorer_policy(cfg.scorer, checkpoint))
    out = run_folder(cfg, shard)
    check_fingerprint(out, fingerprint, record=False)
    todo = todo_of(out, inputs.trajectories, append=append)
    shots = sum(t.num_screenshots for t in todo)
    per_trajectory = 2 if cfg.pipeline.outcome_mode == "cot" else None
    judge_calls = (
        f"{len(todo) * per_trajectory:,}"
        if per_trajectory
        else f"≥ {2 * len(todo):,} (one outcome call per key point)"
    )
    if cfg.scorer.judge_scores:
        judge_calls = f"{len(todo) * 2 + shots:,} (the judge scores every screenshot)"
    agents = sorted({t.agent or "no agent name" for t in inputs.trajectories})
    owned = f"shard {shard} owns {inputs.owned} of {inputs.found}" if shard else f"{inputs.found}"
    return "\n".join(
        [
            f"dry run: {owned} trajectories found ({', '.join(agents)}), {len(todo)} to judge with "
            f"{shots:,} screenshots",
            *not_judged_lines(inputs, todo, out, cfg),
            f"judge calls: {judge_calls} to {cfg.judge.model} at {cfg.judge.display_url}",
            f"estimate (an upper bound: every screenshot kept, up to {cfg.pipeline.max_kept}, and "
            f"{ANSWER_TOKENS}-token answers; prices from the config):",
            estimate_table(estimate_run(todo, cfg, ImagePolicy.from_dict(fingerprint["image_policy"]))),
        ]
    )


def run_judge(
    paths: list[str],
    cfg: JudgeRunConfig,
    *,
    resume_from: str | None = None,
    serve_scorer: str | None = None,
    progress: bool = True,
    wait: bool = False,
    allow_outside: tuple[str, ...] = (),
    shard: ShardSpec | None = None,
    append: bool = False,
    agentlab_summary: bool = False,
    engine: EngineOptions | None = None,
) -> dict:
    """The whole ``keyshot judge`` run; returns the summary (also written to OUT, or with ``shard`` to
    ``OUT/shard-I-of-N``: join the shards with ``keyshot merge OUT``). An OUT holding verdicts of other
    trajectories is refused unless ``append``. ``agentlab_summary``: each AgentLab run's verdict also goes
    into its summary_info.json (:mod:`keyshot.infer.judge.agentlab_summary`). ``engine``: judge on a Ray
    cluster (:mod:`keyshot.infer.judge.ray_judge`) instead of in this process."""
    t0 = time.perf_counter()
    out = run_folder(cfg, shard)
    if engine is not None:
        check_ray_run(cfg)
    if cfg.scorer.backend == "transformers":
        require_training_stack("scorer.backend=transformers (the in-process scorer)")
    inputs, fingerprint, checkpoint = _inputs_and_protocol(paths, cfg, serve_scorer, allow_outside, shard)
    with RunLock(out, wait=wait, what="keyshot judge"):
        check_fingerprint(out, fingerprint, record=False)  # recorded with the first verdict
        if shard:  # a shard without a summary has not finished: keyshot merge waits for it
            (out / SUMMARY_FILE).unlink(missing_ok=True)
        return _judge_locked(
            out,
            inputs,
            cfg,
            t0,
            fingerprint,
            checkpoint,
            resume_from=resume_from,
            serve_scorer=serve_scorer,
            progress=progress,
            shard=shard,
            append=append,
            agentlab_summary=agentlab_summary,
            engine=engine,
        )


def check_ray_run(cfg: JudgeRunConfig) -> None:
    """Refuse, before any cluster starts, what ``--engine ray`` cannot run: Ray Data not installed, an
    in-process scorer (each actor would load the model)."""
    require_ray()
    if cfg.scorer.backend == "transformers":
        raise JudgeRunError(
            "--engine ray: scorer.backend=transformers loads the model in every actor; serve it "
            "(--serve-scorer, or scorer.endpoint) and use scorer.backend=openai"
        )


def _judge_locked(
    out: Path,
    inputs: Inputs,
    cfg: JudgeRunConfig,
    t0: float,
    fingerprint: dict,
    checkpoint: CheckpointDescription | None,
    *,
    resume_from: str | None,
    serve_scorer: str | None,
    progress: bool,
    shard: ShardSpec | None,
    append: bool,
    agentlab_summary: bool = False,
    engine: EngineOptions | None = None,
) -> dict:
    trajectories = inputs.trajectories
    verdicts_path = out / VERDICTS_FILE
    if verdicts_path.exists():  # cut a half-written last line now, even when nothing is left to judge
        VerdictWriter(verdicts_path).close()
    todo_of(out, trajectories, append=append)  # refuses other inputs' folder before anything is written
    earlier = read_inputs(out)
    read_with = inputs.read_with.joined(ReadOptions.recorded(earlier) if earlier else None).to_dict()
    left_out = 0
    if resume_from:
        imported, left_out = import_reference_verdicts(
            resume_from, verdicts_path, cfg.pipeline.threshold, trajectories
        )
        if imported:
            record_run(out, fingerprint, read_with)
    todo = todo_of(out, trajectories, append=True)
    skipped = len(trajectories) - len(todo)
    if skipped:
        logger.info(
            "%d of %d trajectories already judged in %s; judging %d",
            skipped,
            len(trajectories),
            verdicts_path,
            len(todo),
        )

    if todo:  # before any server starts or any call is paid
        check_endpoints(cfg, serve_scorer)
    cache = CallCache(cfg.cache or out / CACHE_FILE)
    ledger = UsageLedger()
    cluster = None
    engine_record = None
    done: list[Verdict] = []
    stop_error: RunStopError | None = None
    cut_answers: list[dict] = []
    try:
        if todo:  # the served scorer's log beside the run, not in /tmp
            with served_scorer(cfg, serve_scorer, str(out / "vllm.log"), checkpoint) as scorer_endpoint:
                if engine is not None:
                    cluster = connect(engine.address)
                    with VerdictWriter(verdicts_path) as writer:
                        recording = FirstVerdictRecord(writer, out, fingerprint, read_with)
                        judged = judge_on_ray(
                            cfg,
                            todo,
                            recording,
                            engine,
                            cluster.nodes,
                            cache_path=str(cfg.cache or out / CACHE_FILE),
                            scorer_endpoint=scorer_endpoint,
                            checkpoint=checkpoint,
                        )
                    done, stop_error, cut_answers = judged.done, judged.stop_error, judged.cut_answers
                    ledger = judged.ledger.local()
                    engine_record = {
                        **cluster.record(),
                        **judged.plan.record(),
                        **judged.ledger.record(),
                        "start_s": cluster.start_s,
                    }
                else:
                    judge = JudgeClient(cfg.judge, cache, ledger)
                    scorer = build_scorer(cfg, cache, ledger, scorer_endpoint, checkpoint)
                    webjudge = WebJudge(judge, scorer, cfg.pipeline)
                    with VerdictWriter(verdicts_path) as writer:
                        recording = FirstVerdictRecord(writer, out, fingerprint, read_with)
                        done = asyncio.run(
                            judge_all(webjudge, todo, recording, cfg.concurrency, progress=progress)
                        )
                    stop_error = webjudge.stop_error
                    cut_answers = webjudge.cut_report()
                if cluster is not None:  # before the served scorer stops, as the cluster used it
                    cluster.close()
                    cluster = None
    finally:
        if cluster is not None:
            cluster.close()
        cache.close()

    final = latest_verdicts(read_verdicts(verdicts_path))
    if final or stop_error is None:  # a finished run (a shard that owns nothing too) is of this protocol
        record_run(out, fingerprint, read_with)
    if engine_record is not None:
        record_engine(out, engine_record)
    summaries = write_agentlab_summaries(trajectories, final, fingerprint) if agentlab_summary else None
    summary = summarize(
        final,
        run={
            "found": inputs.found,
            "shard": str(shard) if shard else None,
            "shard_by": cfg.shard_by if shard else None,
            "owned": len(trajectories),
            "judged": len(done),
            "skipped": skipped,
            "not_reached": len(todo) - len(done),
            **input_figures(inputs.errors),
            "duplicates": inputs.duplicates,
            "resume_from_left_out": left_out,
            "seconds": time.perf_counter() - t0,
            "budget_stop": isinstance(stop_error, BudgetExceededError)
            or getattr(stop_error, "budget", False),
            "engine": engine_record,
            "stopped": str(stop_error) if stop_error else None,
            "exit_code": stop_error.exit_code if stop_error else None,
            "cut_answers": cut_answers,
            "ledger": ledger.as_dict(),
            "config": redact_config(config_to_dict(cfg)),
            **({"agentlab_summary": dataclasses.asdict(summaries)} if summaries else {}),
        },
    )
    summary["agreement"] = agreement_summary(final)  # with the truth the verdicts carry, named
    summary["markdown"] = write_summary(out, summary, ledger.table_if_used())
    return summary


def run_warnings(summary: dict) -> list[str]:
    """What the terminal says after the summary: a stop, cut answers, trajectories without a verdict."""
    run = summary["run"]
    lines = [f"stopped: {run['stopped']}"] if run.get("stopped") else []
    lines += cut_lines(run.get("cut_answers") or [])
    no_scores = summary.get("no_readable_scores", 0)
    if no_scores:
        lines.append(
            f"{count_of(no_scores, 'trajectory has', 'trajectories have')} no readable scores: "
            "no verdict (not counted as failures; "
            "summary.md says why); the next run judges them again"
        )
    failed = summary["incomplete"] - no_scores
    if failed and not run.get("stopped"):
        lines.append(
            f"{count_of(failed, 'trajectory', 'trajectories')} incomplete; re-run the same command to retry them"
        )
    if summary.get("judged_without_scores"):
        lines.append(judged_without_scores_line(summary["judged_without_scores"]))
    if images := unreadable_images_line(summary):
        lines.append(images)
    return lines
