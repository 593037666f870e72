"""How a config key is declared and checked: `key()` (a dataclass field with its help and its
valid values), the check of a value against them, and the check of its type (`coerce`).
The sections that declare the keys are in `sections.py`."""

import dataclasses
import re
import typing
from typing import Union

import yaml

from keras_transformer.errors import ConfigError

NON_EMPTY = "non-empty"
INTERVAL = re.compile(r"^([\[(])(-?[0-9.e+]+), (-?[0-9.e+]+)([\])])$")


def key(default, help, valid=None, **kwargs):
    """A dataclass field with its `help` and its `valid` values, checked on load: an interval
    such as `"[0, 1)"` (numbers; every item of a list), a tuple of choices (or a function
    returning them, read when checked: a registry's, `config.formats`), or `"non-empty"`
    (strings)."""
    if isinstance(valid, str) and valid != NON_EMPTY and not INTERVAL.match(valid):
        raise ValueError(f"bad interval {valid!r}")
    metadata = {"help": help, "valid": valid}
    if isinstance(default, (list, dict)):
        return dataclasses.field(
            default_factory=lambda: type(default)(default), metadata=metadata, **kwargs
        )
    return dataclasses.field(default=default, metadata=metadata, **kwargs)


def _in_interval(value, interval):
    opening, low, high, closing = INTERVAL.match(interval).groups()
    low, high = float(low), float(high)
    above = value >= low if opening == "[" else value > low
    below = value <= high if closing == "]" else value < high
    return above and below  # NaN is in no interval


def _choices(valid):
    """`a, b or c`: the choices of a `valid` tuple (an interval among them shown as such)."""
    names = [str(c).lower() if isinstance(c, bool) else str(c) for c in valid]
    return f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]


def check_valid(key, value, valid):
    """Raises `ConfigError` naming `key` when a (well-typed) value is outside `valid`."""
    valid = valid() if callable(valid) else valid
    if value is None or valid is None:
        return
    if isinstance(valid, tuple) and isinstance(value, (int, float)) and not isinstance(value, bool):
        interval = next((v for v in valid if isinstance(v, str) and INTERVAL.match(v)), None)
        if interval is not None:  # a number where the choices include an interval
            if not _in_interval(value, interval):
                others = _choices(tuple(v for v in valid if v != interval))
                raise ConfigError(f"{key} must be in {interval} or {others}, got {value!r}")
            return
    if isinstance(valid, tuple):
        ok = any(
            value is choice or (value == choice and type(value) is type(choice)) for choice in valid
        )
        if not ok:
            raise ConfigError(f"{key} must be one of {_choices(valid)}, got {value!r}")
    elif valid == NON_EMPTY:
        items = value if isinstance(value, list) else [value]
        if not items:
            raise ConfigError(f"{key} must not be an empty list")
        for item in items:
            if not isinstance(item, str):
                raise ConfigError(f"{key}: expected a list of str, got {item!r} in it")
            if not item.strip():
                raise ConfigError(f"{key} must not be empty")
    elif isinstance(value, list):
        for item in value:
            if not isinstance(item, int) or isinstance(item, bool):
                raise ConfigError(f"{key}: expected a list of int, got {item!r} in it")
            if not _in_interval(item, valid):
                raise ConfigError(f"{key}: every item must be in {valid}, got {item!r}")
    elif not _in_interval(value, valid):
        raise ConfigError(f"{key} must be in {valid}, got {value!r}")


def _type_name(tp):
    return getattr(tp, "__name__", str(tp).replace("typing.", ""))


def coerce(key, value, tp):
    """Checks `value` against the annotation `tp`; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin is Union:
        errors = []
        for option in typing.get_args(tp):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return coerce(key, value, option)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(
            f"{key}: expected {' or '.join(_type_name(t) for t in typing.get_args(tp))}, "
            f"got {type(value).__name__} {value!r}"
        )
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if tp in (bool, str, list, dict) and isinstance(value, tp):
        return value
    if tp is int and isinstance(value, float) and value.is_integer():
        return int(value)
    raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")


def describe_valid(f, hint):
    """The `valid` column of the reference: an interval, the choices, or blank (any value of
    the type); `or null` where null is allowed."""
    valid = f.metadata.get("valid")
    valid = valid() if callable(valid) else valid
    if isinstance(valid, tuple):
        shown = ", ".join(
            f"`{c}`" if isinstance(c, str) and INTERVAL.match(c)
            else f"`{yaml.safe_dump(c).splitlines()[0]}`"
            for c in valid
        )  # fmt: skip
    elif valid is None:
        shown = ""
    else:
        shown = valid if valid == NON_EMPTY else f"`{valid}`"
    if type(None) in typing.get_args(hint):
        shown = f"{shown} or null" if shown else ""
    return shown


def table_cell(text):
    """`text` as a Markdown table cell: a `|` (even in backticks) would end the cell, and
    `[a][b]` outside backticks would be a reference link (`[N*][bt:]SPEC` in a help text)."""
    parts = text.replace("|", "\\|").split("`")
    for i in range(0, len(parts), 2):  # outside backticks
        parts[i] = parts[i].replace("[", "\\[").replace("]", "\\]")
    return "`".join(parts)
