"""Shared fixtures: a tiny random Qwen2.5-VL built offline once per session, the shared vLLM scorer, and
the reward tests' fake servers and reset of the process-wide models (tests/support/reward.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The shared vLLM scorer server (one per session) and its checkpoint, for every test module.
from tests.support.vllm import scorer_checkpoint, vllm_server  # noqa: F401

# Fixtures of tests/support/ for every module: the reward tests' fake servers, their config and the reset of
# the process-wide reward models (tests/support/reward.py).
pytest_plugins = ("tests.support.reward",)

FIXTURES = Path(__file__).parent / "fixtures"

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


# ---------------------------------------------------------------------------- running side by side
# `make test` runs the suite in pytest-xdist workers (`-n 3`): most slow tests wait on a server, a launcher or
# a browser, so three workers keep two cores busy. The unit of work is a module (its module-scoped servers
# and studies are built once), except that modules sharing a session-wide resource run on one worker: every
# test of the shared vLLM server (one server, not one per worker) and the OpenEnv venv's tests (one set of
# its browsers). pytest-xdist's own `--dist loadgroup` cannot be used: with pytest 9 its marks no longer
# reach the scheduler (pytest-xdist issue 1386), so the scheduler below reads the module from the test id.
# Modules start longest first (a measured run: docs/contributing.md, "Tests"), so the last to end is short.
SHARED = {
    "vllm": {
        "test_demo_constrained",
        "test_judge_cli",
        "test_pipeline",
        "test_reward_trl",
        "test_scorer_parity",
        "test_serve",
    },
    "openenv": {"test_openenv", "test_openenv_server", "test_openenv_trl"},
}
LONGEST_FIRST = (
    "test_train_run",
    "vllm",
    "test_orphans",
    "test_live_browser",
    "test_real_data",
    "test_reward_verl",
    "test_bad_input_cli",
    "test_slurm",
    "test_checkpoint_description",
    "openenv",
    "test_agentlab_study",
    "test_reward",
    "test_bench_reward",
    "test_faults",
    "test_reward_examples",
)


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the shared group its module is in."""
    module = Path(nodeid.split("::", 1)[0]).stem
    return next((group for group, modules in SHARED.items() if module in modules), module)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the order below (longest first), not the largest count
    return WorkUnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Order the work units longest first, and refuse a module that uses the shared vLLM server without
    being in its group (it would start a second server on another worker)."""
    strays = sorted({item.path.stem for item in items if "vllm_server" in item.fixturenames} - SHARED["vllm"])
    if strays:
        raise pytest.UsageError(
            f"tests/conftest.py: add {', '.join(strays)} to SHARED['vllm'] (they use vllm_server)"
        )
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (rank.get(work_unit(item.nodeid), len(rank)), order[id(item)]))
