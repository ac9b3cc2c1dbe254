"""Checks on plain host values shared by both twins (torch-free): integers given as integers.

A length, an index or a token id must be an integer (a Python ``int`` or anything with
``__index__``, such as a NumPy integer); a bool, a float, a string or ``None`` is refused with
:class:`~kvpool.errors.InvalidArgumentError` instead of being truncated by ``int()``, read as 0 or
1, or failing with a builtin error after a state change. Every helper here runs before the
caller's first change and names the argument and the value it refuses.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from typing import TypeVar

from kvpool.errors import InvalidArgumentError

_T = TypeVar("_T")

INT64_MAX = 2**63 - 1
"""The largest index or length either twin stores (the twin keeps them in int64 tensors)."""


_PLAIN_INT = frozenset({int})
"""The element types of a list of plain ints (``map(type, ...)`` runs in C: the fast path)."""


def _index(value: object) -> int:
    if isinstance(value, bool):
        raise TypeError("bool")
    return operator.index(value)  # type: ignore[arg-type]


def as_int(name: str, value: object) -> int:
    """``value`` as an ``int``; InvalidArgumentError unless it is an integer (not a bool)
    inside int64."""
    try:
        out = _index(value)
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}") from None
    if not -INT64_MAX - 1 <= out <= INT64_MAX:
        raise InvalidArgumentError(f"{name} must fit in int64, got {value!r}")
    return out


def as_count(name: str, value: object) -> int:
    """``value`` as a non-negative ``int`` (a number of tokens, slots, pages or rows):
    InvalidArgumentError otherwise."""
    out = as_int(name, value)
    if out < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {value!r}")
    return out


def as_bool(name: str, value: object) -> bool:
    """``value`` if it is a ``bool``: InvalidArgumentError for anything else (``1``,
    ``"false"`` and ``None`` are not flags)."""
    if not isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be a bool, got {value!r}")
    return value


def as_str(name: str, value: object) -> str:
    """``value`` if it is a ``str`` (an id): InvalidArgumentError for anything else."""
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{name} must be a str, got {value!r}")
    return value


def int_list(name: str, values: Iterable[object]) -> list[int]:
    """Every element of ``values`` as an ``int`` (InvalidArgumentError when ``values`` is not a
    sequence of integers: ``None``, a number, a string, a set, a mapping or an iterator, bool,
    float or nested items, or an item outside int64)."""
    return int_span(name, values)[0]


def int_span(name: str, values: Iterable[object]) -> tuple[list[int], int, int]:
    """``(int_list(name, values), smallest, largest)``: the same checks and errors, and the
    bounds the int64 check takes anyway, so a caller checking a range of its own need not pass
    over the list again. No elements give ``(0, -1)``, an empty span, which passes a range
    check ``smallest < lo or largest >= stop`` for every ``lo <= 0 <= stop``."""
    if type(values) is list and set(map(type, values)) <= _PLAIN_INT:
        out: list[int] = list(values)  # the common case: plain ints, no per-item call
    else:
        # An index argument is ordered: a set or a mapping has no order to keep, an iterator
        # would be used up by the check itself.
        unordered = isinstance(values, AbstractSet | Mapping | Iterator)
        if isinstance(values, str | bytes) or unordered or not isinstance(values, Iterable):
            raise InvalidArgumentError(f"{name} must be a sequence of integers, got {values!r}")
        try:
            out = [_index(v) for v in values]
        except TypeError:
            raise InvalidArgumentError(f"{name} must hold integers, got {values!r}") from None
    if not out:
        return out, 0, -1
    low, high = min(out), max(out)
    if low < -INT64_MAX - 1 or high > INT64_MAX:
        raise InvalidArgumentError(f"{name} must hold int64 values, got {values!r}")
    return out, low, high


def count_list(name: str, values: Iterable[object]) -> list[int]:
    """:func:`int_list`, every element ``>= 0`` (lengths)."""
    out, smallest, _ = int_span(name, values)
    if smallest < 0:
        raise InvalidArgumentError(f"{name} must hold values >= 0, got {values!r}")
    return out


TOKEN_ID_LIMIT = 2**31
"""Token ids are vocabulary ids in ``[0, TOKEN_ID_LIMIT)``: the twin keeps keys as int32 arrays
(an engine's token ids fit; SGLang's vocabularies are far smaller)."""


def token_list(name: str, values: Iterable[object]) -> list[int]:
    """Every element of ``values`` as a token id (see :data:`TOKEN_ID_LIMIT`):
    InvalidArgumentError for a non-integer, a bool, or an id out of range, before any change."""
    tokens = int_list(name, values)
    for t in tokens:
        if not 0 <= t < TOKEN_ID_LIMIT:
            raise InvalidArgumentError(f"{name}: token id {t} outside [0, {TOKEN_ID_LIMIT})")
    return tokens


def stop_list(name: str, values: object, output_lens: list[int]) -> list[int | None]:
    """``values`` (None, or one entry per request) as a list of ``finished_len`` values: each
    None (every output token) or an integer in ``[0, output_lens[i]]`` (output tokens through
    the stop). InvalidArgumentError for a string, a non-sequence, a wrong length or an entry
    outside its range."""
    if values is None:
        return [None] * len(output_lens)
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{name} must be None or a sequence, got {values!r}")
    out = list(values)
    if len(out) != len(output_lens):
        raise InvalidArgumentError(f"{name} has {len(out)} entries for {len(output_lens)} requests")
    checked: list[int | None] = []
    for value, limit in zip(out, output_lens, strict=True):
        if value is None:
            checked.append(None)
            continue
        n = as_count(name, value)
        if n > limit:
            raise InvalidArgumentError(f"{name}: {n} past the request's {limit} output tokens")
        checked.append(n)
    return checked


def as_positive_real(name: str, value: object) -> float:
    """``value`` as a ``float`` when it is a finite real number ``> 0`` (an int, a float or a
    NumPy real; a scale or a divisor): InvalidArgumentError for a bool, a string, ``None``,
    NaN, an infinity, zero or a negative number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a real number, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out <= 0.0:
        raise InvalidArgumentError(f"{name} must be finite and > 0, got {value!r}")
    return out


def str_list(name: str, values: object) -> list[str]:
    """``values`` as a list of ``str`` (request or session ids): InvalidArgumentError for a
    string or bytes given whole, a non-sequence, or an item that is not a ``str``."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{name} must be a sequence of str, got {values!r}")
    out = list(values)
    bad = [v for v in out if not isinstance(v, str)]
    if bad:
        raise InvalidArgumentError(f"{name} must hold str ids, got {bad[0]!r}")
    return out


def as_opt_str(name: str, value: object) -> str | None:
    """``value`` if it is a ``str`` or ``None``: InvalidArgumentError for anything else."""
    return None if value is None else as_str(name, value)


def as_instance(name: str, value: object, cls: type[_T]) -> _T:
    """``value`` if it is a ``cls``: InvalidArgumentError naming the argument otherwise."""
    if not isinstance(value, cls):
        raise InvalidArgumentError(f"{name} must be a {cls.__name__}, got {value!r}")
    return value


def instance_list(name: str, values: object, cls: type[_T]) -> list[_T]:
    """``values`` as a list of distinct ``cls`` objects (a batch of requests):
    InvalidArgumentError for a string, a non-sequence, an item of another type, or the same
    object twice."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        raise InvalidArgumentError(f"{name} must be a sequence of {cls.__name__}, got {values!r}")
    out: list[_T] = []
    for v in values:  # (as_instance's check and message, without a call per item)
        if not isinstance(v, cls):
            raise InvalidArgumentError(f"{name} item must be a {cls.__name__}, got {v!r}")
        out.append(v)
    if len(set(map(id, out))) != len(out):
        raise InvalidArgumentError(f"{name} names the same {cls.__name__} twice")
    return out


__all__ = [
    "INT64_MAX",
    "TOKEN_ID_LIMIT",
    "as_bool",
    "as_count",
    "as_instance",
    "as_int",
    "as_opt_str",
    "as_positive_real",
    "as_str",
    "count_list",
    "instance_list",
    "int_list",
    "int_span",
    "stop_list",
    "str_list",
    "token_list",
]
