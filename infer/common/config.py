"""Typed dataclass configs from YAML, with ``key.sub=value`` overrides from the command line.

Unknown keys are errors (a typo in a config must not be silently ignored), all of them named in one
message; values are checked and converted to the annotated field types, nested dataclasses included.
Every error says where the bad key came from: the file and line, or the command line override.

    cfg = load_config(TrainConfig, "configs/train/tiny_cpu.yaml", ["optim.lr=1e-4", "epochs=2"])
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib.util
import json
import os
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic
from keyshot.infer.common.redaction import redact_override

T = TypeVar("T")


class ConfigError(KeyshotError, ValueError):
    """A config file or override that does not fit its dataclass; ``key`` is the dotted key it is
    about (``judge.model``, ``sources[0].path``), when it is about one."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


def _bad(where: str, problem: str) -> ConfigError:
    return ConfigError(f"{where}: {problem}", key=where)


def _convert(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(value, arg, where)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0] if errors else _bad(where, f"cannot be {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise _bad(where, f"{value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise _bad(where, f"expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise _bad(where, f"expected a list, got {value!r}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise _bad(where, f"expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise _bad(where, f"expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise _bad(where, f"expected {tp.__name__}, got {value!r}")
        try:
            converted = tp(value)
        except (TypeError, ValueError):
            raise _bad(where, f"expected {tp.__name__}, got {value!r}") from None
        if tp is int and isinstance(value, float) and value != converted:
            raise _bad(where, f"expected an integer, got {value!r}")
        return converted
    if tp is str:
        if isinstance(value, dict | list):
            raise _bad(where, f"expected a string, got {value!r}")
        return str(value)
    return value


def closest_key(key: str, known: Iterable[str]) -> str | None:
    """The valid key a mistyped one most likely meant (``epoch`` → ``epochs``, ``learning_rate`` → ``lr``)."""
    known = list(known)
    initials = "".join(word[:1] for word in key.lower().split("_"))
    for name in known:
        if len(initials) > 1 and name == initials:
            return name
    close = difflib.get_close_matches(key.lower(), known, n=1, cutoff=0.6)
    return close[0] if close else None


#: A key's place in a config: section names and list indexes (``("sources", 0, "path")``).
KeyPath = tuple[str | int, ...]


def dotted(path: KeyPath) -> str:
    """``("sources", 0, "path")`` → ``sources[0].path``: how errors name a key."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _sections(tp: Any, value: Any, path: KeyPath) -> list[tuple[type, dict, KeyPath]]:
    """The dataclass sections a field's value holds: (class, mapping, path) of each."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return _sections(options[0], value, path) if len(options) == 1 else []
    if dataclasses.is_dataclass(tp) and isinstance(value, dict):
        return [(tp, value, path)]
    if origin in (list, tuple) and args and isinstance(value, list):
        return [found for i, item in enumerate(value) for found in _sections(args[0], item, (*path, i))]
    return []


def unknown_keys(cls: type, data: dict, path: KeyPath = ()) -> list[tuple[KeyPath, list[str]]]:
    """Every key of ``data`` (nested sections included) that ``cls`` does not have, with the keys its
    section knows."""
    hints = typing.get_type_hints(cls)
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.init)
    found: list[tuple[KeyPath, list[str]]] = []
    for key, value in data.items():
        if key not in fields:
            found.append(((*path, str(key)), fields))
            continue
        for section, section_data, section_path in _sections(hints[key], value, (*path, key)):
            found += unknown_keys(section, section_data, section_path)
    return found


OVERRIDE_ORIGIN = "command line override"


@dataclass(frozen=True)
class KeyOrigins:
    """Where each key of a config came from: ``file`` (``lines``: the line of each key path) or a
    command line override (``overrides``: the override that set each key path)."""

    file: str = ""
    lines: dict[KeyPath, int] = field(default_factory=dict)
    overrides: dict[KeyPath, str] = field(default_factory=dict)

    def of(self, path: KeyPath) -> str:
        """The override that set ``path`` (or a section above it), else the file and line."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.overrides:
                return f"{OVERRIDE_ORIGIN} {self.overrides[path[:n]]!r}"
        line = self.lines.get(path)
        below = [item for key, item in self.overrides.items() if key[: len(path)] == path]
        if below and not line:  # a key only overrides below it created
            return f"{OVERRIDE_ORIGIN} {', '.join(map(repr, below))}"
        return f"{self.file}:{line}" if self.file and line else self.file

    def of_section(self, path: KeyPath) -> str:
        """Where a section's values came from: the overrides inside it (with the file's line), else
        :meth:`of`."""
        inside = [
            item for key, item in self.overrides.items() if len(key) > len(path) and key[: len(path)] == path
        ]
        base = self.of(path)
        if not inside or base.startswith(OVERRIDE_ORIGIN):
            return base
        return f"{OVERRIDE_ORIGIN} {', '.join(map(repr, inside))}" + (f" (with {base})" if base else "")

    def of_dotted(self, key: str) -> str:
        """:meth:`of` (:meth:`of_section` for a section) of a key named as errors name it, "" for the
        whole config; the file for a key it cannot place."""
        known = {dotted(path): path for path in (*self.lines, *self.overrides)}
        path = () if key == "" else known.get(key)
        if path is None:
            return self.file
        return self.of_section(path) if self._is_section(path) else self.of(path)

    def _is_section(self, path: KeyPath) -> bool:
        return any(
            key[: len(path)] == path and len(key) > len(path) for key in (*self.lines, *self.overrides)
        )


def yaml_key_lines(text: str) -> dict[KeyPath, int]:
    """The line (1-based) of each key and list item of a YAML document, by its path."""
    lines: dict[KeyPath, int] = {}

    def walk(node: yaml.Node, path: KeyPath) -> None:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key_path = (*path, str(key_node.value))
                lines[key_path] = key_node.start_mark.line + 1
                walk(value_node, key_path)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                walk(item, (*path, i))

    try:
        root = yaml.compose(text)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def unknown_keys_message(found: list[tuple[KeyPath, list[str]]], origins: KeyOrigins) -> str:
    """One line naming every unknown key, grouped by where it came from and its section."""
    groups: dict[tuple[str, str], list[tuple[str, list[str]]]] = {}
    for path, known in found:
        groups.setdefault((origins.of(path), dotted(path[:-1])), []).append((str(path[-1]), known))
    parts = []
    for (origin, section), keys in groups.items():
        named = [
            f"{key!r} (did you mean {close!r}?)" if (close := closest_key(key, known)) else repr(key)
            for key, known in keys
        ]
        unsure = any(closest_key(key, known) is None for key, known in keys)
        where = ": ".join(x for x in (origin, section) if x)
        parts.append(
            f"{where + ': ' if where else ''}unknown key(s) {', '.join(named)}"
            + (f" (known: {', '.join(keys[0][1])})" if unsure else "")
        )
    return "; ".join(parts)


def _build(cls: type[T], data: dict, where: str) -> T:
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        named = [
            f"{key!r} (did you mean {close!r}?)" if (close := closest_key(key, fields)) else repr(key)
            for key in unknown
        ]
        raise ConfigError(
            f"{where + ': ' if where else ''}unknown key(s) {', '.join(named)}; known: {sorted(fields)}"
        )
    required = [
        name
        for name, f in fields.items()
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in data
    ]
    if required:
        keys = ", ".join(f"{where}.{name}" if where else name for name in required)
        raise ConfigError(
            f"missing required key(s) {keys}: give --config FILE (a YAML under configs/) or set them as overrides"
        )
    kwargs = {k: _convert(v, hints[k], f"{where}.{k}" if where else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:  # a dataclass's own checks (ranges) name the field
        raise ConfigError(f"{where or cls.__name__}: {exc}", key=where) from None


def _set_path(data: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = data
    for key in keys[:-1]:
        node = node.setdefault(key, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {dotted!r}: {key!r} is not a section")
    node[keys[-1]] = value


#: An override: a dotted key of identifiers, ``=``, a value (``judge.model=gpt-4o``).
OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=")


def split_paths_and_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """A command line's positional items: paths, and ``key=value`` overrides (an existing path is always
    a path). The one rule of every command that takes both."""
    paths, overrides = [], []
    for item in items:
        if OVERRIDE.match(item) and not Path(item).exists():
            overrides.append(item)
        else:
            paths.append(item)
    return paths, overrides


#: The package the shipped configs are installed as (the repository's configs/ folder).
SHIPPED_PACKAGE = "keyshot.configs"
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")


def shipped_configs() -> Path | None:
    """The folder of the configs keyshot ships (``configs/`` of a checkout, ``keyshot/configs`` of a
    wheel); None where the install lacks it."""
    spec = importlib.util.find_spec(SHIPPED_PACKAGE)
    places = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(places[0]) if places else None


def shipped_names() -> dict[str, list[Path]]:
    """Each shipped config by the names that find it: ``judge/webjudge7b`` and, where no other config
    of another folder has it, ``webjudge7b``."""
    root = shipped_configs()
    names: dict[str, list[Path]] = {}
    for file in sorted(root.rglob("*")) if root is not None else []:
        if file.suffix in CONFIG_SUFFIXES:
            rel = file.relative_to(root).with_suffix("").as_posix()
            names.setdefault(rel, []).append(file)
            names.setdefault(file.stem, []).append(file)
    return names


def resolve_config(path: str | os.PathLike, folder: str | None = None) -> Path:
    """The file ``--config`` names: a path as given where it exists, else a shipped config by its name
    (``webjudge7b``, ``judge/tiny_cpu``, ``configs/judge/webjudge7b.yaml`` from any folder). The one
    resolver of config names; a name that several shipped configs have is the one in ``folder`` (the
    config class's ``SHIPPED_FOLDER``: ``keyshot judge --config tiny_cpu`` reads judge/tiny_cpu), else
    refused, naming them."""
    p = Path(path)
    if p.exists():
        return p
    rel = p.as_posix()
    rel = rel.removeprefix("configs/")
    for suffix in CONFIG_SUFFIXES:
        rel = rel.removesuffix(suffix)
    found = shipped_names().get(rel, []) if not p.is_absolute() else []
    if len(found) > 1 and folder is not None:
        found = [f for f in found if f.parent.name == folder] or found
    if len(found) > 1:
        root = shipped_configs()
        named = ", ".join(f.relative_to(root).with_suffix("").as_posix() for f in found)  # type: ignore[arg-type]
        raise ConfigError(f"{path}: several shipped configs have this name ({named}): name one of them")
    return found[0] if found else p


def read_config_file(path: str | os.PathLike) -> tuple[dict, dict[KeyPath, int]]:
    """A YAML config file's mapping and the line of each of its keys (:func:`yaml_key_lines`); the one
    reader of config files (its errors name the file and what to do). ``path`` may name a shipped
    config (:func:`resolve_config`)."""
    p = resolve_config(path)
    try:
        text = p.read_text(encoding="utf-8")
        loaded = yaml.safe_load(text)
    except FileNotFoundError:
        raise ConfigError(
            f"{p}: config file not found (nor a shipped config of that name: {shipped_hint()})"
        ) from None
    except IsADirectoryError:
        raise ConfigError(f"{p}: a folder, not a config file: give --config a YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{p}: not UTF-8 text (byte {exc.start}): save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{p}: cannot read the config file ({exc.strerror or exc})") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{p}{yaml_problem(exc)}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"{p}: the top level must be a mapping")
    return loaded or {}, yaml_key_lines(text)


def shipped_hint() -> str:
    """The shipped configs' names, for an error about a config name that is none of them."""
    root = shipped_configs()
    if root is None:
        return "this install ships none"
    folders = sorted({f.parent.name for f in root.rglob("*") if f.suffix in CONFIG_SUFFIXES})
    return f"see {root} ({', '.join(folders)}), e.g. --config webjudge7b"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML error as one line: the line and column of the file it happened at, and what is wrong."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
    context = getattr(exc, "context", None)
    return f"{where}: not valid YAML: {problem}" + (f" ({context})" if context else "")


def load_config(
    cls: type[T],
    path: str | os.PathLike | None = None,
    overrides: list[str] | None = None,
    *,
    section: str | None = None,
) -> T:
    """Build ``cls`` from a YAML file (optional) and ``key.sub=value`` overrides (YAML-typed values).
    ``section``: build it from that top-level section of the file (a synth config's ``build:``), its
    errors still naming the file and the line."""
    data: dict = {}
    lines: dict[KeyPath, int] = {}
    if path is not None:
        path = resolve_config(path, getattr(cls, "SHIPPED_FOLDER", None))
        data, lines = read_config_file(path)
        if section is not None:
            part = data.get(section) or {}
            if not isinstance(part, dict):
                raise ConfigError(f"{path}:{lines.get((section,), '')}: {section}: expected a mapping")
            data = part
            lines = {key[1:]: n for key, n in lines.items() if key[:1] == (section,) and len(key) > 1}
    return config_from_data(cls, data, overrides, where=str(path) if path is not None else "", lines=lines)


def config_from_data(
    cls: type[T],
    data: dict,
    overrides: list[str] | None = None,
    *,
    where: str = "",
    lines: dict[KeyPath, int] | None = None,
) -> T:
    """Build ``cls`` from a mapping (a YAML file's, or a section of one) and ``key.sub=value`` overrides.
    ``where`` names the file (``lines``: the line of each of its keys, :func:`yaml_key_lines`)."""
    data = copy.deepcopy(data)  # the overrides change a copy
    set_by: dict[KeyPath, str] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
        set_by[tuple(key.strip().split("."))] = redact_override(item)
    origins = KeyOrigins(file=where, lines=dict(lines or {}), overrides=set_by)
    found = unknown_keys(cls, data)
    if found:
        raise ConfigError(unknown_keys_message(found, origins))
    try:
        return _build(cls, data, "")
    except ConfigError as exc:
        origin = origins.of_dotted(exc.key) if exc.key is not None else where
        raise ConfigError(f"{origin}: {exc}" if origin else str(exc)) from None


def config_to_dict(cfg: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def dump_config(cfg: Any, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML, atomically."""
    return write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
