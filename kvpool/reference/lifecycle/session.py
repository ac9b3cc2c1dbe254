"""``SessionSlot``: streaming-session ownership transfer between turns.

When a session turn finishes, the slot TAKES the request's row, KV lengths, ``cache_protected_len``
and ``last_node`` (the tree lock stays held, now on the session's behalf); the request's fields are
nulled so its release frees nothing. The next turn's first ``extend`` RESTORES them into the new
request: the orphan tail ``[ceil_align(kv_committed_len, ps), kv_allocated_len)`` (speculative
over-allocation of the last turn) is freed, and the row is reused (legal: committed KV > 0).
Closing drops the lock, frees ``[cache_protected_len, kv_allocated_len)`` (the tree owns
``[0, cache_protected_len)``; the start is page-aligned) and returns the row through the pool's
own ``free``.

Units: lengths are tokens, ``req_pool_idx`` a row, the rest slots. While the slot holds a row it
privately owns ``[cache_protected_len, ceil_align(kv_allocated_len, ps))``.

Decisions: one turn at a time (``busy_with`` names the registered turn from ``new_req`` until it
finishes or is aborted); a turn's tokens are the session's committed tokens followed by its input;
its namespace is the session's (a turn naming another ``extra_key`` is refused by the manager). If
a restored turn is aborted or retracted, its KV is released and the slot forgets its history.
"""

from __future__ import annotations

from kvpool.constants import ceil_align
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import TreeNode
from kvpool.reference.req import Req


class SessionSlot:
    """What a session holds between turns. Satisfies ``ReqLike`` (``is_chunked`` is always 0), so
    the row goes back through :meth:`ReqToTokenPool.free`."""

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

    def take_from(self, req: Req) -> None:
        """A turn finished: take its row, lengths, protected length and lock; null the request."""
        self.req_pool_idx = req.req_pool_idx
        self.kv_committed_len = req.kv_committed_len
        self.kv_allocated_len = req.kv_allocated_len
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

    def orphan_tail_tokens(self, page_size: int) -> int:
        """Tokens that :meth:`restore_into` frees: ``allocated - ceil_align(committed)`` (>= 0)."""
        return max(0, self.kv_allocated_len - ceil_align(self.kv_committed_len, page_size))

    def restore_into(
        self,
        req: Req,
        req_to_token_pool: ReqToTokenPool,
        allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        segments: bool = False,
    ) -> None:
        """Hand the row, KV and lock to the next turn ``req``; free the orphan tail (``free``, or
        with ``segments`` ``free_segment``: SGLang 0.5.23's ``free_kv_row``). Afterwards
        ``req.kv_allocated_len == req.kv_committed_len`` (its last partial page stays its own)."""
        assert self.req_pool_idx is not None
        row = self.req_pool_idx
        start = ceil_align(self.kv_committed_len, page_size)
        if self.kv_allocated_len > start:
            tail = req_to_token_pool.read(row, start, self.kv_allocated_len)
            if segments:
                allocator.free_segment(tail, start)
            else:
                allocator.free(tail)
        req.req_pool_idx = row
        req.kv_committed_len = self.kv_committed_len
        req.kv_allocated_len = self.kv_committed_len
        req.cache_protected_len = self.cache_protected_len
        req.last_node = self.last_node
        req.prefix_indices = req_to_token_pool.read(row, 0, self.kv_committed_len)
        req.mamba_pool_idx = self.mamba_pool_idx
        req.mamba_ping_pong_track_buffer = self.mamba_ping_pong_track_buffer
        req.mamba_next_track_idx = self.mamba_next_track_idx
        self.forget()

    def close(
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: BaseTokenToKVPoolAllocator,
        segments: bool = False,
    ) -> None:
        """Free ``[cache_protected_len, kv_allocated_len)`` (``free``, or with ``segments``
        ``free_segment``) and the row (the lock is dropped by the caller, see
        :meth:`MemoryManager.close_session`)."""
        if self.req_pool_idx is None:
            return
        row = self.req_pool_idx
        held = req_to_token_pool.read(row, self.cache_protected_len, self.kv_allocated_len)
        if segments:
            allocator.free_segment(held, self.cache_protected_len)
        else:
            allocator.free(held)
        if self.mamba_pool_idx is not None:  # a hybrid model: the state goes back with the row
            assert isinstance(req_to_token_pool, HybridReqToTokenPool)
            req_to_token_pool.free_mamba_cache(self)
        req_to_token_pool.free(self)
        self.forget()


__all__ = ["SessionSlot"]
