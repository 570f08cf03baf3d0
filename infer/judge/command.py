"""``keyshot judge``: WebJudge over trajectory folders, resumable, with a cost summary.

    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml out=runs/seeact
    keyshot judge runs/agentlab --config configs/judge/reference_gpt4o.yaml judge.budget_usd=20
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --serve-scorer osunlp/WebJudge-7B
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --serve-scorer runs/sft/final
    keyshot judge data/om2w/SeeAct --config configs/judge/reference_gpt4o.yaml \\
        --resume-from SeeAct/WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --dry-run   # what and what cost; no call
    keyshot judge ~/agentlab_results/STUDY --config configs/judge/reference_gpt4o.yaml --agentlab-summary

Writes ``OUT/verdicts.jsonl`` (one line per trajectory, appended atomically), ``OUT/summary.md`` and
``OUT/summary.json``, and keeps every judge/scorer answer in ``OUT/calls.sqlite``. Re-running the same
command after any stop (Ctrl-C, ``kill -9``, a budget stop) judges only what is missing and pays for
no call twice. API keys are read from the environment variables the config names, never printed.
A reward config (``configs/reward/*.yaml``) judges too: its ``reward:`` section holds the reward model's
options (docs/reward.md), which change no verdict; keyshot judge ignores it.
``OUT/run.json`` records the protocol with the first verdict (a run that stopped before judging leaves
a folder any config may use); an OUT holding verdicts of other trajectories is refused unless ``--append``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import sys
import time
from pathlib import Path

from tqdm import tqdm

from keyshot.infer.client.cache import CallCache
from keyshot.infer.client.judge_client import JudgeClient
from keyshot.infer.client.preflight import preflight
from keyshot.infer.client.usage import BudgetExceededError, UsageLedger
from keyshot.infer.common.config import config_to_dict, load_config, split_paths_and_overrides
from keyshot.infer.common.errors import (
    EXIT_USAGE,
    KeyshotError,
    RunStopError,
    require_training_stack,
)
from keyshot.infer.common.helptext import plain
from keyshot.infer.common.redaction import redact_config
from keyshot.infer.common.text import count_of
from keyshot.infer.judge.agentlab_summary import report_lines, write_agentlab_summaries
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.judge.estimate import ANSWER_TOKENS, estimate_run, estimate_table
from keyshot.infer.judge.fingerprint import protocol_fingerprint
from keyshot.infer.judge.inputs import (
    Inputs,
    import_reference_verdicts,
    load_all,
    nothing_found_message,
    other_inputs_message,
)
from keyshot.infer.judge.pipeline import WebJudge
from keyshot.infer.judge.scorer_factory import (
    build_scorer,
    describe_scorer,
    scorer_max_tokens,
    scorer_policy,
    start_served_scorer,
    warn_default_policy,
)
from keyshot.infer.loaders.trajectory import Trajectory
from keyshot.infer.model.checkpoint import CheckpointDescription, looks_like_local_path, model_folder_problem
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
from keyshot.infer.runs.run_record import RunFolderError, check_fingerprint
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.summary import (
    SUMMARY_FILE,
    cut_lines,
    exit_code,
    input_figures,
    judged_without_scores_line,
    summarize,
    unreadable_images_line,
    write_summary,
)
from keyshot.infer.serve.command import VLLMServer
from keyshot.infer.serve.plan import check_prompt_version

logger = logging.getLogger(__name__)

CACHE_FILE = "calls.sqlite"


# ---------------------------------------------------------------------------- the run
async def judge_all(
    webjudge: WebJudge,
    trajectories: list[Trajectory],
    writer: VerdictWriter | FirstVerdictRecord,
    concurrency: int,
    *,
    progress: bool = True,
) -> list[Verdict]:
    """Judge ``trajectories`` (at most ``concurrency`` at once), appending each verdict as it is done.

    Stops starting new trajectories once an endpoint's budget is spent, an endpoint is down or the first
    answers under a token limit were all cut (they are judged on resume).
    """
    slots = asyncio.Semaphore(max(1, concurrency))
    done: list[Verdict] = []
    bar = tqdm(total=len(trajectories), desc="judging", unit="traj", disable=not progress)
    stop = asyncio.Event()

    async def one(t: Trajectory) -> None:
        async with slots:
            if stop.is_set():
                return
            try:
                verdict = await webjudge.judge(t)
            except RunStopError as exc:
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
    if cfg.scorer.backend != "none" and cfg.scorer.max_tokens is not None:
        scorer_max_tokens(cfg.scorer, cfg.scorer.max_tokens, checkpoint)


class FirstVerdictRecord:
    """A verdict writer that records the run folder's protocol (``run.json``) with its first verdict, so
    a run that stops before judging (an endpoint down at preflight) leaves a folder any config may use."""

    def __init__(self, writer: VerdictWriter, out: Path, fingerprint: dict):
        self.writer, self.out, self.fingerprint = writer, out, fingerprint
        self.recorded = False

    def append(self, verdict: Verdict) -> None:
        if not self.recorded:
            check_fingerprint(self.out, self.fingerprint)  # writes run.json, or finds it the same
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
        cfg.scorer.checkpoint = cfg.scorer.checkpoint or serve_scorer
    checkpoint = describe_scorer(cfg.scorer) if cfg.scorer.backend != "none" else None
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
        if looks_like_local_path(folder) and (problem := model_folder_problem(folder)):
            raise JudgeRunError(
                f"{folder}: not a model checkpoint ({problem}); pass the folder a training run wrote (RUN/final)"
            )
    inputs, fingerprint, checkpoint = _inputs_and_protocol(paths, cfg, serve_scorer, allow_outside, shard)
    if cfg.scorer.backend != "none":
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
    if cfg.scorer.backend == "none":
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
) -> dict:
    """The whole ``keyshot judge`` run; returns the summary (also written to OUT, or with ``shard`` to
    ``OUT/shard-I-of-N``: join the shards with ``keyshot merge OUT``). An OUT holding verdicts of other
    trajectories is refused unless ``append``. ``agentlab_summary``: each AgentLab run's verdict also goes
    into its summary_info.json (:mod:`keyshot.infer.judge.agentlab_summary`)."""
    t0 = time.perf_counter()
    out = run_folder(cfg, shard)
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
) -> dict:
    trajectories = inputs.trajectories
    verdicts_path = out / VERDICTS_FILE
    if verdicts_path.exists():  # cut a half-written last line now, even when nothing is left to judge
        VerdictWriter(verdicts_path).close()
    todo_of(out, trajectories, append=append)  # refuses other inputs' folder before anything is written
    left_out = 0
    if resume_from:
        imported, left_out = import_reference_verdicts(
            resume_from, verdicts_path, cfg.pipeline.threshold, trajectories
        )
        if imported:
            check_fingerprint(out, fingerprint)
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
    server: VLLMServer | None = None
    done: list[Verdict] = []
    stop_error: RunStopError | None = None
    cut_answers: list[dict] = []
    try:
        scorer_endpoint = None
        if serve_scorer and todo:  # the server's log beside the run, not in /tmp
            server, scorer_endpoint = start_served_scorer(
                cfg, serve_scorer, str(out / "vllm.log"), checkpoint
            )
        if todo:
            judge = JudgeClient(cfg.judge, cache, ledger)
            scorer = build_scorer(cfg, cache, ledger, scorer_endpoint, checkpoint)
            webjudge = WebJudge(judge, scorer, cfg.pipeline)
            with VerdictWriter(verdicts_path) as writer:
                recording = FirstVerdictRecord(writer, out, fingerprint)
                done = asyncio.run(judge_all(webjudge, todo, recording, cfg.concurrency, progress=progress))
            stop_error = webjudge.stop_error
            cut_answers = webjudge.cut_report()
    finally:
        if server is not None:
            server.stop()
        cache.close()

    final = latest_verdicts(read_verdicts(verdicts_path))
    if final or stop_error is None:  # a finished run (a shard that owns nothing too) is of this protocol
        check_fingerprint(out, fingerprint)
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
            "budget_stop": isinstance(stop_error, BudgetExceededError),
            "stopped": str(stop_error) if stop_error else None,
            "exit_code": stop_error.exit_code if stop_error else None,
            "cut_answers": cut_answers,
            "ledger": ledger.as_dict(),
            "config": redact_config(config_to_dict(cfg)),
            **({"agentlab_summary": dataclasses.asdict(summaries)} if summaries else {}),
        },
    )
    summary["markdown"] = write_summary(out, summary, ledger.table_if_used())
    return summary


# ---------------------------------------------------------------------------- CLI
def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "judge",
        help="run WebJudge over trajectories (resumable; verdicts.jsonl + summary)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "items",
        nargs="*",
        metavar="TRAJ_PATH|key=value",
        help="trajectory folders/files, then config overrides",
    )
    p.add_argument("--config", help="YAML JudgeRunConfig (configs/judge/*.yaml)")
    p.add_argument("--out", help="output folder (same as out=...)")
    p.add_argument(
        "--resume-from", help="reference implementation output (JSONL / ARB records) to import first"
    )
    p.add_argument(
        "--serve-scorer",
        metavar="CHECKPOINT",
        help="start vLLM for this checkpoint (a folder, or a hub id such as osunlp/WebJudge-7B) for the run",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--agent",
        help="the agent's name for trajectories that do not record one (one agent's Online-Mind2Web folder)",
    )
    p.add_argument(
        "--allow-partial",
        action="store_true",
        help="judge a trajectory even when some screenshot calls failed (counted as score 0, as the "
        "reference does; recorded in each verdict) instead of marking it incomplete",
    )
    p.add_argument("--wait", action="store_true", help="wait for another process writing in --out")
    p.add_argument(
        "--append",
        action="store_true",
        help="add these trajectories' verdicts to an --out that holds verdicts of other trajectories "
        "(refused without it, naming how many of each)",
    )
    p.add_argument(
        "--shard",
        metavar="I/N",
        help="judge only shard I of N (0-based; by a stable hash of the task id, or of the whole identity "
        "with shard_by=trajectory) into OUT/shard-I-of-N; join them with keyshot merge OUT",
    )
    p.add_argument(
        "--report", action="store_true", help="build the HTML report (keyshot report OUT) at the end"
    )
    p.add_argument(
        "--agentlab-summary",
        action="store_true",
        help="also put each AgentLab run's verdict into its summary_info.json (keyshot_success, "
        "keyshot_p_success, keyshot_protocol), where AgentLab's result table and agent-xray show it",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="load every trajectory, say what would be judged and why not the rest, estimate calls, tokens "
        "and cost, then check every endpoint (its exit code when one fails); call no model",
    )
    p.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="also read screenshots that trajectory files reference inside DIR (default: only inside the "
        "input paths)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    paths, overrides = split_paths_and_overrides(args.items)
    if args.out:
        overrides.append(f"out={args.out}")
    if args.allow_partial:
        overrides.append("pipeline.allow_partial=true")
    if args.agent:
        overrides.append(f"agent={args.agent}")
    try:
        if not paths:
            raise JudgeRunError("no trajectory path given")
        shard = ShardSpec.parse(args.shard) if args.shard else None
        cfg = load_config(JudgeRunConfig, args.config, overrides)
        if cfg.reward is not None:
            logger.info(
                "the config's reward: section holds the reward model's options (docs/reward.md); "
                "keyshot judge does not use them"
            )
        if args.dry_run:
            plan = dry_run(
                paths,
                cfg,
                serve_scorer=args.serve_scorer,
                allow_outside=tuple(args.allow_outside),
                shard=shard,
                append=args.append,
            )
            print(plan, flush=True)
            if args.agentlab_summary:
                print("--agentlab-summary: a dry run writes no summary_info.json")
            return check_endpoints_after_plan(cfg, args.serve_scorer)
        summary = run_judge(
            paths,
            cfg,
            resume_from=args.resume_from,
            serve_scorer=args.serve_scorer,
            progress=not args.no_progress,
            wait=args.wait,
            allow_outside=tuple(args.allow_outside),
            shard=shard,
            append=args.append,
            agentlab_summary=args.agentlab_summary,
        )
    except KeyshotError as exc:
        print(f"keyshot judge: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # a value checked where it is used (not every check has a KeyshotError yet)
        print(f"keyshot judge: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(summary["markdown"])
    print(f"verdicts: {run_folder(cfg, shard) / VERDICTS_FILE}")
    if shard:
        report = " && keyshot report " + cfg.out if args.report else ""
        print(f"when every shard is done: keyshot merge {cfg.out}{report}")
    elif args.report:
        from keyshot.infer.report import build_report

        with RunLock(Path(cfg.out) / "report", what="keyshot judge --report"):
            index = build_report(Path(cfg.out), Path(cfg.out) / "report", progress=not args.no_progress)
        print(f"report: {index}")
    else:
        print(f"browse it: keyshot report {cfg.out}")
    written, unwritten = (
        report_lines(summary["run"]["agentlab_summary"]) if args.agentlab_summary else ([], [])
    )
    for line in written:
        print(line)
    for line in run_warnings(summary) + unwritten:
        print(f"keyshot judge: {line}", file=sys.stderr)
    return exit_code(summary) or (EXIT_USAGE if unwritten else 0)


def check_endpoints_after_plan(cfg: JudgeRunConfig, serve_scorer: str | None) -> int:
    """The dry run's last step: every endpoint's preflight, its exit code when one fails."""
    try:
        check_endpoints(cfg, serve_scorer)
    except KeyshotError as exc:
        print(
            f"keyshot judge: dry run: the inputs above are checked; the endpoints are not ready: {exc} "
            "(no key yet? README, 'No API key yet?')",
            file=sys.stderr,
        )
        return exc.exit_code
    print("endpoints reachable, keys accepted, models served; nothing was called")
    return 0


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
