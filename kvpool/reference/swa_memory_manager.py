"""``SWAMemoryManager``: the request lifecycle of a hybrid sliding-window model.

A :class:`~kvpool.reference.memory_manager.MemoryManager` whose pools are the SWA ones
(:mod:`kvpool.injection` puts them in): an
:class:`~kvpool.reference.swa_allocator.SWATokenToKVPoolAllocator` of ``config.size`` full and
``config.swa_size`` SWA tokens, an :class:`~kvpool.reference.swa_chunk_cache.SWAChunkCache` and
an :class:`~kvpool.reference.swa_kv_pool.SWAKVPool` (even layers full attention, odd layers
sliding-window), all sharing the allocator's mapping. Every allocation takes both pools; every
release (finish, abort, retract, the over-allocation of a chunked prefill) frees, through the
allocator's ``free``, exactly the SWA slots still mapped.

After each ``decode`` the window of every decoded request moves:
:func:`~kvpool.reference.swa_lifecycle.free_swa_out_of_window_slots` releases the SWA slots of
its whole pages that left it (chunk-cache rule: keep ``sliding_window`` tokens), and the manager
remembers, per request row hand-out, its ``swa_evicted_seqlen`` (reported in the snapshot).

With the radix cache on (``disable_radix_cache=False``) the tree is an
:class:`~kvpool.reference.swa_radix_lifecycle.SWARadixLifecycle` (an ``SWARadixCache`` with
SGLang 0.5.16's SWA hand-overs): a finish inserts the committed tokens with the request's
``swa_evicted_seqlen`` (the released part becomes a tombstone node), the window keeps
``max(sliding_window, page_size)`` tokens, and capacity and eviction count each pool apart: a
step needs ``needed`` tokens of free plus evictable in the full pool *and* in the SWA pool, and
evicts each pool's deficit (:func:`~kvpool.reference.swa_lifecycle.evict_for_swa_alloc`).

Streaming sessions: a finished turn hands its row *and its window* (``swa_evicted_seqlen``) to
the session, the next turn's first extend carries them on, and a close frees the session's
slots through the allocator's ``free`` (each pool gets back exactly what it holds).

Scope (kvpool): at least 2 layers, an MHA layout, a window, plain KV storage and no host tier
(ConfigError otherwise: :func:`check_swa_config`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, InvalidArgumentError, OutOfMemoryError
from kvpool.reference.memory_manager import MemoryManager
from kvpool.reference.req_to_token_pool import ReqToTokenPool
from kvpool.reference.swa_allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa_chunk_cache import SWAChunkCache
from kvpool.reference.swa_kv_pool import SWAKVPool
from kvpool.reference.swa_lifecycle import evict_for_swa_alloc, free_swa_out_of_window_slots
from kvpool.reference.swa_radix_lifecycle import SWARadixLifecycle
from kvpool.snapshot import PoolSnapshot, SWAAllocatorSnapshot


def check_swa_config(config: PoolConfig) -> int:
    """The window (tokens) of a config an SWA manager accepts; ConfigError otherwise."""
    if config.sliding_window is None:
        raise ConfigError("an SWA manager needs config.sliding_window")
    if config.num_layers < 2 or config.kv_layout != "mha":
        raise ConfigError("an SWA manager needs an MHA layout of at least 2 layers")
    # its KV lives in SWAKVPool and its tree is the SWA one: say so rather than ignore the fields
    if config.kv_storage != "plain":
        raise ConfigError(f"an SWA manager stores plain KV (SWAKVPool), not {config.kv_storage!r}")
    if config.enable_hierarchical_cache:
        raise ConfigError("an SWA manager has no host tier (enable_hierarchical_cache)")
    return config.sliding_window


class SWAMemoryManager(MemoryManager):
    """The lifecycle over SWA pools (see the module docstring)."""

    def __init__(self, config: PoolConfig, clock: Callable[[], float] | None = None) -> None:
        window = check_swa_config(config)
        ps = config.page_size
        alloc = SWATokenToKVPoolAllocator(config.size, config.swa_size, ps, config.need_sort,
                                          rules=config.rules)  # fmt: skip
        layers = range(config.num_layers)
        kv = SWAKVPool(config.size, config.swa_size, ps, "float32", config.head_num,
                       config.head_dim, [i for i in layers if i % 2], [i for i in layers
                       if not i % 2], config.v_head_dim)  # fmt: skip
        kv.register_mapping(alloc.full_to_swa_index_mapping)

        def tree(
            cfg: PoolConfig, pool: ReqToTokenPool, a: SWATokenToKVPoolAllocator
        ) -> SWAChunkCache | SWARadixLifecycle:
            if cfg.disable_radix_cache:
                return SWAChunkCache(pool, a, ps, window)
            return SWARadixLifecycle(pool, a, ps, window, clock)

        super().__init__(
            config, clock, token_to_kv_pool_allocator=alloc, tree_cache=tree, kv_cache=kv
        )
        if isinstance(self.tree_cache, SWARadixLifecycle):
            self.tree_cache.evicted_of = lambda req: self.swa_evicted_seqlen(req.rid)
        self.sliding_window = window
        self._swa_evicted: dict[str, tuple[int, int, int]] = {}
        """rid -> (row, row generation, swa_evicted_seqlen): valid for that hand-out only."""
        self._session_swa: dict[str, int] = {}
        """session id -> the swa_evicted_seqlen of the turn whose row the session holds."""

    @property
    def _swa_allocator(self) -> SWATokenToKVPoolAllocator:
        """The token allocator, as the SWA allocator this manager built."""
        alloc = self.token_to_kv_pool_allocator
        assert isinstance(alloc, SWATokenToKVPoolAllocator)
        return alloc

    def swa_evicted_seqlen(self, rid: str) -> int:
        """Leading tokens of ``rid`` whose SWA slots its window released (0 without a row)."""
        req = self.reqs.get(rid)
        if req is None or req.req_pool_idx is None:
            return 0
        row = req.req_pool_idx
        gen = self.req_to_token_pool.req_generation[row]
        kept = self._swa_evicted.get(rid)
        return kept[2] if kept is not None and kept[:2] == (row, gen) else 0

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> list[int]:
        """The manager's decode, then every decoded request's window moves on."""
        slots = super().decode(rids, token_ids)
        alloc = self._swa_allocator
        for rid in rids:
            req = self.reqs[rid]
            row = req.req_pool_idx
            assert row is not None
            pre_len = req.kv_committed_len - 1  # the tokens before the one just decoded
            evicted = free_swa_out_of_window_slots(
                self.req_to_token_pool.read(row, 0, pre_len), self.swa_evicted_seqlen(rid),
                pre_len, req.cache_protected_len, self.sliding_window, self.page_size, alloc,
                is_chunk_cache=self.tree_cache.disable)  # fmt: skip
            self._swa_evicted[rid] = (row, self.req_to_token_pool.req_generation[row], evicted)
        return slots

    # ----------------------------------------------------------------- capacity (radix cache)
    def _check_capacity(self, needed: int, extra_available: int = 0) -> None:
        """With the radix cache: OutOfMemoryError unless each pool's free plus evictable tokens
        reach ``needed`` (the chunk cache: the manager's rule)."""
        tree = self.tree_cache
        if not isinstance(tree, SWARadixLifecycle):
            super()._check_capacity(needed, extra_available)
            return
        alloc = self._swa_allocator
        full = alloc.full_available_size() + extra_available + tree.evictable_size()
        swa = alloc.swa_available_size() + extra_available + tree.swa_evictable_size()
        if min(full, swa) < needed:
            raise OutOfMemoryError(f"need {needed} tokens; full {full}, SWA {swa} with eviction")

    def _evict_for(self, needed: int, new_tokens: int = 0, batch_size: int = 0) -> None:
        """With the radix cache: check both pools, then evict each one's deficit."""
        if not isinstance(self.tree_cache, SWARadixLifecycle):
            super()._evict_for(needed, new_tokens, batch_size)
            return
        self._check_capacity(needed)
        evict_for_swa_alloc(self.tree_cache, self.token_to_kv_pool_allocator, needed)

    def evict(self, num_tokens: int) -> int:
        """Evict ``num_tokens`` full tokens from the tree; returns the full tokens freed."""
        if isinstance(self.tree_cache, SWARadixLifecycle):
            if num_tokens < 0:
                raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
            return self.tree_cache.evict(num_tokens)[0]
        return super().evict(num_tokens)

    # ----------------------------------------------------------------- sessions
    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> list[int]:
        """The manager's extend; a session turn restored here carries on the session's window
        (its ``swa_evicted_seqlen``)."""
        carried: dict[str, int] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and self._restoring_session(req) is not None:
                assert req.session_id is not None
                carried[rid] = self._session_swa.get(req.session_id, 0)
        out = super().extend(rids, chunk_sizes)
        for rid, evicted in carried.items():
            req = self.reqs[rid]
            row = req.req_pool_idx
            assert row is not None and req.session_id is not None
            self._swa_evicted[rid] = (row, self.req_to_token_pool.req_generation[row], evicted)
            self._session_swa.pop(req.session_id, None)
        return out

    def finish(self, rids: Sequence[str], is_insert: bool = True) -> None:
        """The manager's finish; a session turn hands its window to the session with its row."""
        handed: dict[str, int] = {}
        for rid in rids:
            req = self.reqs.get(rid)
            if req is not None and req.session_id is not None and self._session_of(req):
                handed[req.session_id] = self.swa_evicted_seqlen(rid)
        super().finish(rids, is_insert)
        self._session_swa.update(handed)

    def close_session(self, session_id: str) -> None:
        """The manager's close (the allocator's ``free`` releases the SWA slots still mapped)."""
        super().close_session(session_id)
        self._session_swa.pop(session_id, None)

    def snapshot(self) -> PoolSnapshot:
        """The manager's snapshot with ``allocator`` the full pool's, ``swa`` both pools' and
        each request's ``swa_evicted_seqlen``."""
        snap = super().snapshot()
        swa = snap.allocator
        assert isinstance(swa, SWAAllocatorSnapshot)
        reqs = tuple(dataclasses.replace(r, swa_evicted_seqlen=self.swa_evicted_seqlen(r.rid))
                     for r in snap.reqs)  # fmt: skip
        sessions = tuple(dataclasses.replace(
            s, swa_evicted_seqlen=self._session_swa.get(s.session_id, 0) if s.row else 0)
            for s in snap.sessions)  # fmt: skip
        full = swa.full
        return dataclasses.replace(snap, allocator=full, swa=swa, reqs=reqs, sessions=sessions,
                                   max_total_num_tokens=full.size)  # fmt: skip


__all__ = ["SWAMemoryManager", "check_swa_config"]
