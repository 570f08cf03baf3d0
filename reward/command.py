"""``keyshot reward``: rejection sampling and the reward service.

    keyshot reward filter runs/rollouts --config configs/reward/trl.yaml --min-reward 1 --out runs/accepted --link
    keyshot reward serve --config configs/reward/openrlhf.yaml --port 8100 --allow-root /data/rollouts

Both take any keyshot judge config (configs/reward/*.yaml add a reward: section) and overrides written
key=value after it, as every keyshot command does (judge.model=gpt-4o).

``filter`` judges every rollout under ROLLOUTS (any format ``keyshot judge`` reads) and writes
``OUT/rewards.jsonl`` (every rollout: id, agent, task, run, source, reward, progress, error) and
``OUT/accepted.jsonl`` (those with reward >= --min-reward); ``--link`` also links each accepted trajectory
folder into ``OUT/accepted/`` under the path it has below ROLLOUTS (AgentLab's
``<time>_<agent>_on_<task>`` names, Online-Mind2Web's ``<agent>/<task>`` folders), so that
``keyshot judge OUT/accepted`` reads each with its own agent, task and run. ``serve`` is the HTTP service
(docs/reward.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.config import split_paths_and_overrides
from keyshot.infer.common.errors import EXIT_INCOMPLETE, KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.judge.scorer_factory import (
    add_serve_scorer_argument,
    apply_serve_scorer,
    start_served_scorer,
)
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.reward.model import RewardModel, RewardResult, reward_config
from keyshot.reward.shared import require_number_on_failure

#: Entry-point group of ``keyshot reward``'s subcommands that live on other floors (``env``: keyshot.env.openenv),
#: each a :class:`~keyshot.infer.cli.Command`: this floor never imports them.
SUBCOMMANDS_GROUP = "keyshot.reward.commands"


class RewardCommandError(KeyshotError):
    """A ``keyshot reward`` run that cannot start."""


def read_rollouts(paths: list[str]) -> tuple[list[tuple[Trajectory, Path]], list[TrajectoryError]]:
    """Every rollout under ``paths``, each with the input path it was found under."""
    found: list[tuple[Trajectory, Path]] = []
    errors: list[TrajectoryError] = []
    for path in paths:
        found.extend((t, Path(path)) for t in load_trajectories(path, on_error="skip", errors=errors))
    return found, errors


def filter_record(t: Trajectory, r: RewardResult) -> dict:
    return {
        "id": t.uid,
        "agent": t.agent,
        "benchmark": t.benchmark,
        "task_id": t.task_id,
        "run": t.run,
        "source": str(t.source) if t.source else None,
        "reward": None if r.failed else r.reward,  # on_failure's stand-in value is no reward to filter by
        "progress": r.progress,
        "error": r.error,
        "kind": r.kind,
    }


def link_name(t: Trajectory, root: Path) -> Path:
    """Where ``t``'s folder is linked in ``OUT/accepted``: its path below the input it was found under
    (``<agent>/<task>`` of Online-Mind2Web, AgentLab's ``<time>_<agent>_on_<task>``), the names its
    identity is read from; its own name when the input was the folder itself."""
    source = Path(t.source)
    try:
        below = source.absolute().relative_to(root.absolute())
    except ValueError:
        below = Path(source.name)
    return below if below.parts and ".." not in below.parts else Path(source.name)


def link_accepted(out: Path, accepted: list[tuple[Trajectory, Path]]) -> list[str]:
    """Link each accepted trajectory's folder into ``OUT/accepted`` (:func:`link_name`); a JSONL line has no
    folder of its own: listed in the return, not linked."""
    folder = out / "accepted"
    folder.mkdir(parents=True, exist_ok=True)
    not_linked = []
    for t, root in accepted:
        if t.source is None or not Path(t.source).is_dir():
            not_linked.append(f"{t.uid}: its source {t.source} is not a folder (a JSONL line); not linked")
            continue
        link = folder / link_name(t, root)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.unlink(missing_ok=True)
        link.symlink_to(Path(t.source).resolve(), target_is_directory=True)
    return not_linked


def run_filter(args: argparse.Namespace) -> int:
    paths, overrides = split_paths_and_overrides(args.items)
    rm = RewardModel.from_config(args.config, *overrides)
    found, errors = read_rollouts(paths)
    trajectories = [t for t, _ in found]
    if not trajectories and not errors:
        raise RewardCommandError(f"no rollouts found in {', '.join(paths)}")
    try:
        results = rm.score_sync(trajectories)
    finally:
        rm.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [filter_record(t, r) for t, r in zip(trajectories, results, strict=True)]
    records += [
        {
            "id": None,
            "source": str(e.path),
            "reward": None,
            "progress": None,
            "error": f"input: {e}",
            "kind": "input",
        }
        for e in errors
    ]
    accepted = [
        (t, root)
        for (t, root), r in zip(found, results, strict=True)
        if not r.failed and r.reward is not None and r.reward >= args.min_reward
    ]
    lines = lambda rows: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # noqa: E731
    write_text_atomic(out / "rewards.jsonl", lines(records))
    write_text_atomic(
        out / "accepted.jsonl", lines([r for r in records if r["id"] in {t.uid for t, _ in accepted}])
    )
    not_linked = link_accepted(out, accepted) if args.link else []
    failed_calls = sum(r.failed and r.kind != "input" for r in results)
    failed = sum(r.failed for r in results) + len(errors)
    print(
        f"keyshot reward filter: {len(accepted)} of {len(records)} rollouts accepted (reward >= {args.min_reward:g}), "
        f"{failed} without a reward (see {out / 'rewards.jsonl'})"
    )
    for line in not_linked:
        print(f"  {line}")
    print(f"accepted: {out / 'accepted.jsonl'}")
    if args.link:
        print(f"linked: {out / 'accepted'} (keyshot judge {out / 'accepted'} --config ... reads them back)")
    if failed_calls:
        print(
            f"keyshot reward filter: {failed_calls} rollout(s) got no verdict because a call failed (their errors "
            "are in rewards.jsonl): they are neither accepted nor rejected; re-run when the endpoints are up",
            file=sys.stderr,
        )
        return EXIT_INCOMPLETE
    return 0


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise RewardCommandError(
            "keyshot reward serve needs fastapi and uvicorn: pip install 'keyshot[reward]'"
        ) from None
    from keyshot.reward.service import ServiceLimits, run_service

    allow_root = Path(args.allow_root)
    if not allow_root.is_dir():
        raise RewardCommandError(f"--allow-root {allow_root}: not a folder")
    cfg, settings = reward_config(args.config, *args.overrides, allow_root=str(allow_root.resolve()))
    # /get_reward answers OpenRLHF, which needs a number for every sample: refused before anything starts
    require_number_on_failure(settings, "the service's /get_reward (OpenRLHF's remote reward)", args.config)
    limits = ServiceLimits(
        allow_root=str(allow_root.resolve()),
        max_body_bytes=args.max_body_mb * 1024 * 1024,
        max_screenshots=args.max_screenshots,
        queue_size=args.queue_size,
        deadline_s=args.deadline_s,
        token_env=args.token_env,
    )
    server = None
    if args.serve_scorer:  # vLLM under the process guard: it ends with the service, even when killed
        apply_serve_scorer(cfg, args.serve_scorer)  # as keyshot judge takes it: a folder or a hub id
        print(
            f"keyshot reward serve: starting vLLM for {args.serve_scorer} (log: {args.vllm_log})", flush=True
        )
        server, endpoint = start_served_scorer(cfg, args.serve_scorer, args.vllm_log)
        # the model is built on the served endpoint (and reads the checkpoint's description from it)
        scorer = dataclasses.replace(cfg.scorer, endpoint=endpoint, endpoints=None)
        cfg = dataclasses.replace(cfg, scorer=scorer)
    try:
        run_service(RewardModel(cfg, settings), limits, args.host, args.port)
    finally:
        if server is not None:
            server.stop()
    return 0


def filter_arguments(f: argparse.ArgumentParser) -> None:
    f.add_argument(
        "items",
        nargs="+",
        metavar="ROLLOUTS [KEY=VALUE ...]",
        help="trajectory folders or JSONL files, and config overrides (judge.model=gpt-4o)",
    )
    f.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    f.add_argument("--min-reward", type=float, default=1.0)
    f.add_argument("--out", required=True, help="output folder")
    f.add_argument(
        "--link",
        action="store_true",
        help="link accepted trajectory folders into OUT/accepted/, named as below ROLLOUTS (judge them back there)",
    )


def serve_arguments(s: argparse.ArgumentParser) -> None:
    s.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides (judge.model=gpt-4o)")
    s.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100, help="0: a free port (the start-up line names it)")
    s.add_argument("--allow-root", default=".", help="screenshot and trajectory paths must lie inside it")
    s.add_argument("--token-env", help="require 'Authorization: Bearer $TOKEN_ENV' on every request")
    s.add_argument("--max-body-mb", type=int, default=256)
    s.add_argument("--max-screenshots", type=int, default=200, help="per rollout")
    s.add_argument("--queue-size", type=int, default=64, help="requests admitted at once (others: 429)")
    s.add_argument("--deadline-s", type=float, default=600.0, help="per request (504 past it)")
    add_serve_scorer_argument(s, "and score with it while the service runs")
    s.add_argument("--vllm-log", default="vllm.log", help="the vLLM server's log with --serve-scorer")


COMMAND = Command(
    "reward",
    help="keyshot as a reward model: rejection sampling (filter) and the HTTP service (serve)",
    description=__doc__,
    subcommands=(
        Command(
            "filter",
            help="judge rollouts, keep those with reward >= --min-reward",
            description=__doc__,
            arguments=filter_arguments,
            run=run_filter,
        ),
        Command(
            "serve",
            help="the reward service (FastAPI/uvicorn)",
            description=__doc__,
            arguments=serve_arguments,
            run=run_serve,
            # a signal ends the service once the requests in flight are answered: there is nothing to resume
            on_stop="the service answered the requests in flight and stopped",
        ),
    ),
    plugins=SUBCOMMANDS_GROUP,
)
