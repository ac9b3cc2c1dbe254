"""What a component reads of a request: ``ReqLike`` (the request table) and ``MambaReqLike`` (a
hybrid model's request table).

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ReqLike(Protocol):
    """What :meth:`ReqToTokenPoolProtocol.alloc` reads of a request.

    A request may keep its row (``req_pool_idx`` already set) only when ``is_chunked > 0`` (between
    prefill chunks) or ``kv_committed_len > 0`` (committed KV, e.g. a session continuation)."""

    req_pool_idx: int | None
    is_chunked: int
    kv_committed_len: int


class MambaReqLike(ReqLike, Protocol):
    """What ``HybridReqToTokenPool`` reads and writes of a request besides :class:`ReqLike`:
    its Mamba slot, whether that slot must be cleared before the next forward, the slot of a
    cached state to copy into it first (copy-on-write), and its speculative track buffers."""

    mamba_pool_idx: int | None
    mamba_needs_clear: bool
    mamba_cow_src_index: int | None
    mamba_ping_pong_track_buffer: list[int] | None
    mamba_next_track_idx: int | None


__all__ = ["MambaReqLike", "ReqLike"]
