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
import importlib
import logging
import signal
import sys
from importlib.metadata import entry_points

from keyshot.infer.common.errors import EXIT_USAGE, Interrupted, KeyshotError, require_training_stack
from keyshot.infer.common.helptext import plain
from keyshot.infer.common.logs import setup_logging

#: Entry-point group of the subcommands: each names a module whose ``add_parser(subparsers)`` registers
#: one subcommand and sets ``func`` (pyproject.toml lists them; a plug-in package may add its own).
COMMANDS_GROUP = "keyshot.commands"
#: What the terminal says when a command is stopped by a signal, unless the command sets its own ``on_stop``
#: (``p.set_defaults(on_stop=...)``: a service has nothing to resume).
RESUMABLE = "what was finished is saved, re-run the same command to resume"


def subcommand_modules() -> list[str]:
    """The modules that register subcommands, as the installed package declares them."""
    found = [ep.value for ep in entry_points(group=COMMANDS_GROUP)]
    if not found:
        raise SystemExit(
            "keyshot: no subcommands are registered: install the package (pip install -e . from a checkout)"
        )
    return found


def _add_tiny_model(subparsers) -> None:
    p = subparsers.add_parser(
        "tiny-model", help="build a tiny random Qwen2.5-VL (tests, CPU demo; untrained)"
    )
    p.add_argument("out")
    p.add_argument("--seed", type=int, default=0)

    def run(args) -> int:
        require_training_stack("keyshot tiny-model")
        from keyshot.infer.model.tiny_model import build_tiny_qwen25vl

        print(build_tiny_qwen25vl(args.out, seed=args.seed))
        return 0

    p.set_defaults(func=run)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keyshot", description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true", help="show tracebacks of errors")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in subcommand_modules():
        importlib.import_module(name).add_parser(subparsers)
    _add_tiny_model(subparsers)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """Parse, taking positional items anywhere on the line: ``judge TRAJ --config X.yaml key=value``.

    argparse stops filling a subcommand's positional list once an option follows it; the items it
    leaves over go back to that list (``items`` of judge: paths and overrides; ``overrides`` of the
    others). One override syntax for every command: ``key.sub=value``, after or among the options.
    """
    args, extras = parser.parse_known_args(argv)
    items = [a for a in extras if not a.startswith("-")]
    target = next(
        (name for name in ("items", "overrides") if isinstance(getattr(args, name, None), list)), None
    )
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
    args = parse(build_parser(), argv)
    setup_logging(logging.DEBUG if args.verbose else logging.INFO)
    previous = {s: signal.signal(s, _interrupt) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return int(args.func(args) or 0)
    except (KeyboardInterrupt, Interrupted) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        print(
            f"keyshot {args.command}: stopped by {signal.Signals(signum).name}; "
            + getattr(args, "on_stop", RESUMABLE),
            file=sys.stderr,
        )
        return 128 + signum
    except KeyshotError as exc:
        if args.debug:
            raise
        print(f"keyshot {args.command}: error: {exc}", file=sys.stderr)
        return getattr(exc, "exit_code", EXIT_USAGE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum, frame) -> None:
    """SIGTERM/SIGINT: unwind through every ``finally`` (servers stopped, files flushed), then exit 128+N."""
    raise Interrupted(signum)


if __name__ == "__main__":
    sys.exit(main())
