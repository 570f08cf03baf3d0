"""Live MiniWoB pages served on OpenEnv's own server, scored by keyshot's rubric (:mod:`.rubric`): what
``keyshot reward env`` runs (:func:`serve_env`). The pages are budgeted before anything opens (each
session costs its page in Chromium and its observations in this server), the first page is opened
before the server listens, and every Chromium is closed when it stops (SIGTERM included). Needs OpenEnv
(``make setup-openenv``); importing this module does not.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from keyshot.env.miniwob.settings import SessionSettings
from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.processes import return_large_buffers

logger = logging.getLogger(__name__)

OPENENV_SETUP = (
    "keyshot reward env needs OpenEnv and its BrowserGym models (the browsergym_env package), in a venv of "
    "their own: make setup-openenv (tools/setup_openenv.sh) builds .venv-openenv; then run "
    ".venv-openenv/bin/keyshot reward env ..."
)


class EnvServerError(KeyshotError):
    """The environment server cannot start."""


@dataclass(frozen=True)
class EnvServer:
    """What ``keyshot reward env`` serves: MiniWoB sessions opened with ``session`` (task, steps, page size,
    deadlines), scored by the reward of ``config`` (a keyshot judge config), on ``host``:``port`` (8020 by
    default: 8000 is vLLM's, TRL's vLLM server's and the scorer's of configs/reward/trl.yaml; 0: a free
    port, named in the start-up line). ``max_sessions`` open at once (None: as many as the machine holds,
    or ``max_pages``); ``keep``: a folder keeping every scored episode."""

    config: Path
    session: SessionSettings
    host: str = "127.0.0.1"
    port: int = 8020
    max_sessions: int | None = None
    max_pages: int | None = None
    keep: str | None = None


def rubric_factory(**options):
    """A factory of keyshot's rubric with ``options``, built once now so that a config it cannot use fails
    before the server listens."""
    from keyshot.frameworks.openenv.rubric import KeyshotRubric

    factory = functools.partial(KeyshotRubric, **options)
    factory()
    return factory


def serve_env(server: EnvServer) -> int:
    """Serve until stopped; the exit code (0)."""
    if any(importlib.util.find_spec(name) is None for name in ("openenv", "browsergym_env")):
        raise EnvServerError(OPENENV_SETUP)
    from keyshot.env.miniwob.budget import BrowserBudget, observation_mib
    from keyshot.env.miniwob.pool import BrowserPool
    from keyshot.env.miniwob.setup import browser_setup

    if not server.config.is_file():
        raise EnvServerError(
            f"--config {server.config}: no such file (a keyshot judge config, configs/reward/*.yaml)"
        )
    viewport = server.session.viewport
    # each session costs its page in Chromium and its observations in this server (the budget counts both:
    # at the page alone, TRL's 256 sessions were admitted and the server was OOM-killed)
    budget = BrowserBudget.for_machine(
        server.max_pages, viewport=viewport, session_mib=observation_mib(viewport)
    )
    sessions = server.max_sessions or max(1, budget.max_pages)  # none at all: refused below, naming why
    budget.require(
        sessions,
        f"keyshot reward env --max-sessions {sessions}",
        "lower --max-sessions (each session holds a page), or set --max-pages",
    )
    # a browser silent for the step's deadline is stuck: it is killed and its sessions' steps answer with
    # the reason, before OpenEnv's client gives up on them (a client that times out kills TRL's trainer)
    pool = BrowserPool(budget, settings=server.session, setup=browser_setup())
    try:
        # the first page opens now (an unknown task fails here, before the server listens); more Chromium
        # processes are launched as sessions fill the open ones
        with pool.lease() as first:
            first.reset(seed=0)
        return _serve(server, pool, sessions)
    finally:
        pool.close()


def _serve(server: EnvServer, pool, sessions: int) -> int:
    import uvicorn

    from keyshot.frameworks.openenv.server import EnvSettings, build_app

    if not return_large_buffers():  # each session's screenshots, freed, go back to the system
        logger.warning(
            "the C library is not glibc: freed screenshot buffers may stay in the server (about 36 MiB a "
            "session at 1280x720 where glibc keeps them; the page budget counts 6)"
        )
    rubric = rubric_factory(config=str(server.config.resolve()), keep_dir=server.keep)
    settings = EnvSettings(pool=pool, rubric=rubric)
    app = build_app(settings, sessions)
    uvicorn_server = uvicorn.Server(
        uvicorn.Config(
            app, host=server.host, port=server.port, log_level="warning", timeout_graceful_shutdown=30
        )
    )
    # bound (and listening) before the line is printed: a client that reads it can connect at once
    family = socket.AF_INET6 if ":" in server.host else socket.AF_INET
    try:
        listening = socket.create_server((server.host, server.port), family=family)
    except OSError as exc:
        raise EnvServerError(
            f"--host {server.host} --port {server.port}: cannot listen there ({exc})"
        ) from None
    session = server.session
    print(
        f"keyshot reward env: MiniWoB {session.task} on http://{server.host}:{listening.getsockname()[1]} "
        f"(OpenEnv; at most {sessions} sessions, {session.max_steps} steps an episode, each step answered "
        f"within {session.answer_within_s:g} s; reward: {server.config})",
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
