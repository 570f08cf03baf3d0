"""TRL's own BrowserGym example (tests/fixtures/trl_browsergym/browsergym.py, TRL 1.16's
examples/scripts/openenv/browsergym.py copied unchanged) trains on ``keyshot reward env``: its
``--space-url`` is the server's URL, and only what a CPU machine and a random policy need is set from
outside the file (tests/framework/openenv_trl_example.py: on the CPU, no bf16, no trackio, the tiny random
Qwen2.5-VL made to call ``noop`` every turn and at most ``--max-steps`` times, one optimizer step, and no
completions table: TRL 1.16's fails on the example's image tool answers). Runs in .venv-openenv-trl (OpenEnv's client and
browsergym_env over .venv's TRL; tools/setup_openenv.sh) against the server in .venv-openenv, with
Debian's Chromium. The bench at the example's own size is bench/openenv_trl.py.
"""

from __future__ import annotations

import json
import subprocess

import pytest
from PIL import Image

from keyshot.infer.loaders import load_trajectories
from keyshot.infer.testing.fake_openai import FakeOpenAI, identify_step, make_judge
from keyshot.infer.testing.launch import start_reward_env
from tests.support import paths
from tests.support.frameworks import python_or_skip
from tests.support.reward import write_config

pytestmark = pytest.mark.slow

REPO = paths.REPO
EXAMPLE = paths.FIXTURES / "trl_browsergym" / "browsergym.py"
MAX_STEPS = 2


def test_trls_browsergym_example_unchanged_trains_on_keyshots_reward(tmp_path):
    python = python_or_skip("openenv", "trl")
    kept = tmp_path / "kept"
    out = tmp_path / "history.json"
    # the judge says success whatever the page: the policy only ever calls noop(), so MiniWoB's own reward
    # is 0.0, and a 1.0 in TRL's log can only be keyshot's verdict
    with FakeOpenAI(make_judge("always_success")) as judge, FakeOpenAI(make_judge()) as scorer:
        config = write_config(tmp_path / "reward.yaml", judge, scorer, timeout_s=10)
        with open(tmp_path / "server.log", "w") as log:
            extra = ("--miniwob", "click-test", "--max-steps", str(MAX_STEPS), "--keep", str(kept))
            # MiniWoB's own page size: a 1280x720 observation is a 29 MB JSON list that takes the client
            # (the example's BrowserGymEnv) past its 60 s on this loaded 2-core machine
            extra += ("--viewport", "miniwob", "--max-pages", "2")  # whatever others' jobs leave free
            server = start_reward_env(python_or_skip("openenv"), config, *extra, stderr=log)
            try:
                plan = {
                    "example": str(EXAMPLE),
                    "policy": str(tmp_path / "policy"),
                    # the example's own command line: the server, its steps, a generation batch of 2
                    "args": [
                        "--space-url",
                        server.url,
                        "--max-steps",
                        str(MAX_STEPS),
                        "--num-generations",
                        "2",
                        "--gradient-accumulation-steps",
                        "1",
                        "--dataset-size",
                        "2",
                    ],
                    # the random policy never stops calling tools by itself: as many calls as the
                    # episode's steps; TRL 1.16's completions table (the example's log_completions)
                    # fails on its own multimodal tool answers (pyarrow: "cannot mix list and non-list"
                    # in the completion column: the assistant's text beside the tools' lists), so off
                    "config": {
                        "per_device_train_batch_size": 2,
                        "max_steps": 1,
                        "max_tool_calling_iterations": MAX_STEPS,
                        "log_completions": False,
                    },
                    "call": {"name": "noop", "arguments": {}},
                    "out": str(out),
                }
                done = subprocess.run(
                    [python, str(paths.FRAMEWORK / "openenv_trl_example.py"), json.dumps(plan)],
                    capture_output=True,
                    text=True,
                    timeout=900,
                    cwd=tmp_path,  # the example writes its outputs/ folder where it runs
                )
                assert done.returncode == 0, done.stderr[-4000:]
            finally:
                server.stop(grace_s=60)
        steps = [identify_step(r) for r in judge.requests]
    history = json.loads(out.read_text())
    assert history["global_step"] == 1
    [logged] = [entry for entry in history["log_history"] if "rewards/reward_completion/mean" in entry]
    # both rollouts' episodes were ended by the server, judged by keyshot (one key-point call for the task),
    # and the example handed keyshot's verdict to TRL as its reward
    assert steps.count("key_points") == 1 and steps.count("outcome") == 2
    episodes = list(load_trajectories(kept))
    assert len(episodes) == 2 and all(e.actions == ["noop()"] * MAX_STEPS for e in episodes)
    assert all(Image.open(shot.path).size[0] < 1280 for e in episodes for shot in e.screenshots)
    assert logged["rewards/reward_completion/mean"] == 1.0
    stopped = (tmp_path / "server.log").read_text()
    assert "2 episode(s) ended, 2 with a reward, 0 without" in stopped
