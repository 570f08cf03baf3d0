"""``keyshot reward``: rejection sampling and the reward service.

    keyshot reward filter runs/rollouts --config configs/reward/filter.yaml --min-reward 1 --out accepted/
    keyshot reward serve --config configs/reward/openrlhf.yaml --port 8100 --allow-root /data/rollouts

``filter`` judges every rollout under ROLLOUTS (any format ``keyshot judge`` reads) and writes
``OUT/rewards.jsonl`` (every rollout: id, source, reward, progress, error) and ``OUT/accepted.jsonl``
(those with reward >= --min-reward); ``--link`` also symlinks each accepted trajectory folder into
``OUT/accepted/``. ``serve`` is the HTTP service (docs/reward.md).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from keyshot.infer.common.errors import EXIT_USAGE, KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.common.helptext import plain
from keyshot.infer.judge.scorer_factory import start_served_scorer
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.loaders.trajectory import Trajectory, TrajectoryError
from keyshot.infer.model.checkpoint import model_folder_problem
from keyshot.infer.reward.model import RewardModel, RewardResult


class RewardCommandError(KeyshotError):
    """A ``keyshot reward`` run that cannot start."""


def read_rollouts(paths: list[str]) -> tuple[list[Trajectory], list[TrajectoryError]]:
    trajectories: list[Trajectory] = []
    errors: list[TrajectoryError] = []
    for path in paths:
        trajectories.extend(load_trajectories(path, on_error="skip", errors=errors))
    return trajectories, errors


def filter_record(t: Trajectory, r: RewardResult) -> dict:
    return {
        "id": t.uid,
        "task_id": t.task_id,
        "source": str(t.source) if t.source else None,
        "reward": r.reward,
        "progress": r.progress,
        "error": r.error,
    }


def link_accepted(out: Path, accepted: list[Trajectory]) -> list[str]:
    """Symlink each accepted trajectory's folder (a JSONL line has none: listed in the return)."""
    folder = out / "accepted"
    folder.mkdir(parents=True, exist_ok=True)
    not_linked = []
    for t in accepted:
        if t.source is None or not Path(t.source).is_dir():
            not_linked.append(f"{t.uid}: its source {t.source} is not a folder (a JSONL line); not linked")
            continue
        link = folder / re.sub(r"[^\w.@-]+", "_", t.uid)
        link.unlink(missing_ok=True)
        link.symlink_to(Path(t.source).resolve(), target_is_directory=True)
    return not_linked


def run_filter(args: argparse.Namespace) -> int:
    rm = RewardModel.from_config(args.config, *args.overrides)
    trajectories, errors = read_rollouts(args.rollouts)
    if not trajectories and not errors:
        raise RewardCommandError(f"no rollouts found in {', '.join(args.rollouts)}")
    try:
        results = rm.score_sync(trajectories)
    finally:
        rm.close()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records = [filter_record(t, r) for t, r in zip(trajectories, results, strict=True)]
    records += [
        {"id": None, "source": str(e.path), "reward": None, "progress": None, "error": f"input: {e}"}
        for e in errors
    ]
    accepted = [
        t
        for t, r in zip(trajectories, results, strict=True)
        if r.reward is not None and r.reward >= args.min_reward
    ]
    lines = lambda rows: "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)  # noqa: E731
    write_text_atomic(out / "rewards.jsonl", lines(records))
    write_text_atomic(
        out / "accepted.jsonl", lines([r for r in records if r["id"] in {t.uid for t in accepted}])
    )
    not_linked = link_accepted(out, accepted) if args.link else []
    failed = sum(r.reward is None for r in results) + len(errors)
    print(
        f"keyshot reward filter: {len(accepted)} of {len(records)} rollouts accepted (reward >= {args.min_reward:g}), "
        f"{failed} without a reward (see {out / 'rewards.jsonl'})"
    )
    for line in not_linked:
        print(f"  {line}")
    print(f"accepted: {out / 'accepted.jsonl'}")
    return 0


def run_serve(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise RewardCommandError(
            "keyshot reward serve needs fastapi and uvicorn: pip install 'keyshot[reward]'"
        ) from None
    from keyshot.infer.reward.service import ServiceLimits, run_service

    allow_root = Path(args.allow_root)
    if not allow_root.is_dir():
        raise RewardCommandError(f"--allow-root {allow_root}: not a folder")
    rm = RewardModel.from_config(args.config, *args.overrides, allow_root=str(allow_root.resolve()))
    server = None
    if args.serve_scorer:  # vLLM under the process guard: it ends with the service, even when killed
        if problem := model_folder_problem(args.serve_scorer):
            raise RewardCommandError(
                f"--serve-scorer {args.serve_scorer}: not a model checkpoint ({problem})"
            )
        rm.cfg.scorer.checkpoint = rm.cfg.scorer.checkpoint or args.serve_scorer
        print(
            f"keyshot reward serve: starting vLLM for {args.serve_scorer} (log: {args.vllm_log})", flush=True
        )
        server, rm.cfg.scorer.endpoint = start_served_scorer(rm.cfg, args.serve_scorer, args.vllm_log)
    limits = ServiceLimits(
        allow_root=str(allow_root.resolve()),
        max_body_bytes=args.max_body_mb * 1024 * 1024,
        max_screenshots=args.max_screenshots,
        queue_size=args.queue_size,
        deadline_s=args.deadline_s,
        token_env=args.token_env,
    )
    try:
        run_service(rm, limits, args.host, args.port)
    finally:
        if server is not None:
            server.stop()
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "reward",
        help="keyshot as a reward model: rejection sampling (filter) and the HTTP service (serve)",
        description=plain(__doc__),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="reward_command", required=True)
    f = sub.add_parser("filter", help="judge rollouts, keep those with reward >= --min-reward")
    f.add_argument("rollouts", nargs="+", metavar="ROLLOUTS", help="trajectory folders or JSONL files")
    f.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    f.add_argument("--min-reward", type=float, default=1.0)
    f.add_argument("--out", required=True, help="output folder")
    f.add_argument(
        "--link", action="store_true", help="symlink accepted trajectory folders into OUT/accepted/"
    )
    f.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    f.set_defaults(func=run)
    s = sub.add_parser("serve", help="the reward service (FastAPI/uvicorn)")
    s.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8100)
    s.add_argument("--allow-root", default=".", help="screenshot and trajectory paths must lie inside it")
    s.add_argument("--token-env", help="require 'Authorization: Bearer $TOKEN_ENV' on every request")
    s.add_argument("--max-body-mb", type=int, default=256)
    s.add_argument("--max-screenshots", type=int, default=200, help="per rollout")
    s.add_argument("--queue-size", type=int, default=64, help="requests admitted at once (others: 429)")
    s.add_argument("--deadline-s", type=float, default=600.0, help="per request (504 past it)")
    s.add_argument(
        "--serve-scorer",
        metavar="CHECKPOINT",
        help="serve this scorer checkpoint with vLLM (scorer.serve settings) and score with it",
    )
    s.add_argument("--vllm-log", default="vllm.log", help="the vLLM server's log with --serve-scorer")
    s.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="config override"
    )
    s.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        return run_filter(args) if args.reward_command == "filter" else run_serve(args)
    except KeyshotError as exc:
        print(f"keyshot reward: {exc}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:
        print(f"keyshot reward: {exc}", file=sys.stderr)
        return EXIT_USAGE
