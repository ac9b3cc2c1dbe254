"""The prefix cache: ``RadixCacheProtocol`` (match, insert, locks, eviction, sizes).

The rules every method shares: :mod:`kvpool.protocols`.
"""

from __future__ import annotations

from typing import Any, Protocol

from kvpool.protocols.index import IdxT_contra
from kvpool.snapshot import (
    TreeSnapshot,
)


class RadixCacheProtocol(Protocol[IdxT_contra]):
    """Prefix cache (SGLang's RadixCache; ``disable=True`` gives the ChunkCache behaviour).

    Sizes are tokens. The root has an empty key and ``lock_ref`` 1 forever. Keys are page-aligned
    (a trailing partial page is never inserted nor matched). Node ids come from a counter."""

    page_size: int
    disable: bool

    def match_prefix(self, key: Any) -> Any:
        """Longest cached page-aligned prefix of ``key`` (a RadixKey). Splits the node where the
        match ends inside it; refreshes access times. Returns a MatchResult with
        ``device_indices`` (IdxT) and ``last_device_node``."""
        ...

    def insert(self, key: Any, value: IdxT_contra | None = None) -> int:
        """Insert the page-aligned part; returns the length that was already cached. Frees
        nothing: the caller frees its duplicate slots."""
        ...

    def inc_lock_ref(self, node: Any) -> int: ...

    def dec_lock_ref(self, node: Any) -> int: ...

    def evict(self, num_tokens: int) -> int:
        """Evict whole unlocked leaves by policy until ``num_tokens`` are freed or nothing is
        evictable. Returns the tokens actually freed (may exceed the request)."""
        ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def reset(self) -> None: ...

    def pretty_print(self) -> str: ...

    def cache_finished_req(
        self, req: Any, is_insert: bool = True, row_read: Any = None
    ) -> None: ...

    def cache_unfinished_req(
        self, req: Any, chunked: bool = False, row_read: Any = None
    ) -> None: ...

    def snapshot(self) -> TreeSnapshot: ...


__all__ = ["RadixCacheProtocol"]
