"""``SessionSlot`` (optimized twin): streaming-session ownership transfer between turns.

Mirrors :mod:`kvpool.reference.lifecycle.session` exactly (see there for the rules): a finished
turn's over-allocation ``[ceil_align(kv_committed_len, ps), kv_allocated_len)`` is freed, then its
row, KV lengths, ``cache_protected_len`` and ``last_node`` move into the slot (the tree lock stays
held); the next turn's first ``extend`` restores them; closing frees ``[cache_protected_len,
kv_allocated_len)`` and returns the row through the pool's own ``free``.

Units: lengths are tokens, ``req_pool_idx`` a row, the rest slots (int64 tensors here).
"""

from __future__ import annotations

import torch

from kvpool.constants import ceil_align
from kvpool.errors import InvalidArgumentError, RequestStateError
from kvpool.host_checks import as_bool, as_instance, instance_list
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.lifecycle.batch_table import gather_columns, rows_of
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.optimized.radix_key import TreeNode
from kvpool.optimized.req import Req
from kvpool.protocols.pools import ReqToTokenPoolProtocol, SegmentAllocatorProtocol
from kvpool.reference.lifecycle.session import check_page_size, check_pools, check_table


class SessionSlot:
    """What a session holds between turns. Satisfies ``ReqLike`` (``is_chunked`` is always 0)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.req_pool_idx: int | None = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.last_node: TreeNode | None = None
        self.tokens: list[int] = []
        self.extra_key: str | None = None
        self.has_namespace = False
        self.busy_with: str | None = None
        self.is_chunked = 0
        self._forget_mamba()

    def _forget_mamba(self) -> None:
        """Hybrid models: the Mamba slot and track buffers the slot holds (the state after the
        session's committed tokens); None when it holds none (:class:`MambaReqLike` fields)."""
        self.mamba_pool_idx: int | None = None
        self.mamba_needs_clear = False
        self.mamba_cow_src_index: int | None = None
        self.mamba_ping_pong_track_buffer: list[int] | None = None
        self.mamba_next_track_idx: int | None = None

    def holds_kv(self) -> bool:
        """True while the slot holds a finished turn's row."""
        return self.req_pool_idx is not None

    def forget(self) -> None:
        """Drop every field about KV and history (the resources were released elsewhere)."""
        self.req_pool_idx = None
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self.cache_protected_len = 0
        self.last_node = None
        self.tokens = []
        self._forget_mamba()

    def take_from(
        self,
        req: Req,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        allocator: SegmentAllocatorProtocol[torch.Tensor],
        page_size: int,
        segments: bool = False,
    ) -> None:
        """A turn finished: free its over-allocation ``[ceil_align(kv_committed_len),
        kv_allocated_len)`` (``free``, or with ``segments`` ``free_segment``), then take its
        row, lengths (allocated = committed), protected length and lock; null the request.
        Before any change: InvalidArgumentError for pools without the calls used, a page size
        that is not the allocator's, a non-bool ``segments`` or anything but a request holding a
        row; RequestStateError when the slot holds a turn already or ``req`` is not its busy
        turn."""
        check_pools(req_to_token_pool, allocator)
        page_size = check_page_size(page_size, allocator)
        segments = as_bool("segments", segments)
        req = as_instance("req", req, Req)
        if self.req_pool_idx is not None:
            raise RequestStateError(f"session {self.session_id!r} holds a turn already")
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row to hand over")
        if self.busy_with != req.rid:
            raise RequestStateError(
                f"session {self.session_id!r} is busy with {self.busy_with!r}, not {req.rid!r}"
            )
        start = ceil_align(req.kv_committed_len, page_size)
        if req.kv_allocated_len > start:
            _free_columns(req_to_token_pool, allocator, req.req_pool_idx, start,
                          req.kv_allocated_len, segments)  # fmt: skip
        self.req_pool_idx = req.req_pool_idx
        self.kv_committed_len = req.kv_committed_len
        self.kv_allocated_len = req.kv_committed_len
        self.cache_protected_len = req.cache_protected_len
        self.last_node = req.last_node
        self.tokens = req.all_token_ids[: req.kv_committed_len]
        self.extra_key = req.extra_key
        self.has_namespace = True
        self.busy_with = None
        # A hybrid turn's Mamba slot holds the state after exactly these committed tokens: the
        # next turn resumes from it (its track buffers stay with it, as the row does).
        self.mamba_pool_idx = req.mamba_pool_idx
        self.mamba_ping_pong_track_buffer = req.mamba_ping_pong_track_buffer
        self.mamba_next_track_idx = req.mamba_next_track_idx
        req.reset_kv_fields()

    def restore_into(
        self,
        req: Req,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        row_read: torch.Tensor | None = None,
    ) -> None:
        """Hand the row, KV and lock to the next turn ``req`` (``req.kv_allocated_len ==
        req.kv_committed_len``: the hand-over freed the rest). ``row_read``: the row's columns
        ``[0, kv_allocated_len)`` as int64 when the caller read them already (a batch of
        restores reads every row in one gather, see :meth:`read_rows`). Before any change:
        InvalidArgumentError for a pool without ``read`` and ``free``, a non-request ``req`` or
        a ``row_read`` that is not a 1-D integer index of ``kv_allocated_len`` slots;
        RequestStateError when the slot holds no turn or ``req`` holds a row."""
        check_table(req_to_token_pool)
        req = as_instance("req", req, Req)
        if self.req_pool_idx is None:
            raise RequestStateError(f"session {self.session_id!r} holds no turn to restore")
        if req.req_pool_idx is not None:
            raise RequestStateError(f"request {req.rid!r} holds a row already")
        if row_read is not None:
            # a tensor stays where it is (no copy); a host list goes to the table's device
            device = (
                row_read.device
                if isinstance(row_read, torch.Tensor)
                else getattr(req_to_token_pool, "device", "cpu")
            )
            row_read = index_tensor("row_read", row_read, device)
            if row_read.numel() != self.kv_allocated_len:
                raise InvalidArgumentError(
                    f"row_read holds {row_read.numel()} slots, the row {self.kv_allocated_len}"
                )
        assert self.req_pool_idx is not None
        row = self.req_pool_idx
        if row_read is None:
            row_read = req_to_token_pool.read(row, 0, self.kv_allocated_len).to(torch.int64)
        req.req_pool_idx = row
        req.kv_committed_len = self.kv_committed_len
        req.kv_allocated_len = self.kv_committed_len
        req.cache_protected_len = self.cache_protected_len
        req.last_node = self.last_node
        req.prefix_indices = row_read[: self.kv_committed_len]
        req.mamba_pool_idx = self.mamba_pool_idx
        req.mamba_ping_pong_track_buffer = self.mamba_ping_pong_track_buffer
        req.mamba_next_track_idx = self.mamba_next_track_idx
        self.forget()

    @staticmethod
    def read_rows(
        slots: list[SessionSlot],
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        device: torch.device,
    ) -> list[torch.Tensor]:
        """Each slot's row ``[0, kv_allocated_len)`` as int64 views of one gather (the
        ``row_read`` of :meth:`restore_into`)."""
        slots = instance_list("slots", slots, SessionSlot)
        empty = [s.session_id for s in slots if s.req_pool_idx is None]
        if empty:
            raise RequestStateError(f"sessions {empty} hold no turn")
        if not callable(getattr(req_to_token_pool, "read", None)):
            raise InvalidArgumentError(
                f"req_to_token_pool must offer read, got {req_to_token_pool!r}"
            )
        if not isinstance(device, torch.device):
            raise InvalidArgumentError(f"device must be a torch.device, got {device!r}")
        if not slots:
            return []
        rows = rows_of(slots)
        stops = [s.kv_allocated_len for s in slots]
        flat = gather_columns(req_to_token_pool, rows, [0] * len(slots), stops, device)
        return list(torch.split(flat, stops))

    def close(
        self,
        req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
        allocator: SegmentAllocatorProtocol[torch.Tensor],
        segments: bool = False,
    ) -> None:
        """Free ``[cache_protected_len, kv_allocated_len)`` (``free``, or with ``segments``
        ``free_segment``) and the row (the caller drops the lock, see
        :meth:`MemoryManager.close_session`)."""
        check_pools(req_to_token_pool, allocator)
        segments = as_bool("segments", segments)
        if self.req_pool_idx is None:
            return
        _free_columns(req_to_token_pool, allocator, self.req_pool_idx, self.cache_protected_len,
                      self.kv_allocated_len, segments)  # fmt: skip
        if self.mamba_pool_idx is not None:  # a hybrid model: the state goes back with the row
            assert isinstance(req_to_token_pool, HybridReqToTokenPool)
            req_to_token_pool.free_mamba_cache(self)
        req_to_token_pool.free(self)
        self.forget()


def _free_columns(
    req_to_token_pool: ReqToTokenPoolProtocol[torch.Tensor],
    allocator: SegmentAllocatorProtocol[torch.Tensor],
    row: int,
    start: int,
    stop: int,
    segments: bool,
) -> None:
    """Free the slots of ``row``'s columns ``[start, stop)`` (int64) as one piece: ``free``, or
    with ``segments`` ``free_segment``."""
    slots = req_to_token_pool.read(row, start, stop).to(torch.int64)
    if segments:
        allocator.free_segment(slots, start)
    else:
        allocator.free(slots)


__all__ = ["SessionSlot"]
