"""Declarative settings: dataclass fields that state their type, default and bounds, checked in one place.

A settings class is a frozen, keyword-only dataclass deriving from Settings, whose fields are made with the helpers
below (integer, number, numbers, flag, one_of, text, section, variant). Every way of making one (from_dict, direct
construction, dataclasses.replace) checks and coerces each field, so an instance is always valid. Errors are
ValueErrors that start with the setting's dotted key: "optimizer.lr: expected a number, got 'fast'".

Numbers may arrive as strings: YAML 1.1 (PyYAML) reads 5e-4 as the string '5e-4', so number() accepts what float()
accepts. Integers must be integral (2.0 is 2; 2.5 and '2' are not). Booleans must be true or false: bool('false') is
True, so a quoted YAML value must not pass.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import ClassVar

from .._core.names import choice

REQUIRED = dataclasses.MISSING


def _setting(default, check, *, kind=None, choices=None, hint=None, nested=None, options=None):
    """A dataclass field whose metadata says how to check it (check(value, key) -> value) and, for the command
    line, its kind and choices. nested: the settings class of a section; options: a variant's classes by name."""
    metadata = {"check": check, "kind": kind, "choices": choices, "hint": hint, "nested": nested, "options": options}
    if nested is not None and options is None:
        return dataclasses.field(default_factory=nested, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _bounded(key, value, minimum, below, above=None):
    if minimum is not None and value < minimum:
        raise ValueError(f"{key}: expected >= {minimum}, got {value}")
    if above is not None and value <= above:
        raise ValueError(f"{key}: expected > {above}, got {value}")
    if below is not None and value >= below:
        raise ValueError(f"{key}: expected < {below}, got {value}")
    return value


def _as_int(key, value) -> int:
    try:
        if isinstance(value, bool | str):
            raise TypeError
        out = int(value)
        if out != value:
            raise TypeError
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{key}: expected an int, got {value!r}") from None
    return out


def _as_float(key, value) -> float:
    try:
        if isinstance(value, bool) or value is None:
            raise TypeError
        out = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past float's range
        raise ValueError(f"{key}: expected a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{key}: expected a finite number, got {value!r}")
    return out


def integer(default=REQUIRED, *, minimum=None, optional: bool = False, hint=None):
    """An int >= minimum; optional: None is a value too."""
    def check(value, key):
        if value is None and optional:
            return None
        return _bounded(key, _as_int(key, value), minimum, None)

    return _setting(default, check, kind=int, hint=hint)


def number(default=REQUIRED, *, minimum=None, below=None, above=None, optional: bool = False, hint=None):
    """A finite float in [minimum, below), and > above if given; optional: None is a value too."""
    def check(value, key):
        if value is None and optional:
            return None
        return _bounded(key, _as_float(key, value), minimum, below, above)

    return _setting(default, check, kind=float, hint=hint)


def numbers(default, count: int, *, minimum=None, below=None):
    """A list of `count` floats in [minimum, below) (kept as a tuple)."""
    def check(value, key):
        if isinstance(value, str) or not isinstance(value, Sequence) or len(value) != count:
            raise ValueError(f"{key}: expected {count} numbers, got {value!r}")
        return tuple(_bounded(f"{key}[{i}]", _as_float(f"{key}[{i}]", v), minimum, below)
                     for i, v in enumerate(value))

    return _setting(tuple(default), check)


def flag(default):
    """true or false."""
    def check(value, key):
        if not isinstance(value, bool):
            raise ValueError(f"{key}: expected true or false, got {value!r}")
        return value

    return _setting(default, check, kind=bool)


def one_of(default, choices):
    """One of a fixed set of names."""
    choices = tuple(choices)
    return _setting(default, lambda value, key: choice(key, value, choices), kind=str, choices=choices)


def text(default):
    """A non-empty string."""
    def check(value, key):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{key}: expected a non-empty string, got {value!r}")
        return value

    return _setting(default, check, kind=str)


def section(cls):
    """A nested block of settings (a mapping in YAML); absent, it takes its own defaults."""
    return _setting(None, lambda value, key: _nested(cls, value, key), nested=cls)


def variant(options: dict, default: str):
    """A nested block whose 'name' picks its settings class, e.g. optimizer: {name: sgd, ...} or {name: adamw, ...}.
    Absent, it is the default option with its own defaults (so its required settings are reported missing)."""
    def check(value, key):
        if isinstance(value, tuple(options.values())):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"{key}: expected a mapping of settings, got {value!r}")
        name = choice(f"{key}.name", value.get("name", default), tuple(options))
        return _nested(options[name], value, key)

    return _setting(REQUIRED, check, nested=options[default], options=options)


def _nested(cls, value, key):
    return value if isinstance(value, cls) else cls.from_dict(value, where=f"{key}.")


class Settings:
    """Base of a settings dataclass: checks every field on construction; from_dict / to_dict convert."""

    # Keys that were renamed (old -> new): an unknown old key's error says the new name.
    RENAMED: ClassVar[dict] = {}

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, f.metadata["check"](getattr(self, f.name), f.name))
        self.check()

    def check(self) -> None:
        """Constraints between fields (a subclass overrides it); raise ValueError naming the key."""

    @classmethod
    def from_dict(cls, data, where: str = ""):
        """Settings from a mapping (a YAML block), with every key checked; where: the block's key prefix."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where.rstrip('.') or 'configuration'}: expected a mapping of settings, got {data!r}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        for key in data:
            if key not in known:
                renamed = f"; it is called {cls.RENAMED[key]!r} now" if key in cls.RENAMED else ""
                raise ValueError(f"{where}{key}: unknown setting (expected one of {', '.join(known)}){renamed}")
        values = {}
        for name, f in known.items():
            key = where + name
            if name in data:
                values[name] = f.metadata["check"](data[name], key)
            elif f.metadata["options"] is not None:
                values[name] = f.metadata["check"]({}, key)
            elif f.default is REQUIRED and f.default_factory is REQUIRED:
                hint = f.metadata["hint"]
                raise ValueError(f"{key}: missing" + (f" ({hint})" if hint else ""))
        return cls(**values)

    def to_dict(self) -> dict:
        """Plain values (nested blocks as dicts, tuples as lists), as YAML and checkpoints store them."""
        return {f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _plain(value):
    if isinstance(value, Settings):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value


def setting_field(cls, key: str) -> dataclasses.Field:
    """The field of a dotted key, e.g. setting_field(TrainConfig, 'optimizer.lr') (in a variant: its default
    option's field)."""
    head, _, rest = key.partition(".")
    f = {f.name: f for f in dataclasses.fields(cls)}[head]
    return setting_field(f.metadata["nested"], rest) if rest else f
