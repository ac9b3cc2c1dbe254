"""Snapshot records built fast: the lockstep harness builds thousands a step.

A snapshot (:mod:`kvpool.snapshot`) is made of frozen dataclasses. Their generated ``__init__``
sets each field through ``object.__setattr__``, about 2 us for a record of 17 fields, and
``dataclasses.replace`` runs it again. :func:`fast_record` and :func:`replaced` make the same
record (the same fields, so the same ``__eq__``, ``__hash__``, ``repr`` and pickling) by filling
a new instance's ``__dict__``, as :mod:`copy` and :mod:`pickle` rebuild one, and only for
classes where that is exactly what ``__init__`` would do (:func:`plain_record`); any other class
goes through its own constructor. Both twins' snapshot builders and the invariants use them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ParamSpec, TypeVar, cast

P = ParamSpec("P")
R = TypeVar("R")


def fast_record(cls: Callable[P, R]) -> Callable[P, R]:
    """A constructor of the frozen dataclass ``cls``, called with every field by keyword,
    giving an instance equal to ``cls(**kwargs)`` (the same fields, so the same ``__eq__``,
    ``__hash__`` and ``repr``) for a fraction of the cost: the instance is made and its
    ``__dict__`` filled as :mod:`copy` and :mod:`pickle` rebuild one, without the generated
    ``__init__``'s ``object.__setattr__`` per field (snapshots build many records a step).
    Other calls (positional arguments, a field left to its default, a name that is no field)
    go to ``cls`` itself, as does every call where filling would differ from ``__init__``: not
    a ``@dataclass``, an ``__init__`` of its own, a ``__post_init__``, ``__slots__``, a field
    outside ``__init__``."""
    if not plain_record(cls):
        return cls
    made = cast("type[R]", cls)
    names = frozenset(f.name for f in dataclasses.fields(made))  # type: ignore[arg-type]
    new = object.__new__

    def make(*args: P.args, **kwargs: P.kwargs) -> R:
        if args or kwargs.keys() != names:
            return cls(*args, **kwargs)
        record = new(made)
        record.__dict__.update(kwargs)
        return record

    return make


_FIELD_COUNTS: dict[type, int] = {}
""":func:`filled_record`'s number of fields per class (-1: not a :func:`plain_record`)."""

_new_instance = object.__new__
_set_dict = object.__setattr__


def filled_record(cls: type[R], fields: dict[str, object]) -> R:
    """``cls(**fields)``, where ``fields`` is a fresh dict literal the caller hands over (not
    kept) naming fields of ``cls``. When ``cls`` is a :func:`plain_record` and ``fields`` has
    as many entries as ``cls`` has fields, the new instance takes ``fields`` itself as its
    ``__dict__``: no keyword call, no copy and no per-call name check (a snapshot builds a
    record per request, session and node every step). Any other call is ``cls(**fields)``
    (a field left to its default, a name too many).

    Precondition: a literal with every field names each once. The builders' literals are
    code, not data; ``tests/harness/test_snapshot_eq.py`` checks that every record of both
    twins' snapshots holds exactly its class's fields."""
    count = _FIELD_COUNTS.get(cls)
    if count is None:
        count = _FIELD_COUNTS[cls] = (
            len(dataclasses.fields(cls))  # type: ignore[arg-type]
            if plain_record(cls)
            else -1
        )
    if len(fields) != count:
        return cls(**fields)
    record = _new_instance(cls)
    _set_dict(record, "__dict__", fields)
    return record


_PLAIN: dict[type, bool] = {}
""":func:`plain_record`'s answer per class (a class's fields do not change)."""


def plain_record(cls: object) -> bool:
    """Whether ``cls`` is a dataclass whose instances :func:`fast_record` may fill directly
    (memoised per class)."""
    if not isinstance(cls, type):
        return False
    found = _PLAIN.get(cls)
    if found is None:
        found = _PLAIN[cls] = _fillable(cls)
    return found


def _fillable(cls: type) -> bool:
    if not dataclasses.is_dataclass(cls):
        return False
    code = getattr(cls.__dict__.get("__init__"), "__code__", None)
    return (
        code is not None
        and code.co_filename == "<string>"  # the __init__ @dataclass generated
        and not hasattr(cls, "__post_init__")
        and all("__slots__" not in k.__dict__ for k in cls.__mro__[:-1])
        and all(f.init for f in dataclasses.fields(cls))
    )


K = TypeVar("K")


_FIELD_NAMES: dict[type, frozenset[str]] = {}
""":func:`replaced`'s field names per :func:`plain_record` class."""


def replaced(part: K, **changes: object) -> K:
    """``dataclasses.replace(part, **changes)``, without running ``__init__`` again when
    :func:`plain_record` holds for ``part``'s class. A name that is no field gets
    ``dataclasses.replace``'s own ``TypeError`` (filling would add it silently)."""
    cls = type(part)
    if not plain_record(cls):
        return dataclasses.replace(part, **changes)  # type: ignore[type-var]
    names = _FIELD_NAMES.get(cls)
    if names is None:
        fields_of = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields_of)
    if not changes.keys() <= names:
        return dataclasses.replace(part, **changes)  # type: ignore[type-var]
    new = object.__new__(cls)
    fields = new.__dict__
    fields.update(part.__dict__)
    fields.update(changes)
    return new


__all__ = ["fast_record", "filled_record", "plain_record", "replaced"]
