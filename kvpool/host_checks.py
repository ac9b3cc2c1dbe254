"""Checks on plain host values shared by both twins (torch-free): integers given as integers.

A length, an index or a token id must be an integer (a Python ``int`` or anything with
``__index__``, such as a NumPy integer); a float, a string or ``None`` is refused with
:class:`~kvpool.errors.InvalidArgumentError` instead of being truncated by ``int()`` or failing
with a builtin error after a state change.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

from kvpool.errors import InvalidArgumentError


def as_int(name: str, value: object) -> int:
    """``value`` as an ``int``; InvalidArgumentError unless it is an integer."""
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer, got {value!r}") from None


def int_list(name: str, values: Iterable[object]) -> list[int]:
    """Every element of ``values`` as an ``int`` (InvalidArgumentError at the first that is
    not an integer)."""
    try:
        return [operator.index(v) for v in values]  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must hold integers, got {values!r}") from None


TOKEN_ID_LIMIT = 2**31
"""Token ids are vocabulary ids in ``[0, TOKEN_ID_LIMIT)``: the twin keeps keys as int32 arrays
(an engine's token ids fit; SGLang's vocabularies are far smaller)."""


def token_list(name: str, values: Iterable[object]) -> list[int]:
    """Every element of ``values`` as a token id (see :data:`TOKEN_ID_LIMIT`):
    InvalidArgumentError for a non-integer, a bool, or an id out of range, before any change."""
    items = list(values)
    tokens = int_list(name, items)
    for v, t in zip(items, tokens, strict=True):
        if isinstance(v, bool):
            raise InvalidArgumentError(f"{name} must hold token ids, not bools, got {v!r}")
        if not 0 <= t < TOKEN_ID_LIMIT:
            raise InvalidArgumentError(f"{name}: token id {t} outside [0, {TOKEN_ID_LIMIT})")
    return tokens


__all__ = ["TOKEN_ID_LIMIT", "as_int", "int_list", "token_list"]
