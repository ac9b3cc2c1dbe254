"""``SessionSlot``: streaming-session ownership transfer between turns.

When a session turn finishes, the slot TAKES the request's row, KV lengths, ``cache_protected_len``
and ``last_node`` (the tree lock stays held, now on the session's behalf), after freeing the
turn's over-allocation ``[ceil_align(kv_committed_len, ps), kv_allocated_len)`` (a speculative
step's reserve, and the tokens past a stop): its allocated length becomes its committed one, as
both SGLang releases' streaming sessions trim at the hand-over (``_trim_overshoot``). The
request's fields are nulled so its release frees nothing. The next turn's first ``extend``
RESTORES them into the new request and reuses the row (legal: committed KV > 0). Closing drops
the lock, frees ``[cache_protected_len, kv_allocated_len)`` (the tree owns
``[0, cache_protected_len)``; the start is page-aligned) and returns the row through the pool's
own ``free``.

Units: lengths are tokens, ``req_pool_idx`` a row, the rest slots. While the slot holds a row it
privately owns ``[cache_protected_len, ceil_align(kv_committed_len, ps))``.

Decisions: one turn at a time (``busy_with`` names the registered turn from ``new_req`` until it
finishes or is aborted); a turn's tokens are the session's committed tokens followed by its input;
its namespace is the session's (a turn naming another ``extra_key`` is refused by the manager). If
a restored turn is aborted or retracted, its KV is released and the slot forgets its history.
"""

from __future__ import annotations

from kvpool.constants import ceil_align, is_power_of_two
from kvpool.errors import InvalidArgumentError, RequestStateError
from kvpool.host_checks import as_bool, as_instance, as_int
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import TreeNode
from kvpool.reference.req import Req


def check_pools(req_to_token_pool: object, allocator: object) -> None:
    """The pools a slot's row goes back through: a request table (``read`` and ``free``) and a
    token allocator (``free`` and ``free_segment``); InvalidArgumentError naming the argument
    otherwise. Duck-typed: an injected pool offering those calls qualifies."""
    check_table(req_to_token_pool)
    calls = ("free", "free_segment")
    if not all(callable(getattr(allocator, c, None)) for c in calls):
        raise InvalidArgumentError(f"allocator must offer {' and '.join(calls)}, got {allocator!r}")


def check_table(req_to_token_pool: object) -> None:
    """A request table a slot's row is read from and goes back through (``read`` and
    ``free``); InvalidArgumentError otherwise."""
    if not all(callable(getattr(req_to_token_pool, c, None)) for c in ("read", "free")):
        raise InvalidArgumentError(
            f"req_to_token_pool must offer read and free, got {req_to_token_pool!r}"
        )


def check_page_size(page_size: object, allocator: object = None) -> int:
    """``page_size`` (tokens) as an int: a power of two, the allocator's own when it says
    (``allocator.page_size``); InvalidArgumentError otherwise."""
    ps = as_int("page_size", page_size)
    if not is_power_of_two(ps):
        raise InvalidArgumentError(f"page_size must be a power of two >= 1, got {page_size!r}")
    own = getattr(allocator, "page_size", ps)
    if own != ps:
        raise InvalidArgumentError(f"page_size {ps} is not the allocator's page size {own}")
    return ps


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

    def take_from(
        self,
        req: Req,
        req_to_token_pool: ReqToTokenPool,
        allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        segments: bool = False,
    ) -> None:
        """A turn finished: free its over-allocation ``[ceil_align(kv_committed_len),
        kv_allocated_len)`` (``free``, or with ``segments`` ``free_segment``: SGLang 0.5.23's
        ``free_kv_row``), then take its row, lengths (allocated = committed), protected length
        and lock; null the request. Before any change: InvalidArgumentError for pools without
        the calls used, a page size that is not the allocator's, a non-bool ``segments`` or
        anything but a request holding a row; RequestStateError when the slot holds a turn
        already or ``req`` is not its busy turn."""
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

    def restore_into(self, req: Req, req_to_token_pool: ReqToTokenPool) -> None:
        """Hand the row, KV and lock to the next turn ``req`` (``req.kv_allocated_len ==
        req.kv_committed_len``: the hand-over freed the rest; its last partial page stays its
        own). Before any change: InvalidArgumentError for a pool without ``read`` and ``free``
        or a non-request ``req``; RequestStateError when the slot holds no turn or ``req``
        holds a row."""
        check_table(req_to_token_pool)
        req = as_instance("req", req, Req)
        if self.req_pool_idx is None:
            raise RequestStateError(f"session {self.session_id!r} holds no turn to restore")
        if req.req_pool_idx is not None:
            raise RequestStateError(f"request {req.rid!r} holds a row already")
        assert self.req_pool_idx is not None
        row = self.req_pool_idx
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
    req_to_token_pool: ReqToTokenPool,
    allocator: BaseTokenToKVPoolAllocator,
    row: int,
    start: int,
    stop: int,
    segments: bool,
) -> None:
    """Free the slots of ``row``'s columns ``[start, stop)`` as one piece: ``free``, or with
    ``segments`` ``free_segment`` (SGLang 0.5.23's ``free_kv_row``)."""
    slots = req_to_token_pool.read(row, start, stop)
    if segments:
        allocator.free_segment(slots, start)
    else:
        allocator.free(slots)


__all__ = ["SessionSlot", "check_page_size", "check_pools", "check_table"]
