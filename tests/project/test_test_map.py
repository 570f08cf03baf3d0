"""A module's tests can be found (issue 63, point 6): tests/test_map.toml names, for every module of the
package's floors, the test files that exercise it. This keeps the map whole and its files real; a failure
says, one line per module, which entry to add, remove or correct."""

from __future__ import annotations

import tomllib

from tests.support import paths

REPO = paths.REPO
MAP = REPO / "tests" / "test_map.toml"
FLOORS = ("infer", "data_synth", "train", "reward", "env", "frameworks")


def library_modules() -> set[str]:
    """Every module of the floors (their ``__init__.py`` docstrings aside; the demo's sample data aside)."""
    return {
        p.relative_to(REPO).as_posix()
        for floor in FLOORS
        for p in (REPO / floor).rglob("*.py")
        if p.name != "__init__.py" and "samples" not in p.relative_to(REPO).parts
    }


def map_problems(entries: dict, modules: set[str]) -> list[str]:
    """One line per module whose entry is missing, stale or names a file that is no test module."""
    problems = [
        f'{m}: no entry in tests/test_map.toml; add the line "{m}" = ["tests/.../test_NAME.py"] naming the '
        "test files that exercise it"
        for m in sorted(modules - set(entries))
    ]
    problems += [
        f"tests/test_map.toml: {m} is no module of {', '.join(FLOORS)} now; remove its line or give its new path"
        for m in sorted(set(entries) - modules)
    ]
    for module, tests in sorted(entries.items()):
        if not isinstance(tests, list) or not tests:
            problems.append(
                f"tests/test_map.toml: {module} names no test file; list the tests that exercise it"
            )
            continue
        for test in tests:
            path = REPO / test
            if not (path.is_file() and path.name.startswith("test_") and test.startswith("tests/")):
                problems.append(f"tests/test_map.toml: {module} names {test}, which is no test module here")
    return problems


def test_every_library_module_has_its_tests_named():
    entries = tomllib.loads(MAP.read_text())
    modules = library_modules()
    assert len(modules) > 150
    problems = map_problems(entries, modules)
    assert not problems, "\n" + "\n".join(problems)


def test_the_map_says_what_is_wrong_in_one_line_a_module(tmp_path):
    """What a merge meets: a new module without a line, a line of a module moved away, a test renamed."""
    modules = {"infer/judge/run.py", "reward/per_step.py"}
    entries = {
        "infer/judge/run.py": ["tests/infer/judge/test_no_such_file.py"],
        "reward/gone.py": ["tests/reward/test_reward_core.py"],
    }
    problems = map_problems(entries, modules)
    assert problems == [
        'reward/per_step.py: no entry in tests/test_map.toml; add the line "reward/per_step.py" = '
        '["tests/.../test_NAME.py"] naming the test files that exercise it',
        "tests/test_map.toml: reward/gone.py is no module of infer, data_synth, train, reward, env, frameworks "
        "now; remove its line or give its new path",
        "tests/test_map.toml: infer/judge/run.py names tests/infer/judge/test_no_such_file.py, which is no test "
        "module here",
    ]
