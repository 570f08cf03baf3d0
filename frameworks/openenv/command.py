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
with the reason (their sessions' next resets open in a new Chromium). The deadlines' defaults are the
session settings' (keyshot.env.miniwob.settings.SessionSettings). ``--keep DIR`` keeps every scored
episode there (``keyshot judge DIR`` reads it). SIGTERM or Ctrl-C closes every Chromium the server
opened, and the last line counts the episodes. Runs where OpenEnv is installed: make setup-openenv, then
``.venv-openenv/bin/keyshot reward env ...``.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from keyshot.env.miniwob.client import VIEWPORT_OPENENV
from keyshot.env.miniwob.settings import SessionSettings
from keyshot.frameworks.openenv.serving import EnvServer, serve_env
from keyshot.infer.common.command import Command

#: The defaults every option below takes (the session's and the server's, from their dataclasses)
SESSION = SessionSettings()
SERVER = EnvServer(config=Path(), session=SESSION)


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


def env_server(args: argparse.Namespace) -> EnvServer:
    """The server the options ask for (pages at OpenEnv's BrowserGym format: their HTML too)."""
    viewport = None if args.viewport == "miniwob" else tuple(int(n) for n in args.viewport.split("x"))
    session = SESSION.with_changes(
        args.miniwob,
        max_steps=args.max_steps,
        viewport=viewport,
        html=True,
        answer_within_s=args.answer_within_s,
        page_timeout_s=args.page_timeout_s,
    )
    return EnvServer(
        config=Path(args.config),
        session=session,
        host=args.host,
        port=args.port,
        max_sessions=args.max_sessions,
        max_pages=args.max_pages,
        keep=args.keep,
    )


def run(args: argparse.Namespace) -> int:
    return serve_env(env_server(args))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--miniwob", required=True, metavar="TASK", help="the MiniWoB task, e.g. click-test")
    p.add_argument(
        "--config",
        required=True,
        help="a keyshot judge config (configs/reward/*.yaml, or one by name: reward/local)",
    )
    p.add_argument("--host", default=SERVER.host, help="the address to listen on")
    p.add_argument(
        "--port",
        type=int,
        default=SERVER.port,
        help="default %(default)s; 0: a free port (the start-up line names it)",
    )
    p.add_argument(
        "--max-steps",
        type=_at_least_one,
        default=SESSION.max_steps,
        help="actions an episode may take (the server ends it; default %(default)s)",
    )
    p.add_argument(
        "--answer-within-s",
        type=_positive,
        default=SESSION.answer_within_s,
        help="seconds within which every step answers (default %(default)s; OpenEnv's client waits 60); "
        "a verdict not ready by then: no reward for that episode, the reason in its metadata; a browser "
        "silent that long is killed as stuck",
    )
    p.add_argument(
        "--page-timeout-s",
        type=_positive,
        default=SESSION.page_timeout_s,
        help="seconds one call on a page may take before its step fails (default %(default)s; below "
        "--answer-within-s)",
    )
    p.add_argument(
        "--max-sessions",
        type=_at_least_one,
        default=SERVER.max_sessions,
        help="sessions open at once, a MiniWoB page each (default: as many as the machine holds)",
    )
    p.add_argument(
        "--max-pages",
        type=_at_least_one,
        default=SERVER.max_pages,
        help="live pages this machine holds (default: measured per page and per Chromium, within the "
        "available memory)",
    )
    p.add_argument(
        "--viewport",
        type=_viewport,
        default="{}x{}".format(*VIEWPORT_OPENENV),
        help="the pages' size, WxH (default: OpenEnv's BrowserGym server's, %(default)s), or 'miniwob' "
        "(the task's own)",
    )
    p.add_argument(
        "--keep",
        metavar="DIR",
        default=SERVER.keep,
        help="keep every scored episode in DIR (keyshot judge DIR reads it)",
    )


#: ``env`` under ``keyshot reward`` (:mod:`keyshot.frameworks.command`); keyshot's command line prints an
#: EnvServerError (any KeyshotError) as one line, with its exit code
ENV = Command(
    "env",
    help="live MiniWoB pages on OpenEnv's server, scored by keyshot's reward (OpenEnv clients, TRL)",
    description=__doc__,
    arguments=add_arguments,
    run=run,
    on_stop="the environment server closed its browsers and stopped",
)
