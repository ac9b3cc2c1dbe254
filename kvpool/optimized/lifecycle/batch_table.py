"""Batched work on the request-to-token table for the lifecycle (optimized twin only).

The lifecycle knows every length and row of a step on the host (as SGLang's scheduler keeps CPU
copies of them). These helpers turn such host integers into one host-to-device copy and run a
fixed number of tensor operations per batch, whatever its size, with no device-to-host read:

- :func:`device_ints`: host integers as one int64 tensor on the device (``non_blocking``);
- :func:`last_locs`: the slot of column ``col - 1`` of each row (kvpool's ``get_last_loc``);
- :func:`gather_columns` / :func:`scatter_columns`: columns ``[start_i, stop_i)`` of row
  ``rows[i]``, read into / written from one flat tensor in batch order (index plans built on
  the host);
- :func:`write_rows`: ``row[:S] = prefix + new`` for a prefill batch (kvpool's
  ``write_req_to_token``).

A pool without a ``req_to_token`` tensor (an injected one, e.g. SGLang's own behind an adapter)
is served through its ``read`` / ``write``, one call per request. Rows and columns are trusted:
the lifecycle computes them from its own state and checks them against ``max_context_len``
first. Units: rows, columns (tokens), slots.

``host=True`` (the checked-mode lifecycle passes it: its checks read the device anyway) lets a
helper work on a CPU table through NumPy views instead, per request (a batch holds a few
requests; a tensor operation costs more): the same values, and the unchecked hot path, which an
engine runs on a GPU, keeps its fixed number of tensor operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
import torch

from kvpool import kernels
from kvpool.kernels.host import to_device
from kvpool.kernels.last_loc import get_last_loc_host
from kvpool.kernels.write_req_to_token import write_req_to_token_host
from kvpool.protocols.pools import ReqToTokenPoolProtocol

Ints = Sequence[int] | npt.NDArray[np.int64]

TablePool = ReqToTokenPoolProtocol[torch.Tensor]
"""The request-to-token pool the helpers work on (its ``req_to_token`` tensor when it has one,
else its ``read`` / ``write``)."""


class RowHolder(Protocol):
    """A request or a session: the row it holds, if any."""

    @property
    def req_pool_idx(self) -> int | None: ...


class OverAllocated(RowHolder, Protocol):
    """What :func:`read_held_rows` reads of a request (lengths in tokens)."""

    @property
    def rid(self) -> str: ...
    @property
    def kv_committed_len(self) -> int: ...
    @property
    def kv_allocated_len(self) -> int: ...


def rows_of(holders: Sequence[RowHolder]) -> list[int]:
    """The rows (``req_pool_idx``) of requests or sessions that hold one."""
    rows = [h.req_pool_idx for h in holders]
    assert None not in rows, "every request of the batch holds a row"
    return cast(list[int], rows)


def table_of(pool: object) -> torch.Tensor | None:
    """The pool's ``req_to_token`` tensor, or None for a pool that does not expose one."""
    table = getattr(pool, "req_to_token", None)
    return table if isinstance(table, torch.Tensor) else None


def device_ints(values: Ints | Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """Host integers (a list or an array, any shape) as an int64 tensor on ``device``: one
    ``non_blocking`` copy from the host (shared memory on the CPU)."""
    return to_device(np.asarray(values, dtype=np.int64), device)


def _plan(rows: Ints, starts: Ints, stops: Ints) -> npt.NDArray[np.int64]:
    """``[[row of each cell], [column of each cell]]`` (2 x total) in batch order."""
    r = np.asarray(rows, dtype=np.int64)
    a = np.asarray(starts, dtype=np.int64)
    lens = np.asarray(stops, dtype=np.int64) - a
    total = int(lens.sum())
    first = np.cumsum(lens) - lens  # position of each request's first cell
    cols = np.arange(total, dtype=np.int64) + np.repeat(a - first, lens)
    return np.stack((np.repeat(r, lens), cols))


def _table_numpy(pool: TablePool, table: torch.Tensor) -> npt.NDArray[np.generic]:
    """``table.numpy()`` of a CPU table: the pool's kept view when it keeps one
    (:meth:`~kvpool.optimized.pools.req_to_token_pool.ReqToTokenPool._table_view`)."""
    view_of = getattr(pool, "_table_view", None)
    if view_of is None:
        return table.numpy()
    view: npt.NDArray[np.generic] = view_of(table)
    return view


def _host_cells(table: torch.Tensor, rows: Ints, starts: Ints, stops: Ints) -> bool:
    """Whether the cells lie inside a CPU ``table`` (every row a valid index, ``0 <= start <=
    stop <= width``), so that NumPy slices of its view read or write exactly them; False sends
    the caller to the tensor path, which raises for a cell outside."""
    if table.device.type != "cpu":
        return False
    height, width = table.shape
    for r, a, b in zip(rows, starts, stops, strict=True):
        if not (-height <= r < height and 0 <= a <= b <= width):
            return False
    return True


def gather_columns(
    pool: TablePool,
    rows: Ints,
    starts: Ints,
    stops: Ints,
    device: torch.device,
    host: bool = False,
) -> torch.Tensor:
    """``cat(table[rows[i], starts[i]:stops[i]])`` as int64 (a new tensor). ``host``: the
    caller allows host work on a CPU table (checked mode; see the module docstring)."""
    table = table_of(pool)
    if host and table is not None and _host_cells(table, rows, starts, stops):
        # a CPU table: slices of its NumPy view, one copy (a batch holds a few requests)
        view = _table_numpy(pool, table)
        cells = [view[r, a:b] for r, a, b in zip(rows, starts, stops, strict=True)]
        flat = np.concatenate(cells) if cells else np.empty(0, dtype=view.dtype)
        return torch.from_numpy(flat.astype(np.int64, copy=False))
    if table is None:
        parts = [
            pool.read(int(r), int(a), int(b)) for r, a, b in zip(rows, starts, stops, strict=True)
        ]
        if not parts:
            return torch.empty(0, dtype=torch.int64, device=device)
        return torch.cat(parts).to(device=device, dtype=torch.int64)
    idx = device_ints(_plan(rows, starts, stops), table.device)
    return table[idx[0], idx[1]].to(torch.int64)


def scatter_columns(
    pool: TablePool,
    rows: Ints,
    starts: Ints,
    stops: Ints,
    values: torch.Tensor,
    host: bool = False,
) -> None:
    """``table[rows[i], starts[i]:stops[i]] = values[...]`` (``values`` flat, batch order).
    ``host``: as :func:`gather_columns`."""
    table = table_of(pool)
    if table is None:
        pos = 0
        for r, a, b in zip(rows, starts, stops, strict=True):
            pool.write((int(r), slice(int(a), int(b))), values[pos : pos + int(b) - int(a)])
            pos += int(b) - int(a)
        return
    if (
        host
        and values.device.type == "cpu"
        and values.dim() == 1
        and _host_cells(table, rows, starts, stops)
        and sum(int(b) - int(a) for a, b in zip(starts, stops, strict=True)) == values.numel()
    ):  # a CPU table: slices of NumPy views (values cast to the table's dtype, as below)
        view, flat = _table_numpy(pool, table), values.numpy()
        pos = 0
        for r, a, b in zip(rows, starts, stops, strict=True):
            view[r, a:b] = flat[pos : pos + b - a]
            pos += b - a
        return
    idx = device_ints(_plan(rows, starts, stops), table.device)
    table[idx[0], idx[1]] = values.to(table.dtype)


def last_locs(
    pool: TablePool,
    rows: Sequence[int],
    cols: Sequence[int],
    device: torch.device,
    backend: str | None = None,
    host: bool = False,
) -> torch.Tensor:
    """int64: the slot of column ``cols[i] - 1`` of row ``rows[i]``, -1 where ``cols[i] == 0``
    (:func:`kvpool.kernels.get_last_loc`). ``host``: as :func:`gather_columns`."""
    table = table_of(pool)
    if host and table is not None:
        held = get_last_loc_host(table, rows, cols)
        if held is not None:
            return held
    if table is None:
        stops = [int(c) for c in cols]
        starts = [max(c - 1, 0) for c in stops]
        read = gather_columns(pool, rows, starts, stops, device)
        ends = np.cumsum(np.asarray(stops) - np.asarray(starts)) - 1
        out = torch.full((len(stops),), -1, dtype=torch.int64, device=device)
        has = [i for i, c in enumerate(stops) if c > 0]
        if has:
            out[has] = read[ends[has].tolist()]
        return out
    idx = device_ints(np.stack((np.asarray(rows), np.asarray(cols))), table.device)
    return kernels.get_last_loc(table, idx[0], idx[1], backend)


def write_rows(
    pool: TablePool,
    rows: Sequence[int],
    prefixes: Sequence[torch.Tensor],
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    new_slots: torch.Tensor,
    backend: str | None = None,
    host: bool = False,
) -> None:
    """``row[:P_i] = prefixes[i]``, ``row[P_i:S_i] = new_slots[...]`` for every request
    (:func:`kvpool.kernels.write_req_to_token`; ``new_slots`` flat in batch order). ``host``:
    as :func:`gather_columns`."""
    table = table_of(pool)
    if table is None:
        pos = 0
        for r, pre, p, s in zip(rows, prefixes, prefix_lens, seq_lens, strict=True):
            new = new_slots[pos : pos + s - p]
            pos += s - p
            pool.write((r, slice(0, s)), torch.cat((pre, new)) if p else new)
        return
    if not rows:
        return
    held = [
        p for p in prefixes if p.numel()
    ]  # a forgotten request's empty slots may be on the host
    prefix_slots = (held[0] if len(held) == 1 else torch.cat(held)) if held else new_slots[:0]
    if host and write_req_to_token_host(
        table, rows, prefix_slots, prefix_lens, seq_lens, new_slots
    ):  # a CPU table in checked mode: NumPy slices, no tensor operation
        return
    idx = device_ints(np.stack((rows, prefix_lens, seq_lens)), table.device)
    prefix_slots = prefix_slots.to(table.device)
    kernels.write_req_to_token(table, idx[0], prefix_slots, idx[1], idx[2], new_slots, backend)


def read_held_rows(
    pool: TablePool, reqs: Sequence[OverAllocated], device: torch.device, host: bool = False
) -> dict[str, tuple[int, int, torch.Tensor]]:
    """``rid -> (row, stop, slots)``: columns ``[0, stop = kv_allocated_len)`` of every request
    that holds a row and columns (what a release reads: the committed KV the tree takes or
    frees, and the over-allocation past it), in one gather for the batch; each request's slots
    (int64, 1-D, on ``device``) are a view of it, so slicing them launches nothing."""
    todo = [
        (r.rid, r.req_pool_idx, r.kv_allocated_len)
        for r in reqs
        if r.req_pool_idx is not None and r.kv_allocated_len > 0
    ]
    if not todo:
        return {}
    rows, stops = [t[1] for t in todo], [t[2] for t in todo]
    flat = gather_columns(pool, rows, [0] * len(todo), stops, device, host)
    out: dict[str, tuple[int, int, torch.Tensor]] = {}
    at = 0
    for rid, row, b in todo:  # slices: the views torch.split makes, without its overhead
        out[rid] = (row, b, flat[at : at + b])
        at += b
    return out


__all__ = [
    "OverAllocated",
    "RowHolder",
    "TablePool",
    "device_ints",
    "gather_columns",
    "last_locs",
    "read_held_rows",
    "rows_of",
    "scatter_columns",
    "table_of",
    "write_rows",
]
