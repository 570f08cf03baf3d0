"""``keyshot reward env``: live MiniWoB pages served by OpenEnv's own server, scored by keyshot's reward.

    keyshot reward env --miniwob click-test --config configs/reward/trl.yaml --max-steps 10

OpenEnv's clients (``GenericEnvClient``, the ``BrowserGymEnv`` client of TRL's OpenEnv examples) connect
to ``http://HOST:PORT`` (port 8020 by default: 8000 is vLLM's, TRL's vLLM server's and the scorer's of
configs/reward/trl.yaml) over a WebSocket; each session holds a MiniWoB page (a browser context in one of
the server's shared Chromium processes) from its first reset to its end: at most ``--max-sessions`` at
once (default: as many as the machine holds, ``--max-pages``); OpenEnv's server refuses a session beyond
them with its own capacity error. The first page is opened before the server listens. Pages are
1280x720 as OpenEnv's BrowserGym server renders them (``--viewport``; ``miniwob``: the task's own size).
Actions are BrowserGym's (``{"action_str": "click('13')"}``); each observation is OpenEnv's BrowserGym
format (its own models, from the ``browsergym_env`` package). A reset asks the task's key points in the
background. The last step of an episode (MiniWoB ended it, or ``--max-steps`` actions) carries keyshot's
reward (None when no verdict could be had: the observation's ``metadata.keyshot_error`` says why),
MiniWoB's own reward beside it (``metadata.miniwob_reward``). Sessions ending together are judged as one
batch. Every step answers within ``--answer-within-s`` (OpenEnv's client waits 60 s): a verdict not
ready by then leaves its episode without a reward, saying so, and its judging goes on into the call
cache; a browser that stays silent that long is killed as stuck, and the steps waiting on it answer
with the reason (their sessions' next resets open in a new Chromium). ``--keep DIR`` keeps every scored
episode there (``keyshot judge DIR`` reads it). SIGTERM or Ctrl-C closes every Chromium the server
opened, and the last line counts the episodes. Runs where OpenEnv is installed: make setup-openenv, then
``.venv-openenv/bin/keyshot reward env ...``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import logging
import re
import socket
import sys
from importlib.metadata import entry_points
from pathlib import Path

from keyshot.infer.common.command import Command
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import return_large_buffers

logger = logging.getLogger(__name__)

#: Entry-point group of the OpenEnv rubrics an environment is scored with, by name (pyproject.toml).
RUBRICS_GROUP = "keyshot.openenv.rubrics"
RUBRIC = "keyshot"
OPENENV_SETUP = (
    "keyshot reward env needs OpenEnv and its BrowserGym models (the browsergym_env package), in a venv of "
    "their own: make setup-openenv (tools/setup_openenv.sh) builds .venv-openenv; then run "
    ".venv-openenv/bin/keyshot reward env ..."
)
#: The port served by default: 8000 is vLLM's (TRL's vLLM server, the scorer of configs/reward/trl.yaml).
DEFAULT_PORT = 8020
#: OpenEnv's client waits 60 s for each answer (``message_timeout_s``); a step answers well within it.
ANSWER_WITHIN_S = 45.0


class EnvCommandError(KeyshotError):
    """``keyshot reward env`` cannot start."""


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def _viewport(value: str) -> str:
    if value == "miniwob" or re.fullmatch(r"[1-9]\d{1,4}x[1-9]\d{1,4}", value):
        return value
    raise argparse.ArgumentTypeError(f"WxH (e.g. 1280x720) or 'miniwob', got {value!r}")


def _positive(value: str) -> float:
    number = float(value)
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {value}")
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
    if any(importlib.util.find_spec(name) is None for name in ("openenv", "browsergym_env")):
        raise EnvCommandError(OPENENV_SETUP)
    from keyshot.env.miniwob.budget import BrowserBudget, observation_mib
    from keyshot.env.miniwob.pool import BrowserPool
    from keyshot.env.miniwob.setup import browser_setup

    config = Path(args.config)
    if not config.is_file():
        raise EnvCommandError(
            f"--config {config}: no such file (a keyshot judge config, configs/reward/*.yaml)"
        )
    viewport = None if args.viewport == "miniwob" else tuple(int(n) for n in args.viewport.split("x"))
    # each session costs its page in Chromium and its observations in this server (the budget counts both:
    # at the page alone, TRL's 256 sessions were admitted and the server was OOM-killed)
    budget = BrowserBudget.for_machine(
        args.max_pages, viewport=viewport, session_mib=observation_mib(viewport)
    )
    sessions = args.max_sessions or max(1, budget.max_pages)  # none at all: refused below, naming why
    budget.require(
        sessions,
        f"keyshot reward env --max-sessions {sessions}",
        "lower --max-sessions (each session holds a page), or set --max-pages",
    )
    # a browser silent for the step's deadline is stuck: it is killed and its sessions' steps answer with
    # the reason, before OpenEnv's client gives up on them (a client that times out kills TRL's trainer)
    pool = BrowserPool(
        budget,
        args.miniwob,
        setup=browser_setup(),
        max_steps=args.max_steps,
        viewport=viewport,
        timeout_s=args.answer_within_s,
        html=True,
    )
    try:
        # the first page opens now (an unknown task fails here, before the server listens); more Chromium
        # processes are launched as sessions fill the open ones
        with pool.lease() as first:
            first.reset(seed=0)
        return _serve(args, config, pool, sessions)
    finally:
        pool.close()


def _serve(args: argparse.Namespace, config: Path, pool, sessions: int) -> int:
    import uvicorn

    from keyshot.env.openenv import server

    if not return_large_buffers():  # each session's screenshots, freed, go back to the system
        logger.warning(
            "the C library is not glibc: freed screenshot buffers may stay in the server (about 36 MiB a "
            "session at 1280x720 where glibc keeps them; the page budget counts 6)"
        )
    rubric = rubric_factory(RUBRIC, config=str(config.resolve()), keep_dir=args.keep)
    settings = server.EnvSettings(
        task=args.miniwob, pool=pool, rubric=rubric, answer_within_s=args.answer_within_s
    )
    app = server.build_app(settings, sessions)
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
        f"(OpenEnv; at most {sessions} sessions, {args.max_steps} steps an episode, each step answered "
        f"within {args.answer_within_s:g} s; reward: {config})",
        flush=True,
    )
    try:
        with listening:
            uvicorn_server.run(sockets=[listening])
    finally:
        print(
            f"keyshot reward env: stopped; {settings.counts}; closing its {len(pool.processes())} Chromium "
            f"process(es) ({pool.max_leased} sessions at most at once)",
            file=sys.stderr,
        )
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miniwob", required=True, metavar="TASK", help="the MiniWoB task, e.g. click-test")
    p.add_argument("--config", required=True, help="a keyshot judge config (configs/reward/*.yaml)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"default {DEFAULT_PORT}; 0: a free port (the start-up line names it)",
    )
    p.add_argument(
        "--max-steps", type=_at_least_one, default=10, help="actions an episode may take (the server ends it)"
    )
    p.add_argument(
        "--answer-within-s",
        type=_positive,
        default=ANSWER_WITHIN_S,
        help="seconds within which every step answers (OpenEnv's client waits 60); a verdict not ready "
        "by then: no reward for that episode, the reason in its metadata; a browser silent that long is "
        "killed as stuck",
    )
    p.add_argument(
        "--max-sessions",
        type=_at_least_one,
        help="sessions open at once, a MiniWoB page each (default: as many as the machine holds)",
    )
    p.add_argument(
        "--max-pages",
        type=_at_least_one,
        help="live pages this machine holds (default: measured per page and per Chromium, within the "
        "available memory)",
    )
    p.add_argument(
        "--viewport",
        type=_viewport,
        default="1280x720",
        help="the pages' size, WxH (default: OpenEnv's BrowserGym server's), or 'miniwob' (the task's own)",
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
