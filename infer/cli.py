"""``keyshot``: one command, one subcommand per job.

    keyshot judge TRAJ_DIR --config configs/judge/X.yaml   # WebJudge over trajectory folders
    keyshot serve --config configs/serve/X.yaml           # vLLM for a scorer checkpoint
    keyshot metrics OUT/verdicts.jsonl --human-labels F   # agreement / precision / recall
    keyshot merge OUT                                     # join the shards of judge --shard I/N
    keyshot report OUT                                    # a browsable HTML report of a judged run
    keyshot reward filter ROLLOUTS --config C --out OUT   # rejection sampling: keep rollouts judged successes
    keyshot reward serve --config configs/reward/X.yaml   # the reward service (OpenRLHF, verl, any HTTP client)
    keyshot synth run --config configs/synth/X.yaml       # distil a scorer dataset from teachers
    keyshot merge-lora ADAPTER --out MERGED               # LoRA adapter -> servable checkpoint
    keyshot tiny-model OUT                                # tiny random Qwen2.5-VL (tests, demo)

Training is ``accelerate launch train/sft.py --config …`` (see the README).
"""

from __future__ import annotations

import argparse
import difflib
import logging
import signal
import sys
from importlib.metadata import PackageNotFoundError, version

from keyshot.infer.common.command import COMMANDS_GROUP, OVERRIDES_INTO, Command, loaded_commands
from keyshot.infer.common.errors import Interrupted, closed_output_exit, error_exit, output_closed
from keyshot.infer.common.helptext import HelpFormatter, plain
from keyshot.infer.common.logs import setup_logging


def subcommands() -> list[Command]:
    """keyshot's subcommands, as the installed package declares them."""
    found = loaded_commands(COMMANDS_GROUP)
    if not found:
        raise SystemExit(
            "keyshot: no subcommands are registered: install the package (pip install -e . from a checkout)"
        )
    return sorted(found, key=lambda c: c.name)


def installed_version() -> str:
    """The installed keyshot's version (its package metadata)."""
    try:
        return version("keyshot")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e . from a checkout)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyshot", description=plain(__doc__), formatter_class=HelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    parser.add_argument("--version", action="version", version=f"keyshot {installed_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in subcommands():
        command.register(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, taking positional items anywhere on the line: ``judge TRAJ --config X.yaml key=value``.

    argparse stops filling a subcommand's positional list once an option follows it; the items it
    leaves over go to the list the chosen command declares for them (:attr:`Command.overrides`), and
    are refused where it declares none. One override syntax for every command: ``key.sub=value``, after
    or among the options.
    """
    args, extras = parser.parse_known_args(argv)
    items = [a for a in extras if not a.startswith("-")]
    target = getattr(args, OVERRIDES_INTO, None)
    unknown = [a for a in extras if a.startswith("-")] + (items if target is None else [])
    if unknown:
        command = chosen_parser(parser, argv if argv is not None else sys.argv[1:])
        hint = " (overrides are written key=value, without --set)" if "--set" in unknown else ""
        hint += "".join(
            f" (did you mean {close}?)"
            for flag in unknown
            if flag != "--set" and (close := closest_option(command, flag))
        )
        command.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    if target is not None:
        getattr(args, target).extend(items)
    return args


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }


def chosen_parser(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)subcommand ``argv`` names (``synth run`` → its parser), so that its
    usage, not the top level's, goes with an error about its arguments."""
    for item in argv:
        sub = _subcommands(parser).get(item)
        if sub is not None:
            parser = sub
    return parser


def closest_option(parser: argparse.ArgumentParser, flag: str) -> str | None:
    """The option of ``parser`` a mistyped flag most likely meant (``--confg`` → ``--config``)."""
    if not flag.startswith("--"):
        return None
    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    close = difflib.get_close_matches(flag.split("=", 1)[0], options, n=1, cutoff=0.6)
    return close[0] if close else None


def main(argv: list[str] | None = None) -> int:
    """``keyshot``: parse, then run the chosen command under keyshot's signal and error handling."""
    return run_parsed(parse(build_parser(), argv))


def run_alone(command: Command, argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run one command as a program of its own (``python -m keyshot.train.sft``, what ``accelerate
    launch`` starts; ``python -m keyshot.data_synth.cli``) with the same parsing, signals, error lines and
    exit codes as under ``keyshot``; its error lines name it ``keyshot NAME``."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=plain(command.description or command.help),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    command.configure(parser).set_defaults(command=command.name)
    return run_parsed(parse(parser, sys.argv[1:] if argv is None else argv))


def run_parsed(args: argparse.Namespace) -> int:
    """The one place a command's outcome becomes an exit code: its return value; a signal's 128+N with
    one line saying what was kept; a :class:`~keyshot.infer.common.errors.KeyshotError`'s one line and
    code (:func:`~keyshot.infer.common.errors.error_exit`); a closed output (``| head``), quietly, 141
    (:func:`~keyshot.infer.common.errors.closed_output_exit`). Anything else is a bug and keeps its
    traceback (exit 1)."""
    code = None
    try:
        code = _outcome(args)
        sys.stdout.flush()  # a closed output shows here, not in the flush at exit
        return code
    except BrokenPipeError:
        if not output_closed():  # a socket's, say: a bug like any other
            raise
        closed = closed_output_exit()
        return code or closed


def _outcome(args: argparse.Namespace) -> int:
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return int(args.handler(args) or 0)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(
            f"keyshot {args.command}: stopped by {signal.Signals(signum).name}; {args.on_stop}",
            file=sys.stderr,
        )
        return 128 + signum
    except Exception as exc:
        return error_exit(exc, f"keyshot {args.command}", debug=args.debug)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    """SIGTERM/SIGINT: unwind through every ``finally`` (servers stopped, files flushed), then exit 128+N."""
    raise Interrupted(signum)


if __name__ == "__main__":
    sys.exit(main())
