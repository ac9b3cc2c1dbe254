"""The one failure helper of the invariant modules.

A check collects the offending indices (slots, pages, rows, node ids or Mamba slots, as its
message says) and calls :func:`fail` with them: no offender, no failure; otherwise one
:class:`~kvpool.errors.InvariantViolation` naming the invariant and each offender once, in
ascending order, so that two runs that break an invariant the same way report it the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sized

from kvpool.errors import InvariantViolation

_BUILTIN_SIZED = frozenset({list, tuple, set, frozenset, dict})


def fail(invariant_id: str, message: str, indices: Iterable[int]) -> None:
    """Raise :class:`InvariantViolation` (``invariant_id``, ``message``, the distinct
    ``indices`` sorted) when ``indices`` names anything; return None otherwise."""
    if type(indices) in _BUILTIN_SIZED:  # (no ABC instance check for the usual types)
        if not indices:
            return  # the common case, an empty collection: nothing to sort
    elif isinstance(indices, Sized) and not len(indices):
        return
    bad = sorted(set(indices))
    if bad:
        raise InvariantViolation(invariant_id, message, bad)


__all__ = ["fail"]
