"""The one way a keyshot command is declared: a :class:`Command` (name, help, arguments, run, or
subcommands), named by an entry point. :mod:`keyshot.infer.cli` parses the line and runs the chosen
command under keyshot's signal and error handling; a command module holds only its arguments and the
call of the library code that does the job (docs/architecture.md, "The command layer").
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from keyshot.infer.common.helptext import HelpFormatter, plain

#: Entry-point group of the subcommands: each names a :class:`Command` (``module:NAME``); pyproject.toml
#: lists keyshot's own, and a plug-in package may add its own.
COMMANDS_GROUP = "keyshot.commands"
#: What the terminal says when a command is stopped by a signal, unless its :class:`Command` says what
#: else (``on_stop``: a service has nothing to resume).
RESUMABLE = "what was finished is saved, re-run the same command to resume"
#: The parsed namespace's entry naming where the chosen command takes its key=value items (its
#: :attr:`Command.overrides`; None: nowhere).
OVERRIDES_INTO = "overrides_into"


@dataclass(frozen=True)
class Command:
    """One keyshot (sub)command, the one way a command is registered.

    A command module declares one at its end (``COMMAND = Command("report", help=..., arguments=...,
    run=...)``) and the ``keyshot.commands`` entry points name it; a command with subcommands lists them
    (``subcommands``: ``keyshot reward``'s are gathered by keyshot.frameworks.command, on the floor that
    may import all of them). ``arguments(parser)`` adds the command's
    arguments, ``run(args)`` does the job and returns the exit code. Errors, signals and exit codes are not
    the command's business: :func:`main` turns them into one line and a code
    (:func:`keyshot.infer.common.errors.error_exit`). A command that takes ``key=value`` overrides says
    so: ``overrides`` names the dest of its positional list (``nargs="*"`` or ``"+"``) that receives the
    items found anywhere on the line; a command without it takes none (``--set`` is never one)."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int | None] | None = None
    arguments: Callable[[argparse.ArgumentParser], object] | None = None
    description: str | None = None
    on_stop: str = RESUMABLE
    subcommands: tuple[Command, ...] = ()
    overrides: str | None = None

    def register(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add this command (and its subcommands) to ``subparsers``."""
        parser = subparsers.add_parser(
            self.name,
            help=self.help,
            description=plain(self.description or self.help),
            formatter_class=HelpFormatter,
        )
        return self.configure(parser)

    def configure(self, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Give ``parser`` this command's arguments, subcommands and what runs it."""
        if self.arguments is not None:
            self.arguments(parser)
        if self.overrides is not None and not any(
            a.dest == self.overrides and not a.option_strings and a.nargs in ("*", "+")
            for a in parser._actions
        ):
            raise TypeError(
                f"command {self.name!r} declares overrides={self.overrides!r} but its arguments have no "
                "positional list of that name (nargs='*' or '+')"
            )
        parser.set_defaults(handler=self.run, on_stop=self.on_stop, **{OVERRIDES_INTO: self.overrides})
        if self.subcommands:
            sub = parser.add_subparsers(dest=f"{self.name}_command", metavar="ACTION", required=True)
            for child in self.subcommands:
                child.register(sub)
        elif self.run is None:
            raise TypeError(f"command {self.name!r} has neither run nor subcommands")
        return parser


def loaded_commands(group: str) -> list[Command]:
    """The :class:`Command` objects the installed packages declare under entry-point ``group``."""
    found = []
    for entry in entry_points(group=group):
        command = entry.load()
        if not isinstance(command, Command):
            raise TypeError(f"entry point {entry.name} = {entry.value} ({group}) is not a keyshot Command")
        found.append(command)
    return found
