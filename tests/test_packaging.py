"""The installed package runs outside the checkout: prompts, samples and the demo's configs ship in it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHECK = """
import infer, infer.demo
from pathlib import Path
from infer.config import load_config
from infer.judge_config import JudgeRunConfig
from infer.prompts import load_prompt_set
from infer.serve_plan import ServeConfig
from infer.trajectory import load_trajectories
assert Path(infer.__file__).resolve().is_relative_to(Path.cwd().resolve()), infer.__file__  # the wheel's
judge = load_config(JudgeRunConfig, infer.demo.CONFIGS / "judge.yaml")
serve = load_config(ServeConfig, infer.demo.CONFIGS / "serve.yaml")
print(judge.pipeline.prompt_variant, load_prompt_set(judge.pipeline.prompt_variant).version)
print(len(list(load_trajectories(infer.demo.SAMPLES))), "sample trajectories")
"""


def test_the_wheel_holds_what_the_package_reads_at_run_time(tmp_path):
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(REPO),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(tmp_path.glob("keyshot-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "infer/demo_configs/judge.yaml",
        "infer/demo_configs/serve.yaml",
        "infer/prompts/webjudge_prompts.json",
        "infer/prompts/LICENSE.md",
        "infer/report/static/report.css",
    ):
        assert required in names, required
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=site, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "online_mind2web online_mind2web@" in run.stdout and " sample trajectories" in run.stdout
    assert int(run.stdout.split()[-3]) >= 2
