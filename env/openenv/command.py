"""``keyshot reward env``: live MiniWoB pages served by OpenEnv's own server, scored by keyshot's reward.

    keyshot reward env --miniwob click-test --config configs/reward/trl.yaml --port 8000 --max-steps 10

OpenEnv's clients (``GenericEnvClient``, the ``BrowserGymEnv`` client of TRL's OpenEnv examples) connect
to ``http://HOST:PORT`` over a WebSocket; each session holds a browser of the server's pool from its first
reset to its end (at most ``--max-sessions`` at once, within the machine's budget: ``--max-browsers``);
the first is opened before the server listens, and a session's browser serves the next session after it.
Actions are BrowserGym's (``{"action_str": "click('13')"}``); each observation is OpenEnv's BrowserGym
format. The last step of an episode (MiniWoB ended it, or ``--max-steps`` actions) carries keyshot's reward
(None when no verdict could be had: ``metadata.keyshot_error`` says why), MiniWoB's own reward beside it
(``metadata.miniwob_reward``). Sessions ending together are judged as one batch, with one key-point call
per task. ``--keep DIR`` keeps every scored episode there (``keyshot judge DIR`` reads it). SIGTERM or
Ctrl-C closes every browser the server opened. Runs where OpenEnv is installed: make setup-openenv, then
``.venv-openenv/bin/keyshot reward env ...``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import socket
import sys
from importlib.metadata import entry_points
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import KeyshotError

#: Entry-point group of the OpenEnv rubrics an environment is scored with, by name (pyproject.toml).
RUBRICS_GROUP = "keyshot.openenv.rubrics"
RUBRIC = "keyshot"
OPENENV_SETUP = (
    "keyshot reward env needs OpenEnv, in a venv of its own: make setup-openenv (tools/setup_openenv.sh) builds "
    ".venv-openenv; then run .venv-openenv/bin/keyshot reward env ..."
)


class EnvCommandError(KeyshotError):
    """``keyshot reward env`` cannot start."""


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def rubric_factory(name: str, **options):
    """A factory of the rubric registered as ``name`` (entry points ``keyshot.openenv.rubrics``), built
    once now so that a config it cannot use fails before the server listens."""
    found = {ep.name: ep for ep in entry_points(group=RUBRICS_GROUP)}
    if name not in found:
        raise EnvCommandError(
            f"no OpenEnv rubric {name!r} is registered (entry points {RUBRICS_GROUP}: {sorted(found)}); "
            "reinstall keyshot (pip install -e .)"
        )
    factory = functools.partial(found[name].load(), **options)
    factory()
    return factory


def run_env(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("openenv") is None:
        raise EnvCommandError(OPENENV_SETUP)
    from keyshot.env.miniwob.budget import BrowserBudget
    from keyshot.env.miniwob.pool import BrowserPool
    from keyshot.env.miniwob.setup import browser_setup

    config = Path(args.config)
    if not config.is_file():
        raise EnvCommandError(
            f"--config {config}: no such file (a keyshot judge config, configs/reward/*.yaml)"
        )
    budget = BrowserBudget.for_machine(args.max_browsers)
    budget.require(
        args.max_sessions,
        f"keyshot reward env --max-sessions {args.max_sessions}",
        "lower --max-sessions (each session holds a browser), or set --max-browsers",
    )
    pool = BrowserPool(budget, args.miniwob, setup=browser_setup(), max_steps=args.max_steps)
    try:
        # the first browser opens now (an unknown task fails here, before the server listens), kept for a session
        pool.release(pool.acquire())
        return _serve(args, config, pool)
    finally:
        pool.close()


def _serve(args: argparse.Namespace, config: Path, pool) -> int:
    import uvicorn

    from keyshot.env.openenv import server

    rubric = rubric_factory(RUBRIC, config=str(config.resolve()), keep_dir=args.keep)
    app = server.build_app(server.EnvSettings(task=args.miniwob, pool=pool, rubric=rubric), args.max_sessions)
    uvicorn_server = uvicorn.Server(
        uvicorn.Config(app, host=args.host, port=args.port, log_level="warning", timeout_graceful_shutdown=30)
    )
    # bound (and listening) before the line is printed: a client that reads it can connect at once
    family = socket.AF_INET6 if ":" in args.host else socket.AF_INET
    try:
        listening = socket.create_server((args.host, args.port), family=family)
    except OSError as exc:
        raise EnvCommandError(f"--host {args.host} --port {args.port}: cannot listen there ({exc})") from None
    print(
        f"keyshot reward env: MiniWoB {args.miniwob} on http://{args.host}:{listening.getsockname()[1]} "
        f"(OpenEnv; at most {args.max_sessions} sessions, {args.max_steps} steps an episode; reward: {config})",
        flush=True,
    )
    try:
        with listening:
            uvicorn_server.run(sockets=[listening])
    finally:
        print(f"keyshot reward env: stopped; closing the {pool.alive} browser(s) it holds", file=sys.stderr)
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miniwob", required=True, metavar="TASK", help="the MiniWoB task, e.g. click-test")
    p.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: a free port (the start-up line names it)")
    p.add_argument(
        "--max-steps", type=_at_least_one, default=10, help="actions an episode may take (the server ends it)"
    )
    p.add_argument("--max-sessions", type=_at_least_one, default=4, help="sessions (browsers) open at once")
    p.add_argument(
        "--max-browsers",
        type=_at_least_one,
        help="live pages this machine holds (default: half its available memory at 512 MiB a browser)",
    )
    p.add_argument(
        "--keep", metavar="DIR", help="keep every scored episode in DIR (keyshot judge DIR reads it)"
    )


#: ``env`` under ``keyshot reward`` (registered through the ``keyshot.reward.commands`` entry points);
#: keyshot's command line prints an EnvCommandError (any KeyshotError) as one line, with its exit code
COMMAND = Command(
    "env",
    help="live MiniWoB pages on OpenEnv's server, scored by keyshot's reward (OpenEnv clients, TRL)",
    description=__doc__,
    arguments=add_arguments,
    run=run_env,
    on_stop="the environment server closed its browsers and stopped",
)
