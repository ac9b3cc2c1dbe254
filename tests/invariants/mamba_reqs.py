"""A plain request with the fields the hybrid pool reads and writes (for tests)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Req:
    """:class:`kvpool.protocols.MambaReqLike` (and the twin's tensor-valued form)."""

    req_pool_idx: int | None = None
    is_chunked: int = 0
    kv_committed_len: int = 0
    mamba_pool_idx: Any = None
    mamba_needs_clear: bool = False
    mamba_cow_src_index: Any = None
    mamba_ping_pong_track_buffer: Any = None
    mamba_next_track_idx: int | None = None
