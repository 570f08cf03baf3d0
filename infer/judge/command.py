"""``keyshot judge``: WebJudge over trajectory folders, resumable, with a cost summary.

    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml out=runs/seeact
    keyshot judge runs/agentlab --config configs/judge/reference_gpt4o.yaml judge.budget_usd=20
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --serve-scorer osunlp/WebJudge-7B
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --serve-scorer runs/sft/final
    keyshot judge data/om2w/SeeAct --config configs/judge/reference_gpt4o.yaml \\
        --resume-from SeeAct/WebJudge_Online_Mind2Web_eval_gpt-4o_score_threshold_3_auto_eval_results.json
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --dry-run   # what and what cost; no call
    keyshot judge ~/agentlab_results/STUDY --config configs/judge/reference_gpt4o.yaml --agentlab-summary
    keyshot judge data/om2w/SeeAct --config configs/judge/webjudge7b.yaml --engine ray --ray-address auto

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
import logging
import sys
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.config import load_config, split_paths_and_overrides
from keyshot.infer.common.errors import EXIT_USAGE, KeyshotError
from keyshot.infer.engines.ray_engine import add_engine_arguments, engine_options
from keyshot.infer.judge.agentlab_summary import report_lines
from keyshot.infer.judge.config import JudgeRunConfig, JudgeRunError
from keyshot.infer.judge.run import check_endpoints, dry_run, run_folder, run_judge, run_warnings
from keyshot.infer.judge.scorer_factory import (
    add_scorer_url_argument,
    add_serve_scorer_argument,
    scorer_served_at,
)
from keyshot.infer.protocol.verdicts import VERDICTS_FILE
from keyshot.infer.runs.lock import RunLock
from keyshot.infer.runs.shards import ShardSpec
from keyshot.infer.runs.summary import exit_code

logger = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "items",
        nargs="*",
        metavar="TRAJ_PATH|key=value",
        help="trajectory folders/files, then config overrides",
    )
    p.add_argument(
        "--config", help="YAML JudgeRunConfig: a file, or a shipped one by name (webjudge7b, judge/tiny_cpu)"
    )
    p.add_argument("--out", help="output folder (same as out=...)")
    p.add_argument(
        "--resume-from", help="reference implementation output (JSONL / ARB records) to import first"
    )
    add_serve_scorer_argument(p, "for the run (its log: OUT/vllm.log)")
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
    add_scorer_url_argument(p)
    add_engine_arguments(p)
    p.add_argument(
        "--allow-outside",
        action="append",
        default=[],
        metavar="DIR",
        help="also read screenshots that trajectory files reference inside DIR (default: only inside the "
        "input paths)",
    )


def run(args: argparse.Namespace) -> int:
    paths, overrides = split_paths_and_overrides(args.items)
    if args.out:
        overrides.append(f"out={args.out}")
    if args.allow_partial:
        overrides.append("pipeline.allow_partial=true")
    if args.agent:
        overrides.append(f"agent={args.agent}")
    if not paths:
        raise JudgeRunError("no trajectory path given")
    shard = ShardSpec.parse(args.shard) if args.shard else None
    engine = engine_options(args)
    if args.scorer_url and args.serve_scorer:
        raise JudgeRunError(
            "--scorer-url and --serve-scorer: give one (where the scorer is, or what to serve)"
        )
    cfg = scorer_served_at(load_config(JudgeRunConfig, args.config, overrides), args.scorer_url)
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
        engine=engine,
    )
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


class EndpointsNotReady(KeyshotError):
    """A dry run's last step found an endpoint not ready: the preflight's line and exit code."""

    def __init__(self, cause: KeyshotError):
        self.exit_code = cause.exit_code
        super().__init__(
            f"dry run: the inputs above are checked; the endpoints are not ready: {cause} "
            "(no key yet? README, 'No API key yet?')"
        )


def check_endpoints_after_plan(cfg: JudgeRunConfig, serve_scorer: str | None) -> int:
    """The dry run's last step: every endpoint's preflight, its exit code when one fails."""
    try:
        check_endpoints(cfg, serve_scorer)
    except KeyshotError as exc:
        raise EndpointsNotReady(exc) from exc
    print("endpoints reachable, keys accepted, models served; nothing was called")
    return 0


COMMAND = Command(
    "judge",
    help="run WebJudge over trajectories (resumable; verdicts.jsonl + summary)",
    description=__doc__,
    arguments=add_arguments,
    run=run,
    overrides="items",
)
