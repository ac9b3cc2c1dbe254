"""``ReqToTokenPool`` (optimized twin): the request-to-token table on the device, rows on the host.

Units: ``size`` rows ``1..size`` are allocatable (row 0 is reserved); each row has
``max_context_len`` columns; ``req_to_token[row, col]`` (int32, on ``device``) is the slot id of
token ``col`` of the request holding ``row``. The free-row list ``free_slots`` and the
per-row ``req_generation`` counters are plain host lists: row bookkeeping is scheduler work and
never needs the device. Same API, results, errors and row order (``rules.row_order``) as
:mod:`kvpool.reference.pools.req_to_token_pool`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

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
from kvpool.optimized.key_match import is_integer_dtype
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.protocols.requests import ReqLike
from kvpool.rules import Rules
from kvpool.snapshot import ReqToTokenSnapshot


class ReqToTokenPool:
    """The table, the free-row list (ordered as in the reference) and ``req_generation``
    (bumped each time a row is handed out; :meth:`clear` keeps or zeroes it per ``rules``).

    Every check here is on host values (rows, columns, a host byte per row for membership), so
    all are done in both modes: freeing a free row (DoubleFreeError), keeping a row that is free
    or named twice in a batch (RowReuseError), rows and columns out of range, non-integer
    values. ``options`` only place the table."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        if not isinstance(size, int) or size <= 0:
            raise ConfigError(f"size must be a positive number of rows, got {size!r}")
        if not isinstance(max_context_len, int) or max_context_len <= 0:
            raise ConfigError(f"max_context_len must be positive, got {max_context_len!r}")
        self.size = size
        self.max_context_len = max_context_len
        self.options = opts = twin_options(options)
        self.device = opts.device
        self.checked = opts.checked
        self.rules = rules if rules is not None else Rules()
        self.req_to_token = torch.zeros(
            (size + 1, max_context_len), dtype=torch.int32, device=self.device
        )
        self.req_generation: list[int] = [0] * (size + 1)
        self.free_slots: list[int] = []
        self._free_set = bytearray(size + 1)  # 1 while the row is in free_slots (host, O(1))
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
        ``is_chunked > 0`` or ``kv_committed_len > 0`` (else RowReuseError), and a kept row must
        be neither free nor named twice (RowReuseError); a request without a row named twice in
        the batch is InvalidArgumentError."""
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
            if self._free_set[row] or row in kept:
                raise RowReuseError(f"request {i} keeps row {row}, which is free or shared")
            kept.add(row)
        return fresh

    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None:
        """Every request's row, in batch order (see the reference). A request with
        ``req_pool_idx`` set keeps it (see :meth:`check_alloc`; misuse raises before any change);
        the others take, in batch order, the block :meth:`_take_rows` removes, bumping each
        row's generation. ``None`` (no change) when fewer rows are free than needed."""
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
        """Remove ``n`` rows as one block: the last ``n`` (lifo) or first ``n`` (fifo) of
        ``free_slots``, in list order. Precondition: ``n <= len(free_slots)``."""
        if self.rules.row_order == "lifo":
            cut = len(self.free_slots) - n
            taken = self.free_slots[cut:]
            del self.free_slots[cut:]  # O(n), like SGLang's pop from the tail
        else:
            taken, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        for row in taken:
            self._free_set[row] = 0
        return taken

    def free(self, req: ReqLike) -> None:
        """Append the request's row to ``free_slots`` and clear ``req.req_pool_idx``; the table
        contents stay. InvalidArgumentError without a row; DoubleFreeError for a row that is
        already free (a host byte per row: checked in both modes)."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError("request holds no row (req_pool_idx is None)")
        row = self._check_row(req.req_pool_idx)
        if self._free_set[row]:
            raise DoubleFreeError("row is already free", [row])
        self.free_slots.append(row)
        self._free_set[row] = 1
        req.req_pool_idx = None

    def clear(self) -> None:
        """Every row free, ``free_slots`` back to ``[1, ..., size]``; contents kept; generations
        kept or zeroed (``rules.generation_on_clear``)."""
        self.free_slots = list(range(RESERVED_INDEX + 1, self.size + 1))
        self._free_set = bytearray(b"\x00" + b"\x01" * self.size)
        if self.rules.generation_on_clear == "reset":
            self.req_generation = [0] * (self.size + 1)

    # ----------------------------------------------------------------- table
    def write(self, index: tuple[int, slice], values: torch.Tensor | Sequence[int]) -> None:
        """``req_to_token[row, start:stop] = values`` (cast to int32, moved to the device);
        ``index`` is ``(row, slice(start, stop))`` with explicit bounds (step 1). The number of
        values must be ``stop - start`` (InvalidArgumentError); ``stop > max_context_len`` is
        ContextOverflowError."""
        if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[1], slice)):
            raise InvalidArgumentError("index must be (row, slice(start, stop))")
        row = self._check_row(index[0])
        cols = index[1]
        if cols.step not in (None, 1):
            raise InvalidArgumentError(f"slice step must be 1, got {cols.step}")
        start, stop = self._check_columns(cols.start, cols.stop)
        new = torch.as_tensor(values, device=self.device)
        if new.numel() and not is_integer_dtype(new.dtype):  # metadata: never truncate
            raise InvalidArgumentError(f"slots must be integers, got dtype {new.dtype}")
        new = new.to(torch.int32)
        if new.dim() != 1 or new.numel() != stop - start:
            raise InvalidArgumentError(f"{new.numel()} values for {stop - start} columns")
        self.req_to_token[row, start:stop] = new

    def read(self, row: int, start: int, stop: int) -> torch.Tensor:
        """A copy (int32, on the device) of ``req_to_token[row, start:stop]`` (checks as in
        :meth:`write`)."""
        self._check_row(row)
        start, stop = self._check_columns(start, stop)
        return self.req_to_token[row, start:stop].clone()

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain copy of the free rows and generations; ``rows`` lists ``(row, length)`` pairs whose
        first ``length`` columns to include (one device-to-host copy per row)."""
        contents = tuple(
            (row, tuple(int(v) for v in self.read(row, 0, length).tolist())) for row, length in rows
        )
        return ReqToTokenSnapshot(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(self.free_slots),
            req_generation=tuple(self.req_generation),
            rows=contents,
        )


__all__ = ["ReqToTokenPool"]
