"""Where the tests' inputs are: the repository, the fixtures (tests/fixtures/LICENSES.md) and the scripts
that run inside another framework's venv (tests/framework/)."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
FIXTURES = TESTS / "fixtures"
FRAMEWORK = TESTS / "framework"
