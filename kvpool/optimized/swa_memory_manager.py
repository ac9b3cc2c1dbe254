"""``SWAMemoryManager`` (optimized twin): the request lifecycle of a hybrid sliding-window model.

Twin of :mod:`kvpool.reference.swa_memory_manager`, written out again (the lockstep harness
compares the two). A :class:`~kvpool.optimized.memory_manager.MemoryManager` whose pools are
the SWA ones
(:mod:`kvpool.injection` puts them in): an
:class:`~kvpool.optimized.swa_allocator.SWATokenToKVPoolAllocator` of ``config.size`` full and
``config.swa_size`` SWA tokens, an :class:`~kvpool.optimized.swa_chunk_cache.SWAChunkCache` and
an :class:`~kvpool.optimized.swa_kv_pool.SWAKVPool` (even layers full attention, odd layers
sliding-window), all sharing the allocator's mapping. Every allocation takes both pools; every
release (finish, abort, retract, the over-allocation of a chunked prefill) frees, through the
allocator's ``free``, exactly the SWA slots still mapped.

After each ``decode`` the window of every decoded request moves:
:func:`~kvpool.optimized.swa_lifecycle.free_swa_out_of_window_slots` releases the SWA slots of
its whole pages that left it (chunk-cache rule: keep ``sliding_window`` tokens), and the manager
remembers, per request row hand-out, its ``swa_evicted_seqlen`` (reported in the snapshot).

Scope (kvpool): the chunk cache only (``disable_radix_cache``; the SWA radix cache is verified
on its own machine), and at least 2 layers. ConfigError otherwise, or without a window.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.optimized.memory_manager import MemoryManager
from kvpool.optimized.options import TwinOptions, twin_options
from kvpool.optimized.swa_allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa_chunk_cache import SWAChunkCache
from kvpool.optimized.swa_kv_pool import SWAKVPool
from kvpool.optimized.swa_lifecycle import free_swa_out_of_window_slots
from kvpool.reference.swa_memory_manager import check_swa_config
from kvpool.snapshot import PoolSnapshot, SWAAllocatorSnapshot


class SWAMemoryManager(MemoryManager):
    """The lifecycle over SWA pools (see the module docstring)."""

    def __init__(
        self,
        config: PoolConfig,
        clock: Callable[[], float] | None = None,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        kernel_backend: str | None = None,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        window = check_swa_config(config)
        opts = twin_options(options, device, checked, kernel_backend)
        ps = config.page_size
        alloc = SWATokenToKVPoolAllocator(config.size, config.swa_size, ps, config.need_sort,
                                          rules=config.rules, options=opts)  # fmt: skip
        layers = range(config.num_layers)
        kv = SWAKVPool(config.size, config.swa_size, ps, "float32", config.head_num,
                       config.head_dim, [i for i in layers if i % 2], [i for i in layers
                       if not i % 2], config.v_head_dim, options=opts)  # fmt: skip
        kv.register_mapping(alloc.full_to_swa_index_mapping)
        super().__init__(
            config,
            clock,
            token_to_kv_pool_allocator=alloc,
            tree_cache=lambda cfg, pool, a: SWAChunkCache(pool, a, ps, window),
            kv_cache=kv,
            options=opts,
        )
        self.sliding_window = window
        self._swa_evicted: dict[str, tuple[int, int, int]] = {}
        """rid -> (row, row generation, swa_evicted_seqlen): valid for that hand-out only."""

    def swa_evicted_seqlen(self, rid: str) -> int:
        """Leading tokens of ``rid`` whose SWA slots its window released (0 without a row)."""
        req = self.reqs.get(rid)
        if req is None or req.req_pool_idx is None:
            return 0
        row = req.req_pool_idx
        gen = self.req_to_token_pool.req_generation[row]
        kept = self._swa_evicted.get(rid)
        return kept[2] if kept is not None and kept[:2] == (row, gen) else 0

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> torch.Tensor:
        """The manager's decode, then every decoded request's window moves on."""
        slots = super().decode(rids, token_ids)
        alloc: Any = self.token_to_kv_pool_allocator
        for rid in rids:
            req = self.reqs[rid]
            row = req.req_pool_idx
            assert row is not None
            pre_len = req.kv_committed_len - 1  # the tokens before the one just decoded
            evicted = free_swa_out_of_window_slots(
                self.req_to_token_pool.read(row, 0, pre_len), self.swa_evicted_seqlen(rid),
                pre_len, req.cache_protected_len, self.sliding_window, self.page_size, alloc,
                is_chunk_cache=True)  # fmt: skip
            self._swa_evicted[rid] = (row, self.req_to_token_pool.req_generation[row], evicted)
        return slots

    def snapshot(self) -> PoolSnapshot:
        """The manager's snapshot with ``allocator`` the full pool's, ``swa`` both pools' and
        each request's ``swa_evicted_seqlen``."""
        snap = super().snapshot()
        swa = snap.allocator
        assert isinstance(swa, SWAAllocatorSnapshot)
        reqs = tuple(dataclasses.replace(r, swa_evicted_seqlen=self.swa_evicted_seqlen(r.rid))
                     for r in snap.reqs)  # fmt: skip
        full = swa.full
        return dataclasses.replace(snap, allocator=full, swa=swa, reqs=reqs,
                                   max_total_num_tokens=full.size)  # fmt: skip


__all__ = ["SWAMemoryManager"]
