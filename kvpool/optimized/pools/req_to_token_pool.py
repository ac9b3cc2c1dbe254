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

import numpy as np
import numpy.typing as npt
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
from kvpool.host_checks import int_list
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.protocols.requests import ReqLike
from kvpool.reference.pools.req_to_token_pool import (
    SLOT_VALUE_LIMIT,
    request_count,
    request_list,
    snapshot_rows,
    table_request,
)
from kvpool.rules import Rules
from kvpool.snapshot import ReqToTokenSnapshot


class ReqToTokenPool:
    """The table, the free-row list (ordered as in the reference) and ``req_generation``
    (bumped each time a row is handed out; :meth:`clear` keeps or zeroes it per ``rules``).

    Every check on rows and columns is on host values (a host byte per row for membership), so
    all are done in both modes: freeing a free row (DoubleFreeError), keeping a row that is free
    or named twice in a batch (RowReuseError), reading or writing a free row, rows and columns
    out of range, non-integer values. Slot values written from a tensor are range-checked in
    checked mode only (a device read); from a list, always. ``options`` place the table and
    set checked mode."""

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
        self._numpy_view: tuple[torch.Tensor, int, npt.NDArray[np.int32]] | None = None
        """The table's host view (:meth:`_table_view`): the table it views, its address, the
        view."""
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
        one), as the reference."""
        checked = self._check_row(row)
        if self._free_set[checked]:
            raise InvalidArgumentError(f"row {checked} is free: no request holds it")
        return checked

    # ----------------------------------------------------------------- rows
    def available_size(self) -> int:
        """Number of free rows."""
        return len(self.free_slots)

    def check_alloc(self, reqs: Sequence[ReqLike]) -> int:
        """Validate a batch for :meth:`alloc` without changing anything; returns the number of
        fresh rows it needs. A request with ``req_pool_idx`` set may keep it only when
        ``is_chunked > 0`` or ``kv_committed_len > 0`` (else RowReuseError), and a kept row must
        be neither free nor named twice (RowReuseError); a request without a row named twice in
        the batch, ``reqs`` that is not a sequence of requests and a non-int ``is_chunked`` /
        ``kv_committed_len`` are InvalidArgumentError."""
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
            if self._free_set[row] or row in kept:
                raise RowReuseError(f"request {i} keeps row {row}, which is free or shared")
            kept.add(row)
        return fresh

    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None:
        """Every request's row, in batch order (see the reference). A request with
        ``req_pool_idx`` set keeps it (see :meth:`check_alloc`; misuse raises before any change);
        the others take, in batch order, the block :meth:`_take_rows` removes, bumping each
        row's generation. ``None`` (no change) when fewer rows are free than needed."""
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
        already free (a host byte per row: checked in both modes); InvalidArgumentError for an
        object that is not a request."""
        req = table_request(req)
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
        ``index`` is ``(row, slice(start, stop))`` with explicit bounds (step 1) and a held row.
        ``values`` is a 1-D integer tensor or a sequence of integers (InvalidArgumentError,
        both modes) of ``stop - start`` slot ids in ``[0, SLOT_VALUE_LIMIT)`` (a list: always;
        a tensor: checked mode, a device read); ``stop > max_context_len`` is
        ContextOverflowError."""
        if not (isinstance(index, tuple) and len(index) == 2 and isinstance(index[1], slice)):
            raise InvalidArgumentError(f"index must be (row, slice(start, stop)), got {index!r}")
        row = self._check_held(index[0])
        cols = index[1]
        if cols.step not in (None, 1):
            raise InvalidArgumentError(f"slice step must be 1, got {cols.step}")
        start, stop = self._check_columns(cols.start, cols.stop)
        host = not isinstance(values, torch.Tensor)
        if host:  # host values: the reference's range check costs no device read
            listed = int_list("values", values)
            bad = [v for v in listed if not 0 <= v < SLOT_VALUE_LIMIT]
            if bad:
                raise InvalidArgumentError(
                    f"values: slot ids outside [0, {SLOT_VALUE_LIMIT}): {bad[:8]}"
                )
        new = index_tensor("values", values, self.device)  # 1-D, integer: never truncated
        if new.numel() != stop - start:
            raise InvalidArgumentError(f"{new.numel()} values for {stop - start} columns")
        if self.checked and not host and new.numel():
            low, high = int(new.min()), int(new.max())
            if low < 0 or high >= SLOT_VALUE_LIMIT:
                raise InvalidArgumentError(
                    f"values: slot ids outside [0, {SLOT_VALUE_LIMIT}): {[low, high]}"
                )
        self.req_to_token[row, start:stop] = new.to(torch.int32)

    def read(self, row: int, start: int, stop: int) -> torch.Tensor:
        """A copy (int32, on the device) of ``req_to_token[row, start:stop]`` (checks as in
        :meth:`write`: a held row)."""
        self._check_held(row)
        start, stop = self._check_columns(start, stop)
        return self.req_to_token[row, start:stop].clone()

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain copy of the free rows and generations; ``rows`` lists ``(row, length)`` pairs whose
        first ``length`` columns to include, free rows too (one host read of the table).
        InvalidArgumentError unless ``rows`` is a sequence of int pairs; rows and lengths are
        checked as :meth:`read`'s."""
        pairs = snapshot_rows(rows)
        for row, length in pairs:
            self._check_row(row)
            self._check_columns(0, length)
        read = self._host_rows(pairs)
        return self._snapshot_of(
            [(row, tuple(v.tolist())) for (row, _), v in zip(pairs, read, strict=True)]
        )

    def _snapshot_of(self, contents: Sequence[tuple[int, tuple[int, ...]]]) -> ReqToTokenSnapshot:
        """:meth:`snapshot` whose rows ``contents`` (``(row, values)`` pairs) were already read
        and checked by the caller."""
        return ReqToTokenSnapshot(
            size=self.size,
            max_context_len=self.max_context_len,
            free_slots=tuple(self.free_slots),
            req_generation=tuple(self.req_generation),
            rows=tuple(contents),
        )

    def _read_held(self, pairs: Sequence[tuple[int, int]]) -> list[npt.NDArray[np.int32]]:
        """:meth:`read` of columns ``0:stop`` of each ``(row, stop)`` pair (the same checks and
        errors, pair by pair), from one host read of the table (:meth:`_host_rows`)."""
        size, width, free = self.size, self.max_context_len, self._free_set
        for row, stop in pairs:
            # the checks' passing case inline (exact ints: a bool fails ``type(...) is int``);
            # anything else takes the checks themselves, for their errors
            if (
                type(row) is int
                and type(stop) is int
                and RESERVED_INDEX < row <= size
                and 0 <= stop <= width
                and not free[row]
            ):
                continue
            self._check_held(row)
            self._check_columns(0, stop)
        return self._host_rows(pairs)

    def _table_view(self, table: torch.Tensor) -> npt.NDArray[np.int32]:
        """``table.numpy()`` of the CPU table, made once (``Tensor.numpy`` costs more than the
        reads it serves): the table is never resized, so its view stays its view; another
        tensor (a replaced table: a new object or new memory) gets its own."""
        held = self._numpy_view
        if held is None or held[0] is not table or held[1] != table.data_ptr():
            held = self._numpy_view = (table, table.data_ptr(), table.numpy())
        return held[2]

    def _host_rows(self, pairs: Sequence[tuple[int, int]]) -> list[npt.NDArray[np.int32]]:
        """The first ``length`` columns of each ``(row, length)`` pair (checked by the caller)
        as int32 host arrays: views of the table on the CPU (convert them before it changes);
        on another device, one gather of the rows and one copy."""
        if not pairs:
            return []
        table = self.req_to_token
        if table.is_cpu:  # ``is_cpu``: one attribute, not a device object's ``type``
            view = self._table_view(table)
            return [view[row, :length] for row, length in pairs]
        index = torch.tensor([row for row, _ in pairs], dtype=torch.int64, device=table.device)
        width = max(length for _, length in pairs)
        copied: npt.NDArray[np.int32] = table[index, :width].cpu().numpy()
        return [copied[i, :length] for i, (_, length) in enumerate(pairs)]


__all__ = ["ReqToTokenPool"]
