"""--help shows prose, not reST: module docstrings double as help texts, so their markup goes."""

from __future__ import annotations

import argparse
import re


def plain(text: str | None) -> str | None:
    """``code`` → code, :class:`X` → X, a ``::`` literal-block marker → ``:``."""
    if not text:
        return text
    text = re.sub(r":(?:class|func|mod|meth|data|attr):`~?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("::\n", ":\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """keyshot's --help: the description as written, and each option's default after its help, where it
    has one worth saying (not None, False or empty) and its help does not say it already."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            default in (None, False, "", [], ())
            or default is argparse.SUPPRESS
            or "default" in text.lower()
            or isinstance(action, argparse._HelpAction | argparse._VersionAction)
        ):
            return action.help
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"
