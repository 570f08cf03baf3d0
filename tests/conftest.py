"""Shared fixtures: a tiny random Qwen2.5-VL built offline once per session, the shared vLLM scorer, and
the reward tests' fake servers and reset of the process-wide models (tests/support/reward.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.paths import FIXTURES, TESTS

# The shared vLLM scorer server (one per session) and its checkpoint, for every test module.
from tests.support.vllm import scorer_checkpoint, vllm_server  # noqa: F401

# Fixtures of tests/support/ for every module: the reward tests' fake servers, their config and the reset of
# the process-wide reward models (tests/support/reward.py); the tiny model's labelled training batch
# (tests/support/tiny_model.py).
pytest_plugins = ("tests.support.reward", "tests.support.tiny_model")


# Keep third-party caches and sockets out of $HOME and away from other runs.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny random Qwen2.5-VL (fp32): config, weights, tokenizer, processor, chat template."""
    from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

    return build_tiny_qwen25vl(tmp_path_factory.mktemp("tiny-qwen25vl"), seed=0)


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """Forget accelerate's process-wide state after each test that set it. A test that runs a trainer in
    process (TRL's GRPOTrainer in bf16, the training recipe) leaves AcceleratorState set, and the next
    `Accelerator(mixed_precision=...)` with other settings in the same worker is refused; accelerate's own
    tests reset it the same way."""
    yield
    import sys

    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


# ---------------------------------------------------------------------------- running side by side
# `make test` runs the suite in pytest-xdist workers (`-n 3 --dist loadgroup`; `-n N` alone gets loadgroup
# too, below): most slow tests wait on a server, a launcher or a browser, so three workers keep two cores
# busy. The unit of work is a module (its module-scoped servers and studies are built once), except that
# modules sharing a session-wide resource run on one worker: every test of the shared vLLM server (one server,
# not one per worker) and the OpenEnv venv's tests (one set of its browsers). Every test is marked
# `xdist_group(<its work unit>)`, so loadgroup hands a worker whole work units. Work units start longest
# first, by the totals in tests/durations.json (`--record-durations` rewrites it from a passing run), so the
# last to end is short.
SHARED = {
    "vllm": {
        "e2e/test_demo",
        "infer/judge/test_judge_command",
        "infer/judge/test_pipeline",
        "infer/judge/test_scorer_parity",
        "infer/serve/test_serve",
        "reward/test_trl",
    },
    "openenv": {
        "reward/test_openenv_rubric",
        "env/test_openenv_server",
        "env/test_step_rewards_live",
        "env/test_trl_browsergym_example",
    },
}
DURATIONS = TESTS / "durations.json"


def module_of(nodeid: str) -> str:
    """A test's module as tests/durations.json and SHARED name it: its path under tests/, without .py
    (``infer/judge/test_pipeline``)."""
    path = Path(nodeid.split("::", 1)[0]).with_suffix("")
    parts = path.parts[path.parts.index("tests") + 1 :] if "tests" in path.parts else path.parts
    return "/".join(parts)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared group its module is in."""
    module = module_of(nodeid)
    return next((group for group, modules in SHARED.items() if module in modules), module)


def write_durations(how: str, units: list[dict]) -> None:
    """tests/durations.json: how it was made, then one work unit a line (longest first)."""
    lines = ",\n".join(f"  {json.dumps(unit)}" for unit in units)
    DURATIONS.write_text(f'{{\n "how": {json.dumps(how)},\n "units": [\n{lines}\n ]\n}}\n')


def recorded_order() -> dict[str, int]:
    """Each work unit's place in tests/durations.json (longest first); {} without the file."""
    if not DURATIONS.is_file():
        return {}
    units = json.loads(DURATIONS.read_text())["units"]
    return {unit["name"]: i for i, unit in enumerate(units)}


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="rewrite tests/durations.json with each work unit's total seconds when the run passes (run it "
        "with the whole suite: `make test TEST_ARGS=--record-durations`)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test with its work unit's xdist_group, order the work units longest first (units not in
    tests/durations.json after the others, in collection order), and refuse a module that uses the shared
    vLLM server without being in its group (it would start a second server on another worker)."""
    strays = sorted(
        {module_of(item.nodeid) for item in items if "vllm_server" in item.fixturenames} - SHARED["vllm"]
    )
    if strays:
        raise pytest.UsageError(
            f"tests/conftest.py: add {', '.join(strays)} to SHARED['vllm'] (they use vllm_server)"
        )
    for item in items:
        item.add_marker(pytest.mark.xdist_group(work_unit(item.nodeid)))
    rank = recorded_order()
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(work_unit(item.nodeid), len(rank)), order[id(item)]))


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`-n N` without `--dist` is `--dist loadgroup` here (pytest-xdist's default, `load`, would spread a
    module's tests, and the shared servers, over every worker); a `--dist` given is kept."""
    if getattr(config.option, "dist", None) == "no" and getattr(config.option, "numprocesses", None):
        config.option.dist = "loadgroup"


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup`, with each test's group put where the scheduler reads it. pytest-xdist's worker
    adds a test's group to the node id it reports (`path::test@group`), and with pytest >= 9.2 that
    change no longer takes effect (pytest's node ids are structured now; pytest-xdist issue 1386, open
    with 3.8.0): every test would be a unit of its own. The group suffix (the scheduler's documented
    format) is added here from the same work_unit() that marked the test, unless the id already has
    one. Other `--dist` modes are pytest-xdist's own."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    config.option.loadscopereorder = False  # tests/durations.json's order, not the largest count first
    scheduler = LoadGroupScheduling(config, log)
    add_node_collection = scheduler.add_node_collection

    def with_groups(node, collection):
        add_node_collection(
            node, [i if i.rfind("@") > i.rfind("]") else f"{i}@{work_unit(i)}" for i in collection]
        )

    scheduler.add_node_collection = with_groups
    return scheduler


# ---------------------------------------------------------------------------- recorded durations
_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    """Each work unit's seconds, setup, call and teardown (in xdist's controller, from the workers' reports;
    module- and session-scoped fixtures count in the first test's setup)."""
    unit = work_unit(report.nodeid)
    _seconds[unit] = _seconds.get(unit, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if not config.getoption("record_durations") or hasattr(config, "workerinput"):
        return
    say = config.pluginmanager.get_plugin("terminalreporter").write_line
    if exitstatus != 0 or not _seconds:
        say(f"tests/durations.json not rewritten: the run did not pass (exit {int(exitstatus)})")
        return
    units = sorted(_seconds.items(), key=lambda unit: -unit[1])
    how = (
        "pytest --record-durations (tests/conftest.py): each work unit's total seconds (setup, call, teardown "
        "of its tests) in the last recorded run, longest first; the order xdist workers take them in"
    )
    write_durations(how, [{"name": name, "seconds": round(seconds, 1)} for name, seconds in units])
    say(f"tests/durations.json: {len(units)} work units recorded")
