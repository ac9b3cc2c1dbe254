"""``BatchRows``: how the twin's lifecycle reads and writes the request table per batch (a
mixin of :class:`~kvpool.optimized.lifecycle.primitives.LifecyclePrimitives`; optimized only,
the reference reads a row per request).

Each method is a fixed number of tensor operations whatever the batch size, planned from
host-side lengths (:mod:`kvpool.optimized.lifecycle.batch_table`): ``last_loc`` of every request,
one gather of the rows a release reads, one write of the KV tags of the tokens a step computes.
Units: tokens for lengths and columns, slots for table values.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvpool.kernels.host import to_device
from kvpool.optimized.kv.kv_cache import KVCache
from kvpool.optimized.lifecycle.batch_table import (
    gather_columns,
    last_locs,
    read_held_rows,
    rows_of,
)
from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.req import Req


class BatchRows:
    """Batched row reads and KV writes over the manager's pools (attributes below are the
    manager's)."""

    page_size: int
    device: torch.device
    kernel_backend: str | None
    req_to_token_pool: ReqToTokenPool
    kv_cache: KVCache
    mamba_hooks: MambaHooks | None
    _empty: torch.Tensor
    _no_last_loc: torch.Tensor
    _rows_read: dict[str, tuple[int, int, torch.Tensor]]

    def _prefix_last_locs(self, reqs: Sequence[Req]) -> torch.Tensor:
        """The last slot of each request's ``prefix_indices`` (-1 when empty), int64 on the
        device: one concatenation of one-element views (as SGLang builds ``last_loc``)."""
        if self.page_size == 1 or not reqs:
            return self._empty  # page size 1 never reads last_loc
        none = self._no_last_loc
        return torch.cat([r.prefix_indices[-1:] if len(r.prefix_indices) else none for r in reqs])

    def _row_last_locs(self, reqs: Sequence[Req], cols: Sequence[int]) -> torch.Tensor:
        """The slot of column ``cols[i] - 1`` of each request's row (-1 for column 0), int64 on
        the device (kvpool's ``get_last_loc``; nothing for page size 1, which never reads it)."""
        if self.page_size == 1 or not reqs:
            return self._empty
        rows = rows_of(reqs)
        return last_locs(self.req_to_token_pool, rows, cols, self.device, self.kernel_backend)

    def _held_row(self, req: Req, row: int) -> torch.Tensor:
        """Slots (int64) of columns ``[0, kv_allocated_len)`` of ``row``: the view
        :meth:`_read_held_rows` read for this batch when it covers exactly that range, else one
        gather of the row."""
        stop = req.kv_allocated_len
        ahead = self._rows_read.pop(req.rid, None)
        if ahead is not None and ahead[:2] == (row, stop):
            return ahead[2]
        return gather_columns(self.req_to_token_pool, [row], [0], [stop], self.device)

    def _read_rows(self, reqs: Sequence[Req]) -> dict[str, torch.Tensor]:
        """``rid -> row[:kv_allocated_len]`` (int64 views of one gather for the batch): what a
        prefill batch's chunked requests hand to ``cache_unfinished_req``."""
        return {
            rid: t[2]
            for rid, t in read_held_rows(self.req_to_token_pool, reqs, self.device).items()
        }

    def _read_held_rows(self, reqs: Sequence[Req]) -> None:
        """Read every request's row in one gather for :meth:`release_kv_cache` (a finish
        batch; see :func:`~kvpool.optimized.lifecycle.batch_table.read_held_rows`)."""
        self._rows_read = read_held_rows(self.req_to_token_pool, reqs, self.device)

    def write_kv(self, req: Req, start: int, stop: int) -> None:
        """Compute (write the tags of) tokens ``[start, stop)`` of ``req`` into their slots."""
        self.write_kv_batch([req], [start], [stop])

    def write_kv_batch(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        stops: Sequence[int],
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute tokens ``[starts[i], stops[i])`` of every request: one write of their tags
        into their slots (``slots``, flat in batch order, when the caller has them; else read
        from the rows in one gather). Returns the slots (int64)."""
        if slots is None:
            rows = rows_of(reqs)
            slots = gather_columns(self.req_to_token_pool, rows, starts, stops, self.device)
        parts = [r.kv_tags_upto(b)[a:b] for r, a, b in zip(reqs, starts, stops, strict=True)]
        if parts and slots.numel():
            tags = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self.kv_cache.write_tags(slots, to_device(tags, self.device))
        if self.mamba_hooks is not None:
            self.mamba_hooks.after_writes(reqs, stops)
        return slots


__all__ = ["BatchRows"]
