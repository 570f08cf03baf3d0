"""The rooms of docs/architecture.md hold: each room of keyshot.infer imports only the rooms below it,
keyshot.infer names neither data_synth nor train, each RL framework's package of keyshot.frameworks
imports no other framework's, and bench/ does not reach into tests/."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support import paths

REPO = paths.REPO

#: room -> the rooms of keyshot.infer it may import (itself included). Modules at infer/'s top (the
#: ``keyshot`` command, the demo) may import any room.
BELOW = {
    "common": {"common"},
    "protocol": {"common", "protocol"},
    "loaders": {"common", "protocol", "loaders"},
    "model": {"common", "protocol", "model"},
    "client": {"common", "protocol", "client"},
    "runs": {"common", "protocol", "loaders", "runs"},
    "metrics": {"common", "protocol", "loaders", "runs", "metrics"},
    "serve": {"common", "protocol", "model", "client", "serve"},
    "engines": {"common", "protocol", "client", "engines"},
    "report": {"common", "protocol", "loaders", "runs", "metrics", "report"},
    "judge": {
        "common",
        "protocol",
        "loaders",
        "model",
        "client",
        "runs",
        "metrics",
        "serve",
        "report",
        "engines",
        "judge",
    },
    "testing": {"common", "protocol", "loaders", "testing"},
}
#: floor -> the floors of keyshot it may import
FLOORS = {
    "infer": {"infer"},
    "reward": {"infer", "reward"},
    "env": {"infer", "reward", "env"},
    "frameworks": {"infer", "reward", "env", "frameworks"},
    "data_synth": {"infer", "data_synth"},
    "train": {"infer", "train"},
}
#: floor -> the only modules it may import of a floor above the ground (the environment floor touches the
#: reward only through the episode it records)
ONLY = {"env": {"reward": {"keyshot.reward.episode"}}}
#: floors that may not import keyshot.infer's test room (fake servers, synthetic worlds)
NO_TESTING = {"reward", "env", "frameworks"}
#: floors whose packages are rooms side by side: a room imports no other room of its floor (one package
#: per RL framework); modules at the floor's top (``keyshot reward``'s command) may import any
SIDE_BY_SIDE = {"frameworks"}


def imported(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports, at the top or inside functions."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def violations(repo: Path) -> list[str]:
    """``file: imports module`` for every import that climbs a floor or a room, or leaves ``keyshot``."""
    found = []
    for floor, allowed in FLOORS.items():
        for path in sorted((repo / floor).rglob("*.py")):
            parts = path.relative_to(repo / floor).parts
            room = parts[0] if floor in ("infer", *SIDE_BY_SIDE) and len(parts) > 1 else None
            for name in sorted(imported(path)):
                top = name.split(".")
                if top[0] in (*FLOORS, "tests", "bench"):
                    found.append(f"{path.relative_to(repo)}: imports {name} (import keyshot.{name})")
                    continue
                if top[0] != "keyshot" or len(top) < 2:
                    continue
                if top[1] not in allowed:
                    found.append(
                        f"{path.relative_to(repo)}: imports {name} (floor {floor} is below {top[1]})"
                    )
                elif top[1] in ONLY.get(floor, {}) and name not in ONLY[floor][top[1]]:
                    found.append(
                        f"{path.relative_to(repo)}: imports {name} (floor {floor} may import only "
                        f"{', '.join(sorted(ONLY[floor][top[1]]))} of {top[1]})"
                    )
                elif floor in NO_TESTING and top[1:3] == ["infer", "testing"]:
                    found.append(
                        f"{path.relative_to(repo)}: imports {name} (the test room is for tests and bench)"
                    )
                elif (
                    room
                    and top[1] == "infer" == floor
                    and len(top) > 2
                    and top[2] in set(BELOW) - BELOW[room]
                ):
                    found.append(f"{path.relative_to(repo)}: imports {name} (room {room} is below {top[2]})")
                elif room and top[1] == floor in SIDE_BY_SIDE and len(top) > 2 and top[2] != room:
                    found.append(
                        f"{path.relative_to(repo)}: imports {name} (room {room} of {floor} imports no other room)"
                    )
    return found


def test_every_room_imports_only_the_rooms_below_it():
    assert violations(REPO) == []


def test_every_room_is_declared():
    rooms = {p.parent.name for p in (REPO / "infer").glob("*/__init__.py")}
    assert rooms == set(BELOW), "a new room of infer/ needs its place in BELOW (and in docs/architecture.md)"


def test_a_planted_upward_import_is_found(tmp_path):
    for floor in FLOORS:
        (tmp_path / floor).mkdir()
    (tmp_path / "infer" / "protocol").mkdir()
    (tmp_path / "infer" / "protocol" / "parsing.py").write_text(
        "def f():\n    from keyshot.infer.judge.pipeline import WebJudge\n"
    )
    (tmp_path / "infer" / "cli.py").write_text("import keyshot.data_synth.cli\n")
    (tmp_path / "train" / "recipe.py").write_text("from infer.protocol import parsing\n")
    (tmp_path / "env" / "page.py").write_text("from keyshot.reward.model import RewardModel\n")
    (tmp_path / "reward" / "model.py").write_text(
        "import keyshot.env.replay\nimport keyshot.infer.testing.worlds\n"
    )
    (tmp_path / "env" / "replay.py").write_text("from keyshot.frameworks.trl.env import ReplayEnv\n")
    (tmp_path / "frameworks" / "verl").mkdir()
    (tmp_path / "frameworks" / "verl" / "reward.py").write_text(
        "from keyshot.frameworks.trl.reward import environment_reward\nimport keyshot.env.miniwob.pool\n"
    )
    (tmp_path / "frameworks" / "command.py").write_text("import keyshot.frameworks.openenv.command\n")
    assert sorted(violations(tmp_path)) == [
        "env/page.py: imports keyshot.reward.model (floor env may import only keyshot.reward.episode of reward)",
        "env/replay.py: imports keyshot.frameworks.trl.env (floor env is below frameworks)",
        "frameworks/verl/reward.py: imports keyshot.frameworks.trl.reward (room verl of frameworks imports no "
        "other room)",
        "infer/cli.py: imports keyshot.data_synth.cli (floor infer is below data_synth)",
        "infer/protocol/parsing.py: imports keyshot.infer.judge.pipeline (room protocol is below judge)",
        "reward/model.py: imports keyshot.env.replay (floor reward is below env)",
        "reward/model.py: imports keyshot.infer.testing.worlds (the test room is for tests and bench)",
        "train/recipe.py: imports infer.protocol (import keyshot.infer.protocol)",
    ]


def test_bench_does_not_import_tests():
    found = {
        str(path.relative_to(REPO)): sorted(m for m in imported(path) if m.split(".")[0] == "tests")
        for path in sorted((REPO / "bench").rglob("*.py"))
    }
    assert not {k: v for k, v in found.items() if v}


def test_no_import_circles():
    """No module of keyshot imports itself back through others (imports inside functions count too)."""
    graph: dict[str, set[str]] = {}
    for floor in FLOORS:
        for path in (REPO / floor).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(("keyshot", *(parts[:-1] if parts[-1] == "__init__" else parts)))
            graph[name] = {d for d in imported(path) if d.startswith("keyshot.") and d != name}
    circles = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if dep not in graph:
                continue
            if state.get(dep) == 1:
                circles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


# --------------------------------------------------------------------------- what importing actually runs
#: Run in a fresh interpreter: import ``sys.argv[1]`` with ``os.register_at_fork`` recording who registers,
#: and print what it loaded, the fork hooks keyshot registered and OpenCV's thread count before and after.
_PROBE = """
import json, os, sys, traceback
hooks = []
real = os.register_at_fork
def recording(**kw):
    hooks.append(traceback.extract_stack(limit=2)[0].filename)
    real(**kw)
os.register_at_fork = recording
import cv2
threads = cv2.getNumThreads()
import importlib
importlib.import_module(sys.argv[1])
print(json.dumps({
    "modules": sorted(m for m in sys.modules if m.startswith("keyshot.")),
    "keyshot_fork_hooks": [h for h in hooks if "keyshot" in h or "/reward/" in h or "/infer/" in h],
    "opencv_threads": [threads, cv2.getNumThreads()],
}))
"""


def loaded_by(module: str) -> dict:
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _PROBE, module], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_the_environment_floor_loads_only_the_episode_of_the_reward_floor():
    """The environment floor's contract holds for what runs, not only for its import lines: importing an
    environment loads the reward floor's episode (and what the episode itself needs), never the model,
    the judge pipeline or a fork hook of theirs (importing keyshot.env.play used to load all three)."""
    episode = {m for m in loaded_by("keyshot.reward.episode")["modules"] if m.startswith("keyshot.reward")}
    for module in ("keyshot.env.play", "keyshot.env.replay", "keyshot.env.page"):
        probe = loaded_by(module)
        reward = {m for m in probe["modules"] if m.startswith("keyshot.reward")}
        assert reward <= episode, (module, sorted(reward - episode))
        assert not [m for m in probe["modules"] if m.startswith("keyshot.infer.judge")], module
        assert probe["keyshot_fork_hooks"] == [], module
    assert "keyshot.reward.model" not in episode and "keyshot.reward.shared" not in episode


def test_importing_the_image_decoder_leaves_opencv_as_it_was():
    """OpenCV's thread count is the process's own until keyshot first decodes a screenshot."""
    before, after = loaded_by("keyshot.infer.protocol.decode")["opencv_threads"]
    assert after == before
