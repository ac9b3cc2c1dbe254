"""Type checks of a frozen configuration dataclass's fields (``PoolConfig``, ``Rules``).

A knob of the wrong type must be refused at construction with one clear message, not truncated
(``size=64.0``), read for its truthiness (``disable_radix_cache="false"`` is true) or compared
later with a confusing TypeError. :func:`check_field_types` reads each field's annotation and
accepts: ``int`` a Python int that is not a bool; ``bool`` a bool; ``float`` an int or float that
is not a bool; ``str`` a str; ``X | None`` None or an ``X``; any other class an instance of it.
Values (ranges, choices) are each class's own checks, after these. Torch-free.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from kvpool.errors import ConfigError


def _accepts(kind: Any, value: Any) -> bool:
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return any(_accepts(k, value) for k in typing.get_args(kind))
    if kind is type(None):
        return value is None
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(kind, type):
        return isinstance(value, kind)
    return True  # an annotation these checks do not read (none today)


_HINTS: dict[type, dict[str, Any]] = {}
"""Each checked class's resolved annotations (resolved once: ``get_type_hints`` is slow)."""


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def check_field_types(obj: Any) -> None:
    """ConfigError naming the first field of dataclass ``obj`` whose value's type its
    annotation does not accept (see the module docstring)."""
    hints = _hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        kind = hints[f.name]
        if not _accepts(kind, value):
            name = getattr(kind, "__name__", str(kind))
            raise ConfigError(
                f"{type(obj).__name__}.{f.name} must be {name}, got {value!r} "
                f"({type(value).__name__})"
            )


__all__ = ["check_field_types"]
