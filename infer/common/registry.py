"""Named things that grow (trajectory formats, scorer back-ends, prompt sets): each kind has one
:class:`Registry`, its members register themselves by name where they are defined, and the code that
picks one by name asks the registry. A name registered twice is refused (:class:`DuplicateName`, at
import: two modules claim it); an unknown name is refused with the known ones listed
(:class:`UnknownName`, a :class:`~keyshot.infer.common.config.ConfigError`: it comes from a config or
the command line)::

    SCORER_BACKENDS = Registry("scorer back-end", "scorer.backend")

    @SCORER_BACKENDS.register("transformers")
    def in_process(cfg, ...): ...

    SCORER_BACKENDS.get(cfg.scorer.backend)   # UnknownName: "unknown scorer back-end 'x' (scorer.backend);
                                               # known: none, openai, transformers"
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from keyshot.infer.common.config import ConfigError

T = TypeVar("T")


class DuplicateName(ValueError):
    """Two members claim one name of a registry."""


class UnknownName(ConfigError):
    """A name no member of the registry has."""


class Registry(Generic[T]):
    """Members of one kind by name, in the order they registered. ``kind`` names them in errors ("trajectory
    format"); ``setting``, where set, is where a user names one (a config key or an option)."""

    def __init__(self, kind: str, setting: str | None = None):
        self.kind = kind
        self.setting = setting
        self._members: dict[str, T] = {}

    def add(self, name: str, member: T) -> T:
        """Register ``member`` as ``name``; :class:`DuplicateName` when the name is taken."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"a {self.kind}'s name is a non-empty string, got {name!r}")
        if name in self._members:
            raise DuplicateName(
                f"{self.kind} {name!r} is registered already (by {_origin(self._members[name])}); "
                f"{_origin(member)} must take another name"
            )
        self._members[name] = member
        return member

    def register(self, *names: str) -> Callable[[T], T]:
        """A decorator registering what it decorates under each of ``names``."""

        def decorate(member: T) -> T:
            for name in names:
                self.add(name, member)
            return member

        return decorate

    def get(self, name: str) -> T:
        """The member registered as ``name``; :class:`UnknownName`, listing the known names, when none is."""
        try:
            return self._members[name]
        except (KeyError, TypeError):
            raise self.unknown(name) from None

    def unknown(self, name: object, known: tuple[str, ...] | None = None) -> UnknownName:
        """The error for ``name``, listing ``known`` (default: the registered names; a caller that also
        takes names of its own, such as ``auto``, lists them too)."""
        where = f" ({self.setting})" if self.setting else ""
        listed = ", ".join(self.names() if known is None else known) or "none registered"
        return UnknownName(f"unknown {self.kind} {name!r}{where}; known: {listed}")

    def remove(self, name: str) -> T:
        """Take ``name``'s member out (a plug-in unloaded, a test's own member); :class:`UnknownName` when
        there is none."""
        member = self.get(name)
        del self._members[name]
        return member

    def names(self) -> tuple[str, ...]:
        """The registered names, in the order they registered."""
        return tuple(self._members)

    def items(self) -> Iterator[tuple[str, T]]:
        return iter(list(self._members.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._members

    def __len__(self) -> int:
        return len(self._members)


def _origin(member: object) -> str:
    """Where a member comes from, for the duplicate's line: its module and name where it has them."""
    module = getattr(member, "__module__", None) or type(member).__module__
    name = getattr(member, "__qualname__", None) or type(member).__qualname__
    return f"{module}.{name}"
