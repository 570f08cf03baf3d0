"""``keyshot reward filter`` and ``keyshot reward serve``: rejection sampling and the reward service (the
``keyshot reward`` group that holds them, with ``env``, is :mod:`keyshot.frameworks.command`).

    keyshot reward filter runs/rollouts --config configs/reward/trl.yaml --min-reward 1 --out runs/accepted --link
    keyshot reward serve --config configs/reward/openrlhf.yaml --port 8100 --allow-root /data/rollouts

Both take any keyshot judge config (configs/reward/*.yaml add a reward: section) and overrides written
key=value after it, as every keyshot command does (judge.model=gpt-4o).

``filter`` judges every rollout under ROLLOUTS (any format ``keyshot judge`` reads) and writes
``OUT/rewards.jsonl`` (every rollout: id, agent, benchmark, task_id, run, source, reward, progress, error,
kind) and ``OUT/accepted.jsonl`` (those with reward >= --min-reward); ``--link`` also links each accepted
trajectory folder into ``OUT/accepted/`` under the path it has below ROLLOUTS (AgentLab's
``<time>_<agent>_on_<task>`` names, Online-Mind2Web's ``<agent>/<task>`` folders), so that
``keyshot judge OUT/accepted`` reads each with its own agent, task and run. ``serve`` is the HTTP service
(docs/reward.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.config import split_paths_and_overrides
from keyshot.infer.common.errors import EXIT_INCOMPLETE, KeyshotError
from keyshot.infer.engines.ray_engine import add_engine_arguments, engine_options
from keyshot.infer.judge.run import check_endpoints
from keyshot.infer.judge.scorer_factory import (
    add_serve_scorer_argument,
    apply_serve_scorer,
    served_scorer,
)
from keyshot.reward.model import RewardModel, reward_config
from keyshot.reward.rollout_filter import ACCEPTED_DIR, ACCEPTED_FILE, REWARDS_FILE, filter_rollouts
from keyshot.reward.service import ServiceLimits
from keyshot.reward.shared import require_number_on_failure

#: Entry-point group of ``keyshot reward``'s subcommands that live on other floors (``env``: keyshot.frameworks.openenv),
#: each a :class:`~keyshot.infer.cli.Command`: this floor never imports them.
SUBCOMMANDS_GROUP = "keyshot.reward.commands"


class RewardCommandError(KeyshotError):
    """A ``keyshot reward`` run that cannot start."""


def run_filter(args: argparse.Namespace) -> int:
    paths, overrides = split_paths_and_overrides(args.items)
    result = filter_rollouts(
        args.config,
        overrides,
        paths,
        args.out,
        min_reward=args.min_reward,
        link=args.link,
        engine=engine_options(args),
    )
    out = result.out
    print(
        f"keyshot reward filter: {result.accepted} of {len(result.records)} rollouts accepted (reward >= "
        f"{args.min_reward:g}), {result.failed} without a reward (see {out / REWARDS_FILE})"
    )
    for line in result.not_linked:
        print(f"  {line}")
    print(f"accepted: {out / ACCEPTED_FILE}")
    if args.link:
        print(
            f"linked: {out / ACCEPTED_DIR} (keyshot judge {out / ACCEPTED_DIR} --config ... reads them back)"
        )
    if result.failed_calls:
        print(
            f"keyshot reward filter: {result.failed_calls} rollout(s) got no verdict because a call failed (their "
            "errors are in rewards.jsonl): they are neither accepted nor rejected; re-run when the endpoints are up",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return 0


#: ``keyshot reward serve``'s options for :class:`~keyshot.reward.service.ServiceLimits`: (option, field,
#: the field's units in one of the option's, help); each default is the field's
LIMIT_OPTIONS = (
    ("--allow-root", "allow_root", None, "screenshot and trajectory paths must lie inside it"),
    ("--token-env", "token_env", None, "require 'Authorization: Bearer $TOKEN_ENV' on every request"),
    ("--max-body-mb", "max_body_bytes", 1024 * 1024, "the largest request body, in MiB"),
    ("--max-screenshots", "max_screenshots", None, "per rollout"),
    ("--queue-size", "queue_size", None, "requests admitted at once (others: 429)"),
    ("--deadline-s", "deadline_s", None, "per request (504 past it)"),
)


def limit_arguments(s: argparse.ArgumentParser) -> None:
    """The service's limits as options, their defaults :class:`ServiceLimits`' own."""
    defaults = ServiceLimits()
    for option, name, unit, text in LIMIT_OPTIONS:
        default = getattr(defaults, name)
        if unit is not None:
            default //= unit
        kind = str if default is None else type(default)
        s.add_argument(option, type=kind, default=default, help=f"{text} (default: %(default)s)")


def service_limits(args: argparse.Namespace) -> ServiceLimits:
    """The :class:`ServiceLimits` the options ask for (the others at their defaults); the allowed root,
    which must be a folder, resolved."""
    given = {}
    for option, name, unit, _ in LIMIT_OPTIONS:
        value = getattr(args, option[2:].replace("-", "_"))
        given[name] = value if unit is None else value * unit
    allow_root = Path(given["allow_root"])
    if not allow_root.is_dir():
        raise RewardCommandError(f"--allow-root {allow_root}: not a folder")
    return ServiceLimits(**{**given, "allow_root": str(allow_root.resolve())})


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise RewardCommandError(
            "keyshot reward serve needs fastapi and uvicorn: pip install 'keyshot[reward]'"
        ) from None
    from keyshot.reward.service import run_service

    limits = service_limits(args)
    cfg, settings = reward_config(args.config, *args.overrides, allow_root=limits.allow_root)
    # /get_reward answers OpenRLHF, which needs a number for every sample: refused before anything starts
    require_number_on_failure(settings, "the service's /get_reward (OpenRLHF's remote reward)", args.config)
    if args.serve_scorer:  # vLLM under the process guard: it ends with the service, even when killed
        apply_serve_scorer(cfg, args.serve_scorer)  # as keyshot judge takes it: a folder or a hub id
        print(
            f"keyshot reward serve: starting vLLM for {args.serve_scorer} (log: {args.vllm_log})", flush=True
        )
    with served_scorer(cfg, args.serve_scorer, args.vllm_log) as endpoint:
        if endpoint is not None:  # the model is built on the served endpoint (its description read from it)
            cfg = dataclasses.replace(
                cfg, scorer=dataclasses.replace(cfg.scorer, endpoint=endpoint, endpoints=None)
            )
        check_endpoints(cfg, None)  # as keyshot judge: a judge or scorer that is down, exit 6 at start
        run_service(RewardModel(cfg, settings), limits, args.host, args.port)
    return 0


def filter_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument(
        "items",
        nargs="+",
        metavar="ROLLOUTS [KEY=VALUE ...]",
        help="trajectory folders or JSONL files, and config overrides (judge.model=gpt-4o)",
    )
    f.add_argument(
        "--config",
        required=True,
        help="a keyshot judge config (configs/reward/*.yaml, or one by name: reward/local)",
    )
    f.add_argument(
        "--min-reward", type=float, default=1.0, help="keep the rollouts whose reward is at least this"
    )
    f.add_argument("--out", required=True, help="output folder")
    f.add_argument(
        "--link",
        action="store_true",
        help="link accepted trajectory folders into OUT/accepted/, named as below ROLLOUTS (judge them back there)",
    )
    add_engine_arguments(f)


def serve_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (judge.model=gpt-4o)")
    s.add_argument(
        "--config",
        required=True,
        help="a keyshot judge config (configs/reward/*.yaml, or one by name: reward/local)",
    )
    s.add_argument("--host", default="127.0.0.1", help="the address to listen on")
    s.add_argument("--port", type=int, default=8100, help="0: a free port (the start-up line names it)")
    limit_arguments(s)
    add_serve_scorer_argument(s, "and score with it while the service runs")
    s.add_argument("--vllm-log", default="vllm.log", help="the vLLM server's log with --serve-scorer")


#: ``keyshot reward filter``
FILTER = Command(
    "filter",
    help="judge rollouts, keep those with reward >= --min-reward",
    description=__doc__,
    arguments=filter_arguments,
    run=run_filter,
    overrides="items",
)
#: ``keyshot reward serve``
SERVE = Command(
    "serve",
    help="the reward service (FastAPI/uvicorn)",
    description=__doc__,
    arguments=serve_arguments,
    run=run_serve,
    overrides="overrides",
    # a signal ends the service once the requests in flight are answered: there is nothing to resume
    on_stop="the service answered the requests in flight and stopped",
)
