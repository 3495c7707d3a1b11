"""Config dataclasses as data: their fields, types and docstrings, and building one from
text (a command-line flag) or from a mapping (a YAML or JSON file).

The command line, config files and sweep grids are all derived from here, so a field
added to a config is a flag, a file key and a grid axis at once, with its docstring as
help. Values are parsed by type, never evaluated.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import math
import textwrap
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot work; names the field and what is valid."""

    def __init__(self, field: str, problem: str) -> None:
        # "seed must be ..." or "resume=True needs ...": the problem may start with "=".
        super().__init__(f"{field}{'' if problem.startswith('=') else ' '}{problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class FieldInfo:
    """One field of a config dataclass, as the CLI and config files see it."""

    name: str
    type: Any
    default: Any
    doc: str

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def kind(self) -> str:
        """``bool``, ``int``, ``float``, ``str``, ``ints`` / ``strs`` (tuples), ``mapping``
        (a JSON object), ``choice`` or ``other`` (not settable from text)."""
        inner = _without_none(self.type)
        if inner is bool:
            return "bool"
        if inner in (int, float, str):
            return inner.__name__
        if typing.get_origin(inner) is typing.Literal:
            return "choice"
        if typing.get_origin(inner) is tuple and typing.get_args(inner)[:1] == (int,):
            return "ints"
        if typing.get_origin(inner) is tuple and typing.get_args(inner)[:1] == (str,):
            return "strs"
        if inner is dict or typing.get_origin(inner) is dict:
            return "mapping"
        return "other"

    @property
    def optional(self) -> bool:
        return type(None) in typing.get_args(self.type)

    @property
    def choices(self) -> tuple:
        return typing.get_args(_without_none(self.type))


def _without_none(annotation: Any) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


@functools.cache
def docstrings(cls: type) -> dict[str, str]:
    """The docstring written under each field of a dataclass (empty where the source
    cannot be read, e.g. for a class typed into an interactive prompt)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body
    found = {}
    for statement, following in zip(body, body[1:], strict=False):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            found[statement.target.id] = " ".join(following.value.value.split())
    return found


def fields(cls: type) -> dict[str, FieldInfo]:
    """Every init field of the dataclass ``cls``, by name, in declaration order."""
    hints = typing.get_type_hints(cls)
    docs = docstrings(cls)
    found = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        found[f.name] = FieldInfo(f.name, hints.get(f.name, Any), default, docs.get(f.name, ""))
    return found


def parse_text(info: FieldInfo, text: str) -> Any:
    """The value of ``info``'s type that ``text`` spells.

    Raises:
        ConfigError: ``text`` does not spell such a value.
    """
    if info.optional and text.strip().lower() in ("none", "null"):
        return None
    kind = info.kind
    try:
        if kind == "bool":
            lowered = text.strip().lower()
            if lowered in ("true", "yes", "1", "on"):
                return True
            if lowered in ("false", "no", "0", "off"):
                return False
            raise ValueError
        if kind == "int":
            return int(text.strip())
        if kind == "float":
            return float(text.strip())
        if kind == "str":
            return text
        if kind == "ints":
            return tuple(int(part) for part in text.split(",") if part.strip())
        if kind == "strs":
            return tuple(part.strip() for part in text.split(",") if part.strip())
        if kind == "mapping":
            import json

            value = json.loads(text)  # parsed, never evaluated
            if isinstance(value, dict):
                return value
            raise ValueError
        if kind == "choice":
            if text in info.choices:
                return text
            raise ValueError
    except ValueError:
        pass
    raise ConfigError(info.name, f"must be {describe(info)}, got {text!r}.")


def describe(info: FieldInfo) -> str:
    """What ``info`` accepts, for messages."""
    kind = info.kind
    words = {
        "bool": "true or false",
        "int": "a whole number",
        "float": "a number",
        "str": "a string",
        "ints": "comma-separated whole numbers such as 64,64",
        "strs": "comma-separated names",
        "mapping": "a JSON object such as '{\"key\": 1}'",
        "choice": "one of " + ", ".join(repr(c) for c in info.choices),
    }.get(kind, f"a {getattr(info.type, '__name__', info.type)}")
    return words + (" (or none)" if info.optional else "")


def coerce(info: FieldInfo, value: Any) -> Any:
    """``value`` from a YAML/JSON file as ``info``'s type (lists become tuples, ints are
    accepted for floats).

    Raises:
        ConfigError: a value of the wrong type.
    """
    if value is None and info.optional:
        return None
    kind = info.kind
    ok = {
        "bool": isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "str": isinstance(value, str),
        "ints": isinstance(value, (list, tuple))
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value),
        "strs": isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value),
        "mapping": isinstance(value, dict),
        "choice": value in info.choices,
    }.get(kind, True)
    if not ok:
        raise ConfigError(info.name, f"must be {describe(info)}, got {value!r}.")
    if kind == "float":
        return float(value)
    if kind in ("ints", "strs"):
        return tuple(value)
    return value


def unknown_field(cls: type, name: str, where: str) -> ConfigError:
    """The error for a key that is no field of ``cls``, with the nearest names."""
    valid = list(fields(cls))
    close = difflib.get_close_matches(name, valid, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return ConfigError(
        name, f"is not a field of {where}.{hint} Valid fields: {', '.join(valid)}."
    )


def from_mapping(cls: type, values: Mapping[str, Any], where: str, base: Any = None) -> Any:
    """A ``cls`` with ``values`` over ``base`` (or over the defaults).

    Raises:
        ConfigError: an unknown key or a value of the wrong type.
    """
    known = fields(cls)
    changes = {}
    for name, value in values.items():
        if name not in known:
            raise unknown_field(cls, name, where)
        changes[name] = coerce(known[name], value)
    return dataclasses.replace(base, **changes) if base is not None else cls(**changes)


def check_whole(name: str, value: Any, minimum: int) -> None:
    """Raise :class:`ConfigError` unless ``value`` is an int (not a bool) >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        wanted = "a positive whole number" if minimum == 1 else f"a whole number >= {minimum}"
        raise ConfigError(name, f"must be {wanted}, got {value!r}.")


def check_finite(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(name, f"must be a finite number, got {value!r}.")


def check_seconds(name: str, value: Any, *, zero_allowed: bool) -> None:
    """Raise :class:`ConfigError` unless ``value`` is a finite number of seconds, positive
    (or also 0, where 0 means off)."""
    check_finite(name, value)
    if value < 0 or (value == 0 and not zero_allowed):
        wanted = ">= 0 seconds" if zero_allowed else "a positive number of seconds"
        raise ConfigError(name, f"must be {wanted}, got {value!r}.")
