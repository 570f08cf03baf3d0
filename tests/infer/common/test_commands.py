"""The command layer: one way to declare a command, one place that turns an error into its line and exit
code, one ``--serve-scorer`` for every command that takes it, one override syntax."""

from __future__ import annotations

import argparse

import pytest

from keyshot.infer.cli import build_parser, parse, run_parsed
from keyshot.infer.cli import main as keyshot
from keyshot.infer.common.command import COMMANDS_GROUP, Command, loaded_commands
from keyshot.infer.common.errors import EXIT_ENDPOINT_DOWN, EndpointDownError, KeyshotError, RunStopError
from tests.support.reward import write_config

#: a port nothing answers on (the discard port): an endpoint that is down
DOWN = "http://127.0.0.1:9/v1"


def test_every_subcommand_is_a_declared_command():
    commands = {c.name: c for c in loaded_commands(COMMANDS_GROUP)}
    assert {
        "judge",
        "serve",
        "metrics",
        "merge",
        "report",
        "reward",
        "synth",
        "merge-lora",
        "tiny-model",
    } <= set(commands)
    assert all(isinstance(c, Command) for c in commands.values())
    reward = build_parser().parse_args(["reward", "serve", "--config", "c.yaml"])
    assert reward.handler.__name__ == "run_serve" and "in flight" in reward.on_stop


def _run(command: Command, argv: list[str], debug: bool = False) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    command.register(parser.add_subparsers(dest="command", required=True))
    return run_parsed(parser.parse_args([*(["--debug"] if debug else []), command.name, *argv]))


def test_a_run_stop_is_a_keyshot_error_with_its_line_and_code(capsys):
    """RunStopError (an endpoint down, a spent budget, cut answers) sat outside KeyshotError: a command had
    to catch it apart. It is one, and the one handler prints it as one line with its code."""
    assert issubclass(RunStopError, KeyshotError)

    def down(args) -> int:
        raise EndpointDownError("judge", DOWN, 8, "connection refused")

    assert _run(Command("probe", help="h", run=down), []) == EXIT_ENDPOINT_DOWN
    err = capsys.readouterr().err.strip()
    assert err.startswith("keyshot probe: error: endpoint 'judge' at") and "\n" not in err


def test_anything_else_is_a_bug_with_its_traceback():
    """No command turns a ValueError into a usage error (three did): it reaches the top as the bug it is."""

    def bug(args) -> int:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        _run(Command("probe", help="h", run=bug), [])


def test_debug_shows_the_traceback_of_a_user_error():
    def wrong(args) -> int:
        raise KeyshotError("wrong input")

    with pytest.raises(KeyshotError):
        _run(Command("probe", help="h", run=wrong), [], debug=True)


def test_set_is_refused_by_every_command_with_the_one_override_syntax(tmp_path, capsys):
    """``keyshot reward`` re-added ``--set`` that every other command refuses."""
    with pytest.raises(SystemExit) as stop:
        keyshot(["reward", "serve", "--config", str(tmp_path / "c.yaml"), "--set", "judge.model=x"])
    assert stop.value.code == 2
    assert "overrides are written key=value, without --set" in capsys.readouterr().err


def _parsed(command: Command, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.register(parser.add_subparsers(dest="command", required=True))
    return parse(parser, [command.name, *argv])


def test_a_command_takes_overrides_only_where_it_declares_them(capsys):
    """infer/cli.py gave the line's key=value items to whichever positional list was named ``items`` or
    ``overrides``: a command with a list of another name lost them, one with a list of those names for
    something else got them. A command declares the list (``Command(overrides=...)``), by any name."""

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("settings", nargs="*")
        p.add_argument("--config")

    declared = Command("probe", help="h", run=lambda args: 0, arguments=arguments, overrides="settings")
    args = _parsed(declared, ["a=1", "--config", "c.yaml", "b.c=2"])
    assert args.settings == ["a=1", "b.c=2"] and args.config == "c.yaml"

    def named_items(p: argparse.ArgumentParser) -> None:
        p.add_argument("items", nargs="*")  # not overrides: the old parser took key=value items into it
        p.add_argument("--config")

    undeclared = Command("probe", help="h", run=lambda args: 0, arguments=named_items)
    with pytest.raises(SystemExit):
        _parsed(undeclared, ["x", "--config", "c.yaml", "a=1"])
    assert "unrecognized arguments: a=1" in capsys.readouterr().err

    wrong = Command("probe", help="h", run=lambda args: 0, arguments=named_items, overrides="settings")
    with pytest.raises(TypeError, match="declares overrides='settings' but its arguments have no"):
        _parsed(wrong, [])


def test_every_synth_subcommand_runs_its_own_function():
    """``keyshot synth``'s five subcommands all ran one ``_dispatch`` that chose again by name."""
    from keyshot.data_synth.cli import COMMAND as SYNTH

    runs = {c.name: c.run for c in SYNTH.subcommands}
    assert set(runs) == {"run", "merge", "import-arb", "import-reference", "build"}
    assert len(set(runs.values())) == len(runs)
    overrides = {c.name: c.overrides for c in SYNTH.subcommands}
    assert overrides == {
        "run": "overrides",
        "merge": "items",
        "import-arb": None,
        "import-reference": None,
        "build": "items",
    }


def _error(capsys, argv: list[str]) -> tuple[int, str]:
    code = keyshot(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if ": error: " in line]
    assert len(lines) == 1, lines
    return code, lines[0].split(": error: ", 1)[1]


def test_serve_scorer_is_one_implementation_in_judge_and_reward_serve(tmp_path, capsys):
    """``keyshot reward serve --serve-scorer osunlp/WebJudge-7B`` refused the hub id that ``keyshot judge``
    takes ("not a model checkpoint (no such folder)"): both now take a folder or a hub id, and refuse a
    missing folder with the same line."""
    config = write_config(tmp_path / "reward.yaml", DOWN, on_failure="zero")
    serve = ["reward", "serve", "--config", str(config), "--port", "0", "--allow-root", str(tmp_path)]
    judge = ["judge", str(tmp_path), "--config", str(config), f"out={tmp_path / 'out'}"]
    no_vllm = ["scorer.serve.vllm_python=/nonexistent/python"]  # nothing starts, wherever it gets to

    missing = str(tmp_path / "no-such-run" / "final")
    served_code, served = _error(capsys, [*serve, "--serve-scorer", missing, *no_vllm])
    judged_code, judged = _error(capsys, [*judge, "--serve-scorer", missing, *no_vllm])
    assert served_code == judged_code == 2
    assert served == judged and "not a model checkpoint (no such folder)" in served

    code, said = _error(capsys, [*serve, "--serve-scorer", "osunlp/WebJudge-7B", *no_vllm])
    assert code == 2 and "not a model checkpoint" not in said and "no such folder" not in said
    # taken as a hub id: refused only where the server is planned or started (offline: the hub; else vLLM)
    assert "osunlp/WebJudge-7B" in said or "has no vLLM" in said, said


def test_the_vllm_interpreter_is_found_by_one_rule(tmp_path, monkeypatch):
    """keyshot serve (serve/plan.py) and the demo (demo.py) looked for vLLM's python by two rules: the
    demo found .venv-vllm beside this environment, every command only $KEYSHOT_VLLM_PYTHON or this one."""
    import sys

    from keyshot.infer import demo
    from keyshot.infer.serve import plan

    monkeypatch.delenv(plan.ENV_VLLM_PYTHON, raising=False)
    beside = tmp_path / ".venv-vllm" / "bin" / "python"
    beside.parent.mkdir(parents=True)
    beside.write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path / ".venv"))
    found = plan.vllm_python()
    assert found == demo.default_vllm_python()
    assert found == (sys.executable if plan.importlib.util.find_spec("vllm") else str(beside))
    monkeypatch.setenv(plan.ENV_VLLM_PYTHON, "/opt/vllm/bin/python")
    assert plan.vllm_python() == demo.default_vllm_python() == "/opt/vllm/bin/python"
    assert plan.vllm_python("/configured/python") == "/configured/python"


def test_the_demo_ends_through_the_one_command_layer(tmp_path, monkeypatch, capsys):
    """``python -m keyshot.infer.demo`` (``make demo``) built its own parser and printed its own error line;
    it is a :class:`Command` run by ``run_alone``: a KeyshotError is one ``keyshot demo: error:`` line and
    its code, a signal is 128+N with what was kept, and its flags are as before."""
    import signal

    from keyshot.infer import demo
    from keyshot.infer.common.errors import Interrupted

    assert isinstance(demo.COMMAND, Command) and demo.COMMAND.name == "demo"

    def refused(folder):
        raise KeyshotError(f"{folder}: no room for the tiny model")

    monkeypatch.setattr(demo, "tiny_checkpoint", refused)
    argv = ["--out", str(tmp_path), "--samples", str(tmp_path), "--agent", "A", "--vllm-python", "/x/python"]
    assert demo.main(argv) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("keyshot demo")]
    assert errors == [f"keyshot demo: error: {tmp_path / 'tiny-qwen25vl'}: no room for the tiny model"]

    def stopped(folder):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(demo, "tiny_checkpoint", stopped)
    assert demo.main(["--out", str(tmp_path)]) == 128 + signal.SIGTERM
    assert "keyshot demo: stopped by SIGTERM" in capsys.readouterr().err
