"""Argument checks shared by the prefix caches of both twins (torch-free, host values only).

Every check here runs before the caller's first change and raises a
:class:`~kvpool.errors.KVPoolError` subclass naming the argument and the value. The optimized
twin imports these functions too: they read only host fields (a request's lengths and row, a
table's size and free rows, Python flags and counts), never device data.

A *request* is read by duck typing (the scheduler glue hands the trees proxies of SGLang's
requests): what a release reads must be there with the right types, or the release is refused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ContextOverflowError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import as_bool, as_count, as_int


def check_key(key: object, key_type: type) -> None:
    """``key`` must be this twin's ``RadixKey`` (InvalidArgumentError: a list of token ids, a
    tensor or ``None`` is not a key)."""
    if not isinstance(key, key_type):
        raise InvalidArgumentError(f"key must be a RadixKey, got {key!r}")


def check_insert_flags(priority: object, chunked: object, inserted_len: object) -> None:
    """An insert's scalars: ``priority`` an integer (any sign), ``chunked`` a bool,
    ``inserted_len`` ``None`` or a count of tokens."""
    as_int("priority", priority)
    as_bool("chunked", chunked)
    if inserted_len is not None:
        as_count("inserted_len", inserted_len)


def check_distinct(slots: Sequence[int]) -> None:
    """No slot named twice: a tree owning one slot in two places frees it twice at eviction
    (DoubleFreeError naming the repeated slots)."""
    if len(set(slots)) != len(slots):
        seen: set[int] = set()
        twice: set[int] = set()
        for s in slots:
            (twice if s in seen else seen).add(s)
        raise DoubleFreeError("slots named twice in one insert", sorted(twice))


def check_held(alloc: object, slots: Sequence[int]) -> None:
    """Slots the caller holds: InvalidArgumentError for a slot on a free page of ``alloc``
    (the tree would own, and one day free, a slot nobody allocated). An allocator that keeps
    no free-page set (a test stub) is not asked."""
    free = getattr(alloc, "_free_set", None)
    if not free:
        return
    ps = getattr(alloc, "page_size", 1)
    loose = sorted({s for s in slots if s // ps in free})
    if loose:
        raise InvalidArgumentError(f"slots not allocated: {loose[:8]}")


_MISSING = object()


def _name(req: object) -> str:
    """How a message names a request: its ``rid`` (a request's repr may read the very fields
    that are broken)."""
    rid = getattr(req, "rid", _MISSING)
    return repr(rid) if rid is not _MISSING else f"<{type(req).__name__}>"


# A field of a duck-typed request (the glue passes proxies): each caller checks its type.
def _field(req: object, name: str) -> Any:
    value = getattr(req, name, _MISSING)
    if value is _MISSING:
        raise InvalidArgumentError(f"req must be a request (no {name}), got {_name(req)}")
    return value


def _row_is_free(table: object, row: int) -> bool:
    """Whether ``row`` is on the table's free list (a table stub without one: never)."""
    free = getattr(table, "_free_set", None)
    if free is None:
        return False
    if isinstance(free, bytearray):
        return bool(free[row])
    return row in free


def check_row(req: object, table: object) -> int:
    """The request's row: an integer ``1..size`` that the table has given out (not free).
    InvalidArgumentError for a request without a row or a row of the wrong type,
    ReservedIndexError for row 0, IndexOutOfRangeError past the table, InvalidArgumentError for
    a free row."""
    row = _field(req, "req_pool_idx")
    if row is None:
        raise InvalidArgumentError(f"request {_name(req)} holds no row")
    row = as_int("req.req_pool_idx", row)
    if row == RESERVED_INDEX:
        raise ReservedIndexError(f"req.req_pool_idx {row} is the reserved row")
    size = getattr(table, "size", None)
    if isinstance(size, int) and not RESERVED_INDEX < row <= size:
        raise IndexOutOfRangeError(f"req.req_pool_idx {row} outside 1..{size}")
    if _row_is_free(table, row):
        raise InvalidArgumentError(f"req.req_pool_idx {row} is a free row")
    return row


def _seq_len(req: object) -> int:
    try:
        return len(_field(req, "origin_input_ids")) + len(_field(req, "output_ids"))
    except TypeError:
        raise InvalidArgumentError(f"request {_name(req)}: token lists are not sequences") from None


def check_release(req: object, table: object, stop: int | None = None) -> tuple[int, int, int]:
    """A request a tree may release up to column ``stop`` (default: its ``kv_committed_len``):
    its row (:func:`check_row`), lengths that are counts with ``cache_protected_len <= stop <=
    len(all_token_ids)`` and ``stop <= max_context_len`` (ContextOverflowError), an integer
    ``priority`` and a count ``cache_inserted_len``. Returns (row, stop, cache_protected_len)."""
    row = check_row(req, table)
    committed = as_count("req.kv_committed_len", _field(req, "kv_committed_len"))
    protected = as_count("req.cache_protected_len", _field(req, "cache_protected_len"))
    as_count("req.cache_inserted_len", _field(req, "cache_inserted_len"))
    as_int("req.priority", _field(req, "priority"))
    end = committed if stop is None else stop
    total = _seq_len(req)
    limit = getattr(table, "max_context_len", None)
    for name, n in (("req.kv_committed_len", committed), ("columns released", end)):
        if n > total:
            raise InvalidArgumentError(f"{name} {n} past the request's {total} tokens")
        if isinstance(limit, int) and n > limit:
            raise ContextOverflowError(f"{name} {n} past max_context_len={limit}")
    if protected > end:
        raise InvalidArgumentError(f"req.cache_protected_len {protected} past {end} tokens")
    return row, end, protected


def fill_len(req: object) -> int:
    """``len(req.fill_ids)`` (InvalidArgumentError when it is no sequence)."""
    try:
        return len(_field(req, "fill_ids"))
    except TypeError:
        raise InvalidArgumentError(f"request {_name(req)}: fill_ids is not a sequence") from None


def check_up_to(up_to: object) -> int:
    """A checkpoint's column count (a count of tokens)."""
    return as_count("up_to", up_to)


def check_row_read_len(got: int, want: int) -> None:
    """A caller's row read must cover exactly the columns released."""
    if got != want:
        raise InvalidArgumentError(f"row_read holds {got} columns, the release covers {want}")


def check_flag(name: str, value: object) -> bool:
    """A release's bool flag (``is_insert``, ``chunked``)."""
    return as_bool(name, value)


def check_count(name: str, value: object) -> int:
    """An eviction amount: a count of tokens inside int64."""
    return as_count(name, value)


__all__ = [
    "check_count",
    "check_distinct",
    "check_flag",
    "check_held",
    "check_insert_flags",
    "check_key",
    "check_release",
    "check_row",
    "check_row_read_len",
    "check_up_to",
    "fill_len",
]
