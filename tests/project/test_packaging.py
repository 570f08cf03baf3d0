"""The installed package runs outside the checkout: prompts, samples and the demo's configs ship in it."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tests.support import paths

REPO = paths.REPO

CHECK = """
import keyshot, keyshot.infer.demo as demo
from pathlib import Path
from keyshot import load_config, load_prompt_set, load_trajectories, JudgeRunConfig
from keyshot.infer.serve.plan import ServeConfig
assert Path(keyshot.__file__).resolve().is_relative_to(Path.cwd().resolve()), keyshot.__file__  # the wheel's
judge = load_config(JudgeRunConfig, demo.CONFIGS / "judge.yaml")
serve = load_config(ServeConfig, demo.CONFIGS / "serve.yaml")
print(judge.pipeline.prompt_variant, load_prompt_set(judge.pipeline.prompt_variant).version)
print(len(list(load_trajectories(demo.SAMPLES))), "sample trajectories")
from keyshot.infer.common.config import resolve_config
shipped = resolve_config("webjudge7b")  # a shipped config by name, from the wheel, from any folder
assert shipped.resolve().is_relative_to(Path.cwd().resolve()) and load_config(JudgeRunConfig, "webjudge7b"), shipped
for name in ("infer", "train", "data_synth"):
    try:
        __import__(name)
    except ModuleNotFoundError:
        continue
    raise SystemExit(f"the wheel installs a top-level {name!r}")
"""


def _wheel(tmp_path: Path) -> Path:
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
    return next(tmp_path.glob("keyshot-*.whl"))


def test_the_wheel_holds_what_the_package_reads_at_run_time(tmp_path):
    wheel = _wheel(tmp_path)
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "keyshot/infer/demo_configs/judge.yaml",
        "keyshot/infer/demo_configs/serve.yaml",
        "keyshot/infer/protocol/prompts/webjudge_prompts.json",
        "keyshot/infer/protocol/prompts/LICENSE.md",
        "keyshot/infer/report/static/report.css",
        "keyshot/configs/judge/webjudge7b.yaml",
        "keyshot/configs/serve/webjudge7b_gpu.yaml",
    ):
        assert required in names, required
    top = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top == {"keyshot"}, f"the wheel installs {sorted(top)} at the top level"
    packaged = {Path(n).parent.as_posix() for n in names if n.endswith("/__init__.py")}
    folders = {
        "keyshot/" + p.parent.relative_to(REPO).as_posix()
        for floor in ("infer", "reward", "env", "frameworks", "train", "data_synth")
        for p in (REPO / floor).rglob("__init__.py")
    } | {"keyshot", "keyshot/configs"}
    assert packaged == folders, "pyproject.toml's package list and the package folders differ"
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); exec({CHECK!r})"],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "online_mind2web online_mind2web@" in run.stdout and " sample trajectories" in run.stdout
    assert int(run.stdout.split()[-3]) >= 2


def test_the_wheel_installs_one_import_name_and_the_command(tmp_path):
    """Installed into a clean venv (its dependencies borrowed from this one), the wheel adds ``keyshot``
    as its only top-level import name, and its console script lists every subcommand."""
    wheel = _wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    before = {p.name for p in site.iterdir()}
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(py),
            "install",
            "--no-deps",
            "--no-index",
            "-q",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    added = {p.name for p in site.iterdir()} - before
    assert {n for n in added if not n.endswith(".dist-info")} == {"keyshot"}, added
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "borrowed_deps.pth").write_text("\n".join(deps) + "\n")  # torch & co. without a reinstall
    help_run = subprocess.run(
        [venv / "bin" / "keyshot", "--help"], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert help_run.returncode == 0, help_run.stderr[-2000:]
    for command in (
        "judge",
        "serve",
        "metrics",
        "merge",
        "report",
        "synth",
        "merge-lora",
        "tiny-model",
        "reward",
    ):
        assert command in help_run.stdout, command
    where = subprocess.run(
        [py, "-c", "import keyshot.infer.judge.command as m; print(m.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr


def test_every_name_of_the_facade_resolves_to_its_room():
    import keyshot
    from keyshot.reward.episode import Episode
    from keyshot.reward.model import RewardModel

    for name in keyshot.__all__:
        assert getattr(keyshot, name).__name__ == name
    assert (keyshot.RewardModel, keyshot.Episode) == (RewardModel, Episode)
    import keyshot.reward

    assert (keyshot.reward.RewardModel, keyshot.reward.Episode) == (RewardModel, Episode)
    for name in keyshot.reward.__all__:
        assert getattr(keyshot.reward, name) is not None
