"""``ReqToTokenPool``: the request-to-token table (rows of token-slot ids) and its free-row list.

Units: ``size`` rows ``1..size`` are allocatable (row 0 is reserved); each row has
``max_context_len`` columns; ``req_to_token[row][col]`` is the slot id of token ``col`` of the
request holding ``row``. ``free_slots`` starts as ``[1, ..., size]`` and ``free`` appends the
freed row. ``alloc`` takes its ``n`` fresh rows as one block, in list order, from the tail
(``rules.row_order == "lifo"``, the default, SGLang 0.5.18+: the row freed last is reused first
and a fresh pool hands out its highest rows) or from the head (``"fifo"``, SGLang 0.5.16).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
    RowReuseError,
)
from kvpool.host_checks import int_list
from kvpool.protocols.requests import ReqLike
from kvpool.records import fast_record
from kvpool.rules import Rules
from kvpool.snapshot import ReqToTokenSnapshot

SLOT_VALUE_LIMIT = 2**31
"""Table entries are token-slot ids in ``[0, SLOT_VALUE_LIMIT)``: the twin keeps the table as
int32 (an engine's pools hold far fewer slots)."""


_TABLE = fast_record(ReqToTokenSnapshot)
"""Builds a :class:`ReqToTokenSnapshot` (every field by keyword: :func:`fast_record`)."""


def request_list(reqs: object) -> list[ReqLike]:
    """``reqs`` as a list of requests (objects with a ``req_pool_idx``), read once:
    InvalidArgumentError, before any change, for anything else (``None``, a number, a string,
    an item that is not a request). Shared by both twins' tables."""
    if isinstance(reqs, str | bytes) or not isinstance(reqs, Iterable):
        raise InvalidArgumentError(f"reqs must be a sequence of requests, got {reqs!r}")
    out = list(reqs)
    for i, req in enumerate(out):
        if not hasattr(req, "req_pool_idx"):
            raise InvalidArgumentError(f"reqs[{i}] is not a request (no req_pool_idx): {req!r}")
    return out


def request_count(i: int, req: object, field: str) -> int:
    """``req.field`` (``is_chunked`` / ``kv_committed_len``; 0 when the request has none) as an
    int: InvalidArgumentError for a value that is not one."""
    value = getattr(req, field, 0)
    if not isinstance(value, int):
        raise InvalidArgumentError(f"reqs[{i}].{field} must be an int, got {value!r}")
    return value


def table_request(req: object) -> ReqLike:
    """``req`` if it is a request (has ``req_pool_idx``): InvalidArgumentError otherwise."""
    if not hasattr(req, "req_pool_idx"):
        raise InvalidArgumentError(f"req is not a request (no req_pool_idx): {req!r}")
    return req  # type: ignore[return-value]


def snapshot_rows(rows: object) -> list[tuple[int, int]]:
    """``rows`` as ``(row, length)`` pairs of ints: InvalidArgumentError for anything else (the
    ranges are the table's checks)."""
    if isinstance(rows, str | bytes) or not isinstance(rows, Iterable):
        raise InvalidArgumentError(f"rows must be a sequence of (row, length) pairs, got {rows!r}")
    out = []
    for pair in rows:
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise InvalidArgumentError(f"rows must hold (row, length) pairs, got {pair!r}")
        out.append((pair[0], pair[1]))
    return out


class ReqToTokenPool:
    """The table, the free-row list ``free_slots`` and ``req_generation`` (per row, bumped each
    time the row is handed out; :meth:`clear` keeps it, or zeroes it when
    ``rules.generation_on_clear`` is ``"reset"``)."""

    def __init__(self, size: int, max_context_len: int, *, rules: Rules | None = None) -> None:
        if not isinstance(size, int) or size <= 0:
            raise ConfigError(f"size must be a positive number of rows, got {size!r}")
        if not isinstance(max_context_len, int) or max_context_len <= 0:
            raise ConfigError(f"max_context_len must be positive, got {max_context_len!r}")
        self.size = size
        self.max_context_len = max_context_len
        self.rules = rules if rules is not None else Rules()
        self.req_to_token: list[list[int]] = [[0] * max_context_len for _ in range(size + 1)]
        self.req_generation: list[int] = [0] * (size + 1)
        self.free_slots: list[int] = []
        self._free_set: set[int] = set()
        self.clear()

    # ----------------------------------------------------------------- checks
    def _check_row(self, row: object) -> int:
        """Row must be an int in ``1..size``: row 0 is ReservedIndexError, others out of range."""
        if not isinstance(row, int) or isinstance(row, bool):
            raise InvalidArgumentError(f"row must be an int, got {row!r}")
        if row == RESERVED_INDEX:
            raise ReservedIndexError(f"row {RESERVED_INDEX} is reserved")
        if not RESERVED_INDEX < row <= self.size:
            raise IndexOutOfRangeError(f"row {row} outside 1..{self.size}")
        return row

    def _check_columns(self, start: object, stop: object) -> tuple[int, int]:
        """``0 <= start <= stop <= max_context_len`` (ContextOverflowError past the end)."""
        if (
            not isinstance(start, int)
            or not isinstance(stop, int)
            or isinstance(start, bool)
            or isinstance(stop, bool)
        ):
            raise InvalidArgumentError(f"column bounds must be explicit ints, got {start}:{stop}")
        if start < 0 or stop < start:
            raise InvalidArgumentError(f"need 0 <= start <= stop, got {start}:{stop}")
        if stop > self.max_context_len:
            raise ContextOverflowError(f"column {stop} past max_context_len={self.max_context_len}")
        return start, stop

    def _check_held(self, row: object) -> int:
        """:meth:`_check_row`, and a request must hold the row (InvalidArgumentError for a free
        one: its contents belong to no request)."""
        checked = self._check_row(row)
        if checked in self._free_set:
            raise InvalidArgumentError(f"row {checked} is free: no request holds it")
        return checked

    # ----------------------------------------------------------------- rows
    def available_size(self) -> int:
        """Number of free rows."""
        return len(self.free_slots)

    def check_alloc(self, reqs: Sequence[ReqLike]) -> int:
        """Validate a batch for :meth:`alloc` without changing anything; returns the number of
        fresh rows it needs. A request with ``req_pool_idx`` set may keep it only when
        ``is_chunked > 0`` or ``kv_committed_len > 0`` and the row is held and named by no other
        request of the batch (else RowReuseError; a row 0 / out-of-range ``req_pool_idx`` raises
        ReservedIndexError / IndexOutOfRangeError). InvalidArgumentError for a request without a
        row named twice in the batch (it would take two rows and keep one), for ``reqs`` that is
        not a sequence of requests, and for a non-int ``is_chunked`` / ``kv_committed_len``."""
        kept: set[int] = set()
        seen: set[int] = set()
        fresh = 0
        for i, req in enumerate(request_list(reqs)):
            if req.req_pool_idx is None:
                if id(req) in seen:  # it would take two rows and keep one: a leaked row
                    raise InvalidArgumentError(f"request {i} appears twice in the batch")
                seen.add(id(req))
                fresh += 1
                continue
            row = self._check_row(req.req_pool_idx)
            chunked = request_count(i, req, "is_chunked")
            if not (chunked > 0 or request_count(i, req, "kv_committed_len") > 0):
                raise RowReuseError(
                    f"request {i} holds row {row} but is neither chunked nor has committed KV"
                )
            if row in self._free_set or row in kept:
                raise RowReuseError(f"request {i} keeps row {row}, which is free or shared")
            kept.add(row)
        return fresh

    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None:
        """Every request's row, in batch order. A request with ``req_pool_idx`` set keeps it (see
        :meth:`check_alloc` for when that is legal; misuse raises before any change). The others
        take, in batch order, the block of fresh rows :meth:`_take_rows` removes, bumping each
        row's generation; ``None`` (no change) when fewer rows are free than they need."""
        reqs = request_list(reqs)  # read once: an iterator would be empty the second time
        fresh = self.check_alloc(reqs)
        if fresh > len(self.free_slots):
            return None
        taken = iter(self._take_rows(fresh))
        rows: list[int] = []
        for req in reqs:
            if req.req_pool_idx is None:
                row = next(taken)
                self.req_generation[row] += 1
                req.req_pool_idx = row
            rows.append(req.req_pool_idx)
        return rows

    def _take_rows(self, n: int) -> list[int]:
        """Remove ``n`` rows from ``free_slots`` as one block: its last ``n`` (lifo) or first
        ``n`` (fifo), in list order. Precondition: ``n <= len(free_slots)``."""
        if self.rules.row_order == "lifo":
            cut = len(self.free_slots) - n
            taken = self.free_slots[cut:]
            del self.free_slots[cut:]  # O(n), like SGLang's pop from the tail
        else:
            taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        self._free_set.difference_update(taken)
        return taken

    def free(self, req: ReqLike) -> None:
        """Append the request's row to ``free_slots`` and clear ``req.req_pool_idx``; the table
        contents stay. InvalidArgumentError without a row (or for an object that is not a
        request), DoubleFreeError for a free row."""
        req = table_request(req)
        if req.req_pool_idx is None:
            raise InvalidArgumentError("request holds no row (req_pool_idx is None)")
        row = self._check_row(req.req_pool_idx)
        if row in self._free_set:
            raise DoubleFreeError("row is already free", [row])
        self.free_slots.append(row)
        self._free_set.add(row)
        req.req_pool_idx = None

    def clear(self) -> None:
        """Every row free, ``free_slots`` back to ``[1, ..., size]``; contents kept; generations
        kept (``rules.generation_on_clear == "keep"``) or zeroed (``"reset"``)."""
        self.free_slots = list(range(RESERVED_INDEX + 1, self.size + 1))
        self._free_set = set(self.free_slots)
        if self.rules.generation_on_clear == "reset":
            self.req_generation = [0] * (self.size + 1)

    # ----------------------------------------------------------------- table
    def write(self, index: tuple[int, slice], values: Sequence[int]) -> None:
        """``req_to_token[row][start:stop] = values``; ``index`` is ``(row, slice(start, stop))``
        with explicit bounds (step 1) and a row a request holds (InvalidArgumentError for a free
        row). ``values`` are slot ids: integers in ``[0, SLOT_VALUE_LIMIT)`` and
        ``len(values) == stop - start`` (InvalidArgumentError); ``stop > max_context_len`` is
        ContextOverflowError."""
        if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[1], slice)):
            raise InvalidArgumentError(f"index must be (row, slice(start, stop)), got {index!r}")
        row = self._check_held(index[0])
        cols = index[1]
        if cols.step not in (None, 1):
            raise InvalidArgumentError(f"slice step must be 1, got {cols.step}")
        start, stop = self._check_columns(cols.start, cols.stop)
        new = int_list("values", values)
        bad = [v for v in new if not 0 <= v < SLOT_VALUE_LIMIT]
        if bad:
            raise InvalidArgumentError(
                f"values: slot ids outside [0, {SLOT_VALUE_LIMIT}): {bad[:8]}"
            )
        if len(new) != stop - start:
            raise InvalidArgumentError(f"{len(new)} values for {stop - start} columns")
        self.req_to_token[row][start:stop] = new

    def read(self, row: int, start: int, stop: int) -> list[int]:
        """A copy of ``req_to_token[row][start:stop]`` of a row a request holds (same checks
        as :meth:`write`)."""
        self._check_held(row)
        start, stop = self._check_columns(start, stop)
        return self.req_to_token[row][start:stop]

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain copy of the free rows and generations; ``rows`` lists ``(row, length)`` pairs whose
        first ``length`` columns to include, free rows too (their contents stay after a free).
        InvalidArgumentError unless ``rows`` is a sequence of int pairs; rows and lengths are
        checked as :meth:`read`'s."""
        pairs = snapshot_rows(rows)
        for row, length in pairs:
            self._check_row(row)
            self._check_columns(0, length)
        return self._snapshot_of(
            [(row, tuple(self.req_to_token[row][:length])) for row, length in pairs]
        )

    def _snapshot_of(self, contents: Sequence[tuple[int, tuple[int, ...]]]) -> ReqToTokenSnapshot:
        """:meth:`snapshot` whose rows ``contents`` (``(row, values)`` pairs) were already read
        and checked by the caller (the memory manager's snapshot, which reads them anyway)."""
        return _TABLE(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(self.free_slots),
            req_generation=tuple(self.req_generation),
            rows=tuple(contents),
        )


__all__ = [
    "SLOT_VALUE_LIMIT",
    "ReqToTokenPool",
    "request_count",
    "request_list",
    "snapshot_rows",
    "table_request",
]
