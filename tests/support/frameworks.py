"""A framework venv's python for a test (keyshot.infer.testing.frameworks), or the test skipped with the
line that says how to build the venv."""

from __future__ import annotations

import pytest

from keyshot.infer.testing import frameworks


def python_or_skip(framework: str, flavour: str = "") -> str:
    """:func:`keyshot.infer.testing.frameworks.framework_python`; skips the test, naming the set-up, when
    it is not built."""
    missing = frameworks.missing(framework, flavour)
    if missing:
        pytest.skip(missing)
    return str(frameworks.framework_python(framework, flavour))
