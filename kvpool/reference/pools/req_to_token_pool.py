"""``ReqToTokenPool``: the request-to-token table (rows of token-slot ids) and its free-row list.

Units: ``size`` rows ``1..size`` are allocatable (row 0 is reserved); each row has
``max_context_len`` columns; ``req_to_token[row][col]`` is the slot id of token ``col`` of the
request holding ``row``. ``free_slots`` starts as ``[1, ..., size]`` and ``free`` appends the
freed row. ``alloc`` takes its ``n`` fresh rows as one block, in list order, from the tail
(``rules.row_order == "lifo"``, the default, SGLang 0.5.18+: the row freed last is reused first
and a fresh pool hands out its highest rows) or from the head (``"fifo"``, SGLang 0.5.16).
"""

from __future__ import annotations

from collections.abc import Sequence

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
from kvpool.rules import Rules
from kvpool.snapshot import ReqToTokenSnapshot


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
        if not isinstance(start, int) or not isinstance(stop, int):
            raise InvalidArgumentError(f"column bounds must be explicit ints, got {start}:{stop}")
        if start < 0 or stop < start:
            raise InvalidArgumentError(f"need 0 <= start <= stop, got {start}:{stop}")
        if stop > self.max_context_len:
            raise ContextOverflowError(f"column {stop} past max_context_len={self.max_context_len}")
        return start, stop

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
        row named twice in the batch (it would take two rows and keep one)."""
        kept: set[int] = set()
        seen: set[int] = set()
        fresh = 0
        for i, req in enumerate(reqs):
            if req.req_pool_idx is None:
                if id(req) in seen:  # it would take two rows and keep one: a leaked row
                    raise InvalidArgumentError(f"request {i} appears twice in the batch")
                seen.add(id(req))
                fresh += 1
                continue
            row = self._check_row(req.req_pool_idx)
            if not (req.is_chunked > 0 or req.kv_committed_len > 0):
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
        contents stay. InvalidArgumentError without a row, DoubleFreeError for a free row."""
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
        with explicit bounds (step 1). ``len(values)`` must be ``stop - start``
        (InvalidArgumentError); ``stop > max_context_len`` is ContextOverflowError."""
        if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[1], slice)):
            raise InvalidArgumentError("index must be (row, slice(start, stop))")
        row = self._check_row(index[0])
        cols = index[1]
        if cols.step not in (None, 1):
            raise InvalidArgumentError(f"slice step must be 1, got {cols.step}")
        start, stop = self._check_columns(cols.start, cols.stop)
        new = int_list("slots", values)
        if len(new) != stop - start:
            raise InvalidArgumentError(f"{len(new)} values for {stop - start} columns")
        self.req_to_token[row][start:stop] = new

    def read(self, row: int, start: int, stop: int) -> list[int]:
        """A copy of ``req_to_token[row][start:stop]`` (same checks as :meth:`write`)."""
        self._check_row(row)
        start, stop = self._check_columns(start, stop)
        return self.req_to_token[row][start:stop]

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain copy of the free rows and generations; ``rows`` lists ``(row, length)`` pairs whose
        first ``length`` columns to include."""
        contents = tuple((row, tuple(self.read(row, 0, length))) for row, length in rows)
        return ReqToTokenSnapshot(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(self.free_slots),
            req_generation=tuple(self.req_generation),
            rows=contents,
        )


__all__ = ["ReqToTokenPool"]
