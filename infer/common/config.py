"""Typed dataclass configs from YAML, with ``key.sub=value`` overrides from the command line.

Unknown keys are errors (a typo in a config must not be silently ignored); values are checked and
converted to the annotated field types, nested dataclasses included.

    cfg = load_config(TrainConfig, "configs/train/tiny_cpu.yaml", ["optim.lr=1e-4", "epochs=2"])
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import os
import re
import types
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from keyshot.infer.common.errors import KeyshotError
from keyshot.infer.common.fileio import write_text_atomic

T = TypeVar("T")


class ConfigError(KeyshotError, ValueError):
    """A config file or override that does not fit its dataclass."""


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
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{where}: cannot be {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return _build(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        items = [_convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if tp in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}")
        try:
            converted = tp(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected {tp.__name__}, got {value!r}") from None
        if tp is int and isinstance(value, float) and value != converted:
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return converted
    if tp is str:
        if isinstance(value, dict | list):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
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
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


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


def load_config(cls: type[T], path: str | os.PathLike | None = None, overrides: list[str] | None = None) -> T:
    """Build ``cls`` from a YAML file (optional) and ``key.sub=value`` overrides (YAML-typed values)."""
    data: dict = {}
    if path is not None:
        p = Path(path)
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
        data = loaded or {}
    return config_from_data(cls, data, overrides, where=str(path) if path is not None else "")


def config_from_data(cls: type[T], data: dict, overrides: list[str] | None = None, *, where: str = "") -> T:
    """Build ``cls`` from a mapping (a YAML file's, or a section of one) and ``key.sub=value`` overrides."""
    data = copy.deepcopy(data)  # the overrides change a copy
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set_path(data, key.strip(), yaml.safe_load(raw) if raw.strip() else "")
    try:
        return _build(cls, data, "")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}" if where else str(exc)) from None


def config_to_dict(cfg: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def dump_config(cfg: Any, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML, atomically."""
    return write_text_atomic(path, yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
