"""A live session's settings have one home (keyshot.env.miniwob.settings.SessionSettings): the browser's
deadlines were declared by the pool, the session and the Chromium process (60 s each), halved into
milliseconds for the worker, 3,000 ms in the worker, 45 s in ``keyshot reward env``, and the steps of an
episode by the pool, the session and keyshot's TRL environments. No constructor declares a default of
its own; ``keyshot reward env``'s options default to the fields; a setting that cannot work is one line.
The worker running with the configured deadlines is tests/env/test_miniwob_live.py (it needs Chromium)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from keyshot.env.miniwob.client import VIEWPORT_OPENENV, BrowserProcess, MiniWoBBrowser
from keyshot.env.miniwob.pool import BrowserPool
from keyshot.env.miniwob.settings import SessionSettings, SessionSettingsError
from keyshot.frameworks.openenv import command as env_command
from keyshot.frameworks.openenv.serving import EnvServer
from keyshot.frameworks.trl.env import BrowserGymWebEnv, MiniWoBEnv, ReplayEnv, WebEnv
from keyshot.infer.cli import build_parser, parse
from keyshot.reward.episode import EpisodeRecorder
from tests.support import paths

FIELDS = {f.name for f in dataclasses.fields(SessionSettings)}
#: the names these settings went by before they had one home
OLD_NAMES = {"timeout_s", "page_timeout_ms"}
READERS = [BrowserPool, MiniWoBBrowser, BrowserProcess, WebEnv, MiniWoBEnv, ReplayEnv, BrowserGymWebEnv]


@pytest.mark.parametrize("reader", READERS, ids=lambda c: c.__name__)
def test_no_reader_of_the_session_settings_declares_a_default_of_its_own(reader):
    own = {
        name: p.default
        for name, p in inspect.signature(reader.__init__).parameters.items()
        if name in FIELDS | OLD_NAMES and p.default is not inspect.Parameter.empty and p.default is not None
    }
    assert own == {}, f"{reader.__name__} declares its own default for {sorted(own)}: read SessionSettings"


def test_keyshot_reward_envs_options_default_to_the_session_settings():
    args = parse(build_parser(), ["reward", "env", "--miniwob", "click-button", "--config", "c.yaml"])
    server = env_command.env_server(args)
    assert server.session == SessionSettings(task="click-button", viewport=VIEWPORT_OPENENV, html=True)
    assert (server.host, server.port, server.max_sessions, server.max_pages, server.keep) == (
        EnvServer.host,
        EnvServer.port,
        None,
        None,
        None,
    )
    given = [
        "--answer-within-s",
        "30",
        "--page-timeout-s",
        "12.5",
        "--max-steps",
        "4",
        "--viewport",
        "miniwob",
    ]
    args = parse(build_parser(), ["reward", "env", "--miniwob", "click-test", "--config", "c.yaml", *given])
    session = env_command.env_server(args).session
    assert (session.answer_within_s, session.page_timeout_s, session.max_steps, session.viewport) == (
        30,
        12.5,
        4,
        None,
    )
    # the worker is given the page timeout and the DOM wait, in milliseconds, from this one object
    assert session.worker_arguments() == ["12500", str(round(SessionSettings().dom_wait_s * 1000))]


def test_a_setting_that_cannot_work_is_one_line_naming_it(capsys):
    with pytest.raises(
        SessionSettingsError, match=r"page_timeout_s \(50 s\) must be below answer_within_s \(45 s\)"
    ):
        SessionSettings(page_timeout_s=50)
    with pytest.raises(SessionSettingsError, match="max_steps must be at least 1"):
        SessionSettings(max_steps=0)
    with pytest.raises(TypeError, match=r"unknown session setting\(s\) \['timeout_s'\]"):
        SessionSettings().with_changes(timeout_s=60)
    argv = ["reward", "env", "--miniwob", "click-test", "--config", "c.yaml", "--answer-within-s", "10"]
    with pytest.raises(SessionSettingsError) as caught:
        env_command.env_server(parse(build_parser(), argv))
    assert "\n" not in str(caught.value) and "--page-timeout-s" in str(caught.value)


def test_keyshots_trl_environments_record_through_the_episode_recorder(tmp_path):
    """frameworks/trl/env.py's WebEnv re-implemented the documented EpisodeRecorder (frameworks/trl/reward.py): it is one, so its
    episodes are started and recorded, and kept, the way any user's environment's are."""
    assert issubclass(WebEnv, EpisodeRecorder)
    env = ReplayEnv(keep_dir=tmp_path / "kept")
    assert env.max_steps == SessionSettings().max_steps and env.episode_keep_dir == str(tmp_path / "kept")
    trajectory = sorted((paths.FIXTURES / "trajectories" / "online_mind2web_v1").iterdir())[0]
    env.reset(trajectory=str(trajectory))
    while not env.done:
        env.click("12")
    assert env.episode is not None and len(env.episode.screenshots) == env.step_count + 1
    env.episode.finish("done")
    assert [p.suffix for p in (tmp_path / "kept").iterdir()].count(".jsonl") == 1


def test_the_documented_defaults_are_the_session_settings_and_the_servers():
    """docs/reward.md and ``keyshot reward env``'s description name the deadlines and the port in words:
    they say what SessionSettings and EnvServer hold (a default changed there is changed here too)."""
    docs = " ".join((paths.REPO / "docs" / "reward.md").read_text().split())
    described = " ".join(env_command.__doc__.split())
    defaults = SessionSettings()
    for said in (
        f"`--answer-within-s` (default {defaults.answer_within_s:g} s)",
        f"`page_timeout_s` (one call on a page, {defaults.page_timeout_s:g} s,",
        f"BrowserGym's {defaults.dom_wait_s:g} s)",
        f"on port {EnvServer.port} by default",
    ):
        assert said in docs, f"docs/reward.md: {said!r}"
    assert f"(port {EnvServer.port} by default:" in described
