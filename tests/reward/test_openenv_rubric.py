"""keyshot in OpenEnv: the rubric (keyshot.frameworks.openenv.rubric.KeyshotRubric) called by OpenEnv's own Rubric code,
and the page-to-wire fields of the environment (keyshot.frameworks.openenv.wire).

In .venv: the wire fields of a live page, and ``keyshot reward env`` where OpenEnv is not installed. In the
OpenEnv venv (make setup-openenv; ``$KEYSHOT_OPENENV_PYTHON``), by tests/framework/openenv_rubric.py: sessions
ending together judged as one batch with one key-point call, every form OpenEnv sends a screenshot in,
screenshots that cannot be judged, a dead judge (None with the reason; a counted 0.0 with on_failure: zero)
and a reset mid-episode. The live server is tests/env/test_openenv_server.py.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from typing import Any

import numpy as np
import pydantic
import pytest
import yaml

from keyshot.env.miniwob.client import VIEWPORT_OPENENV
from keyshot.env.page import Page
from keyshot.frameworks.openenv import command as env_command
from keyshot.frameworks.openenv.wire import Pixels, split_text, wire_fields
from keyshot.infer.cli import build_parser, parse
from keyshot.infer.cli import main as keyshot
from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.infer.testing.images import png
from tests.support import paths
from tests.support.openenv import run_driver
from tests.support.reward import write_config

REPO = paths.REPO
TREE = "RootWebArea 'Click Test Task', focused\n\t[13] button 'Click Me!'"
DEAD = "http://127.0.0.1:9/v1"


GREEN = (10, 200, 30)


def test_a_live_page_becomes_the_browsergym_fields():
    text = f'Goal: Click the button.\n\nError: ValueError: Could not find element with bid "99"\n\nPage structure:\n{TREE}'
    fields = wire_fields(Page(text, png(7, 5, GREEN), 1, False, None, 0.0), "Click the button.")
    assert fields["axtree_txt"] == fields["text"] == TREE and fields["goal"] == "Click the button."
    # as OpenEnv's BrowserGym server: an action's own error sets last_action_error and leaves error empty
    assert fields["error"] == "" and fields["last_action_error"]
    assert split_text(text)[0] == 'ValueError: Could not find element with bid "99"'  # the server's metadata
    assert np.asarray(fields["screenshot"]).shape == (5, 7, 3)
    assert fields["screenshot"].tolist()[0][0] == list(GREEN)
    assert fields["pruned_html"] == ""  # a page without its HTML read
    html = '<body bid="1"><button bid="13">Click Me!</button></body>'
    assert wire_fields(Page(text, png(7, 5, GREEN), 1, False, html=html), "Click.")["pruned_html"] == html
    # OpenEnv's server: the tree as text, else the pruned HTML
    assert wire_fields(Page("Goal: Click.", png(7, 5, GREEN), 0, False, html=html), "Click.")["text"] == html
    assert split_text(f"Goal: Click.\n\nPage structure:\n{TREE}") == ("", TREE)
    failed = Page(
        "Error: the browser failed at step 2: gone",
        None,
        2,
        True,
        None,
        None,
        "the browser failed at step 2: gone",
    )
    fields = wire_fields(failed, "Click the button.")
    assert fields["screenshot"] is None and fields["error"] == "the browser failed at step 2: gone"
    assert fields["last_action_error"] and fields["text"] == ""


def test_a_screenshot_is_held_as_its_array_and_sent_as_nested_lists():
    """pydantic, as OpenEnv's server uses it: a Python-mode dump keeps the array; JSON has the lists."""
    pixels = np.random.default_rng(0).integers(0, 256, size=(4, 6, 3), dtype=np.uint8)

    class Answer(pydantic.BaseModel):
        data: dict[str, Any]

    answer = Answer(data={"screenshot": Pixels(pixels)})
    assert isinstance(answer.model_dump()["data"]["screenshot"], Pixels)
    assert json.loads(answer.model_dump_json())["data"]["screenshot"] == pixels.tolist()
    assert np.asarray(Pixels(pixels)) is pixels


@pytest.mark.slow
def test_a_1280x720_observation_keeps_its_array_not_77_mib_of_lists_on_openenvs_own_path():
    """OpenEnv's serialize_observation and WSObservationResponse (its WebSocket handler keeps both until
    the session's next message), read back by its BrowserGymEnv client (tests/framework/openenv_wire.py)."""
    out = run_driver("openenv_wire.py", {})
    assert out["same_text"] and out["client_reads_the_array"] and out["rubric_reads_the_array"]
    assert out["client_reads_html"] == "<p>x</p>"
    assert out["kept_mib"]["nested_lists"] > 50 and out["kept_mib"]["pixels"] < 1


def test_without_openenv_the_command_says_how_to_get_it(tmp_path, capsys):
    if importlib.util.find_spec("openenv") is not None:
        pytest.skip("OpenEnv is installed in this venv")
    config = write_config(tmp_path / "reward.yaml", DEAD)
    code = keyshot(["reward", "env", "--miniwob", "click-test", "--config", str(config)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert (
        "needs OpenEnv" in err
        and "make setup-openenv" in err
        and ".venv-openenv/bin/keyshot reward env" in err
    )


def test_the_documented_command_line_is_keyshot_reward_env():
    """docs/reward.md's OpenEnv section starts the server with a command line keyshot parses as written."""
    section = (REPO / "docs" / "reward.md").read_text().split("\n## OpenEnv", 1)[1].split("\n## ", 1)[0]
    [line] = [x for x in section.splitlines() if x.startswith(".venv-openenv/bin/keyshot reward env")]
    args = parse(build_parser(), shlex.split(line)[1:])
    assert args.handler is env_command.run and args.miniwob == "click-test"
    assert args.max_steps == 10 and args.config == "configs/reward/trl.yaml"
    # the default port is none of the ports the reward's config and TRL's vLLM server use
    assert args.port == env_command.SERVER.port == 8020 and args.answer_within_s < 60
    assert f":{args.port}" not in (REPO / "configs" / "reward" / "trl.yaml").read_text()
    # pages as OpenEnv's BrowserGym server renders them, unless asked for MiniWoB's own
    assert args.viewport == "{}x{}".format(*VIEWPORT_OPENENV) == "1280x720"


@pytest.fixture(scope="module")
def rubric_run(tmp_path_factory):
    """One run of the rubric driver over every case, with a fake judge (its requests counted), a fake
    scorer, and a judge that is down."""
    tmp = tmp_path_factory.mktemp("openenv-rubric")
    with (
        FakeOpenAI(make_judge()) as judge,
        FakeOpenAI(make_judge()) as scorer,
        FakeOpenAI(make_judge()) as other,
    ):
        # a window of 1 s: the three sessions' ends, released together, always meet in one batch
        healthy = write_config(tmp / "healthy.yaml", judge, scorer, timeout_s=5, batch_window_s=1)
        down = write_config(tmp / "dead.yaml", DEAD, timeout_s=5)
        zero = write_config(tmp / "zero.yaml", DEAD, timeout_s=5, on_failure="zero")
        steps = write_config(tmp / "steps.yaml", other, scorer, timeout_s=5)  # its own judge: its calls apart
        with_steps = yaml.safe_load(steps.read_text())
        with_steps["pipeline"]["step_rewards"] = True
        steps.write_text(yaml.safe_dump(with_steps))
        plan = {"healthy": str(healthy), "dead": str(down), "zero": str(zero), "steps": str(steps)}
        plan["keep"] = str(tmp / "kept")
        out = run_driver("openenv_rubric.py", plan)
        yield out, [identify_step(r) for r in judge.requests], tmp / "kept"


@pytest.mark.slow
def test_sessions_ending_together_are_one_batch_with_one_key_point_call(rubric_run):
    out, steps, kept = rubric_run
    together = out["together"]
    assert out["batches"] == 1  # the three ends were judged as one round of calls
    assert steps.count("key_points") == 1  # once for the task, for every session and every later episode
    assert steps.count("outcome") == 5  # the three sessions, the dict-observation episode, score_trajectory
    for session in together:
        assert session["values"][:2] == [None, None]  # nothing is known before the end
        assert session["values"][2] in (0.0, 1.0) and session["values"][2] == session["last_score"]
        meta = session["metadata"]
        assert meta["keyshot_reward"] == session["values"][2] and meta["keyshot_error"] is None
        assert meta["keyshot_failed"] == 0.0 and len(meta["keyshot_step_scores"]) == 3
        assert meta["keyshot_key_points"] and meta["task_id"].startswith("miniwob.click-test.")
        assert session["kept_screenshots"] == [
            None,
            None,
            None,
        ]  # the pixels are on disk, not in the trajectory
        assert session["step_rewards"] == [session["values"][2]] * 3
    # the task's key points were asked at the sessions' first pair, outside their verdicts: each verdict
    # paid its outcome call only
    assert sum(s["metadata"]["keyshot_judge_calls"] for s in together) == 3.0
    trajectories = load_trajectories(kept)  # the kept episodes, as keyshot judge reads them
    assert sorted(t.task_id for t in trajectories) == [f"miniwob.click-test.{s}" for s in (0, 10, 20)]
    for t in trajectories:
        assert t.task == "Click the button." and len(t.screenshots) == 3
        assert t.actions == ["click('13')", "click('14')"]  # each page with the action taken on it
        assert t.extra == {"start_url": "file:///miniwob/click-test.html"}


@pytest.mark.slow
def test_with_step_rewards_each_step_gets_its_own_reward_summing_to_the_progress(rubric_run):
    """pipeline.step_rewards: compute_step_rewards gives one reward per step (the reset's page first), the
    last observation's metadata carries them with the progress at each step, and they sum to the progress."""
    out, _, _ = rubric_run
    steps = out["steps"]
    meta = steps["metadata"]
    assert meta["keyshot_error"] is None and len(steps["step_rewards"]) == 3
    assert steps["step_rewards"] == meta["keyshot_step_rewards"]
    assert (
        sum(steps["step_rewards"])
        == pytest.approx(meta["keyshot_progress"])
        == meta["keyshot_step_progress"][-1]
    )
    assert len(meta["keyshot_key_point_steps"]) == len(meta["keyshot_key_points"])
    assert meta["keyshot_step_progress"] == sorted(meta["keyshot_step_progress"])
    assert out["together"][0]["metadata"]["keyshot_step_rewards"] is None  # off: not asked


@pytest.mark.slow
def test_every_form_of_a_screenshot_is_judged(rubric_run):
    out, _, _ = rubric_run
    forms = out["forms"]  # PNG bytes, a PIL image, RGBA pixels, in dict observations (GenericEnvClient's)
    assert forms["values"][2] in (0.0, 1.0) and forms["metadata"]["keyshot_error"] is None
    assert len(forms["metadata"]["keyshot_step_scores"]) == 3
    whole = out["score_trajectory"]
    assert whole["value"] in (0.0, 1.0) and whole["metadata"]["keyshot_reward"] == whole["value"]


@pytest.mark.slow
def test_a_page_that_cannot_be_judged_gives_no_reward_naming_its_step(rubric_run):
    out, _, _ = rubric_run
    ragged = out["ragged"]
    assert ragged["values"][2] is None and ragged["metadata"]["keyshot_failed"] == 1.0
    assert "step 2: screenshot: not an H×W×C array of pixels" in ragged["metadata"]["keyshot_error"]
    failed = out["no_screenshot"]
    assert failed["values"][2] is None
    assert (
        "step 2 has no screenshot (the browser failed at step 2: it crashed)"
        in failed["metadata"]["keyshot_error"]
    )


@pytest.mark.slow
def test_a_dead_judge_gives_none_with_the_reason_never_a_silent_zero(rubric_run):
    out, _, _ = rubric_run
    dead = out["dead"]
    assert dead["values"][2] is None and dead["last_score"] is None
    assert dead["metadata"]["keyshot_reward"] is None and dead["metadata"]["keyshot_failed"] == 1.0
    assert dead["metadata"]["keyshot_error"].startswith("key points")
    zero = out["zero"]  # reward.on_failure: zero: a number, counted as a failure, the reason kept
    assert zero["values"][2] == 0.0 and zero["metadata"]["keyshot_failed"] == 1.0
    assert zero["metadata"]["keyshot_error"].startswith("key points")


@pytest.mark.slow
def test_a_reset_drops_the_unscored_episode_and_a_missing_config_is_named(rubric_run):
    out, _, _ = rubric_run
    assert out["reset"] == {"before": True, "steps": 2, "after": False, "steps_after": 0}
    assert out["no_config"].startswith("RewardConfigError: KEYSHOT_REWARD_CONFIG is not set")
