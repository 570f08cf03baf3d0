"""Shared fixtures: a tiny random Qwen2.5-VL built offline once per session, the shared vLLM scorer, and
the reward tests' fake servers and reset of the process-wide models (tests/support/reward.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# The reward tests' fake judge and scorer, and the reset of the process-wide reward models.
from tests.support.reward import no_shared_model, servers  # noqa: F401

# The shared vLLM scorer server (one per session) and its checkpoint, for every test module.
from tests.support.vllm import scorer_checkpoint, vllm_server  # noqa: F401

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
