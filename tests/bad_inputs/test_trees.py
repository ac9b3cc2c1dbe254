"""Bad inputs to the prefix trees of both twins (radix, chunk, SWA radix, Mamba radix): slots the
tree would own, lengths, locks, eviction amounts, configuration; judged on the tree and its
allocator together."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvpool.errors import (
    ConfigError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    LockError,
    PageSizeError,
    ReservedIndexError,
)
from tests.bad_inputs.harness import Case, Twin, fixture, modes_of, params, run_case


def radix(tw: Twin) -> SimpleNamespace:
    """A page-size-1 tree over 16 slots holding tokens 1..4 at slots 1..4, unlocked."""
    alloc = tw.new("TokenToKVPoolAllocator", 16)
    cache = tw.new("RadixCache", None, alloc, 1)
    slots = alloc.alloc(4)
    cache.insert(tw.ns.RadixKey([1, 2, 3, 4]), slots)
    node = cache.match_prefix(tw.ns.RadixKey([1, 2, 3, 4])).last_device_node
    return fixture((cache, alloc), cache=cache, node=node)


def chunk(tw: Twin) -> SimpleNamespace:
    alloc = tw.new("TokenToKVPoolAllocator", 8)
    cache = tw.new("ChunkCache", None, alloc, 1)
    return fixture(cache, cache=cache)


def swa_chunk(tw: Twin) -> SimpleNamespace:
    """The SWA chunk cache (window 4) over SWA pools of page size 4."""
    alloc = tw.new("SWATokenToKVPoolAllocator", 16, 8, 4)
    cache = tw.ns.SWAChunkCache(None, alloc, 4, 4)  # the twin's takes its options from alloc
    return fixture((cache, alloc), cache=cache)


def swa_chunk_new(page_size: int, window: int) -> Any:
    return lambda tw, fx: tw.ns.SWAChunkCache(
        None, tw.new("SWATokenToKVPoolAllocator", 16, 8, 4), page_size, window
    )


def swa_radix(tw: Twin) -> SimpleNamespace:
    """SWA pools (full 16, SWA 8, page size 4), window 4; 8 tokens cached at full slots 4..11."""
    alloc = tw.new("SWATokenToKVPoolAllocator", 16, 8, 4)
    cache = tw.new("SWARadixCache", alloc, 4, 4)
    slots = alloc.alloc_extend(tw.idx([0]), [0], tw.idx([8]), [8], tw.idx([-1]), 8)
    cache.insert(tw.ns.RadixKey(list(range(1, 9))), slots)
    node = cache.match_prefix(tw.ns.RadixKey(list(range(1, 9)))).last_device_node
    return fixture((cache, alloc), cache=cache, node=node)


def mamba_radix(tw: Twin) -> SimpleNamespace:
    """A hybrid pool (2 rows, 4 Mamba slots) and 16 token slots; tokens 1..3 cached at slots
    1..3 with Mamba state 1."""
    pool = tw.new("HybridReqToTokenPool", 2, 8, 4)
    alloc = tw.new("TokenToKVPoolAllocator", 16)
    cache = tw.new("MambaRadixCache", pool, alloc)
    (mamba,) = pool.mamba_allocator.alloc(1)
    cache.insert(tw.ns.RadixKey([1, 2, 3]), alloc.alloc(3), mamba)
    node = cache.match_prefix(tw.ns.RadixKey([1, 2, 3])).last_device_node
    return fixture((cache, alloc, pool.mamba_allocator), cache=cache, node=node)


def unified_mamba(tw: Twin) -> SimpleNamespace:
    """SGLang 0.5.23's FULL + MAMBA tree over the pools of :func:`mamba_radix`: tokens 1..3 at
    slots 1..3 with state 1, then 1..5 (a leaf [4, 5] with state 2); node: the first one."""
    pool = tw.new("HybridReqToTokenPool", 2, 8, 4)
    alloc = tw.new("TokenToKVPoolAllocator", 16)
    cache = tw.new("UnifiedMambaRadixCache", pool, alloc)
    cache.insert(tw.ns.RadixKey([1, 2, 3]), alloc.alloc(3), pool.mamba_allocator.alloc(1)[0])
    cache.insert(tw.ns.RadixKey([1, 2, 3, 4, 5]), alloc.alloc(5), pool.mamba_allocator.alloc(1)[0])
    node = cache.match_prefix(tw.ns.RadixKey([1, 2, 3])).last_device_node
    return fixture((cache, alloc, pool.mamba_allocator), cache=cache, node=node)


def unified(tw: Twin) -> SimpleNamespace:
    """SGLang 0.5.23's FULL tree over 16 slots at page size 1 holding tokens 1..4 at slots
    1..4, unlocked (:func:`radix`'s state)."""
    alloc = tw.new("TokenToKVPoolAllocator", 16)
    cache = tw.new("UnifiedRadixCache", None, alloc, 1)
    cache.insert(tw.ns.RadixKey([1, 2, 3, 4]), alloc.alloc(4), prev_prefix_len=0)
    node = cache.match_prefix(tw.ns.RadixKey([1, 2, 3, 4])).last_device_node
    return fixture((cache, alloc), cache=cache, node=node)


def unified_swa(tw: Twin) -> SimpleNamespace:
    """SGLang 0.5.23's FULL+SWA tree over :func:`swa_radix`'s pools, window 4: 8 tokens cached
    at full slots 4..11."""
    alloc = tw.new("SWATokenToKVPoolAllocator", 16, 8, 4)
    cache = tw.new("UnifiedSWARadixCache", alloc, 4, 4)
    slots = alloc.alloc_extend(tw.idx([0]), [0], tw.idx([8]), [8], tw.idx([-1]), 8)
    cache.insert(tw.ns.RadixKey(list(range(1, 9))), slots)
    node = cache.match_prefix(tw.ns.RadixKey(list(range(1, 9)))).last_device_node
    head = list(slots) if tw.is_ref else slots.tolist()
    return fixture((cache, alloc), cache=cache, node=node, head=head)


def unified_swa_insert(**kwargs: Any) -> Any:
    """An insert of tokens 1..12 (the first 8 cached, at their own slots; 4 new slots), with
    ``kwargs``."""

    def call(tw: Twin, fx: SimpleNamespace) -> Any:
        head = fx.head
        return fx.cache.insert(
            tw.ns.RadixKey(list(range(1, 13))), tw.idx([*head, 12, 13, 14, 15]), **kwargs
        )

    return call


def unified_insert(tokens: list[int], slots: list[int], prev_prefix_len: Any) -> Any:
    """``cache.insert(RadixKey(tokens), slots, prev_prefix_len=...)`` (0.5.23's tree frees
    the duplicates from ``prev_prefix_len`` on)."""
    return lambda tw, fx: fx.cache.insert(
        tw.ns.RadixKey(tokens), tw.idx(slots), prev_prefix_len=prev_prefix_len
    )


def insert(tokens: list[int], slots: list[int], *extra: Any, floats: bool = False) -> Any:
    """``cache.insert(RadixKey(tokens), slots, *extra)``."""

    def call(tw: Twin, fx: SimpleNamespace) -> Any:
        value = tw.floats(slots) if floats else tw.idx(slots)
        return fx.cache.insert(tw.ns.RadixKey(tokens), value, *extra)

    return call


def unlock(tw: Twin, fx: SimpleNamespace) -> Any:
    return fx.cache.dec_lock_ref(fx.node)


def evict(*amounts: int) -> Any:
    return lambda tw, fx: fx.cache.evict(*amounts)


def new(cls: str, *args: Any) -> Any:
    """Build ``cls`` over a fresh page-size-1 allocator of 8 slots (``args`` after it)."""
    return lambda tw, fx: tw.new(cls, None, tw.new("TokenToKVPoolAllocator", 8), *args)


CASES = [
    Case("swa-chunk-evict-negative", swa_chunk, evict(-1), InvalidArgumentError),
    Case("swa-chunk-ctor-window-0", swa_chunk, swa_chunk_new(4, 0), InvalidArgumentError),
    Case("swa-chunk-ctor-page-size-mismatch", swa_chunk, swa_chunk_new(2, 4), ConfigError),
    Case("radix-insert-slot-0", radix, insert([5, 6], [5, 0]), ReservedIndexError, host=False),
    Case(
        "radix-insert-slot-minus-1",
        radix,
        insert([5, 6], [5, -1]),
        IndexOutOfRangeError,
        host=False,
    ),
    Case("radix-insert-slot-past-pool", radix, insert([5], [17]), IndexOutOfRangeError, host=False),
    Case("radix-insert-float-slots", radix, insert([5], [5], floats=True), InvalidArgumentError),
    Case("radix-insert-too-few-slots", radix, insert([5, 6, 7], [5, 6]), InvalidArgumentError),
    Case("radix-unlock-unlocked-node", radix, unlock, LockError),
    Case("radix-evict-negative", radix, evict(-1), InvalidArgumentError),
    Case("radix-ctor-page-size-3", radix, new("RadixCache", 3), PageSizeError),
    Case("radix-ctor-page-size-mismatch", radix, new("RadixCache", 2), ConfigError),
    Case("radix-ctor-unknown-policy", radix, new("RadixCache", 1, False, "mru-ish"), ConfigError),
    Case("chunk-evict-negative", chunk, evict(-1), InvalidArgumentError),
    Case("chunk-ctor-page-size-mismatch", chunk, new("ChunkCache", 4), ConfigError),
    Case("chunk-ctor-unknown-policy", chunk, new("ChunkCache", 1, "mru-ish"), ConfigError),
    Case(
        "swa-radix-insert-slot-0",
        swa_radix,
        insert([9] * 4, [0, 1, 2, 3]),
        ReservedIndexError,
        host=False,
    ),
    Case(
        "swa-radix-insert-negative",
        swa_radix,
        insert([9] * 4, [-4, -3, -2, -1]),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "swa-radix-insert-float-slots",
        swa_radix,
        insert([9] * 4, [12] * 4, floats=True),
        InvalidArgumentError,
    ),
    Case("swa-radix-insert-too-few-slots", swa_radix, insert([9] * 4, [12]), InvalidArgumentError),
    Case(
        "swa-radix-insert-bad-evicted-len",
        swa_radix,
        insert([9] * 4, [12] * 4, 0, 3),
        InvalidArgumentError,
    ),
    Case("swa-radix-unlock-unlocked-node", swa_radix, unlock, LockError),
    Case(
        "swa-radix-ctor-window-0",
        swa_radix,
        lambda tw, fx: tw.new("SWARadixCache", tw.new("SWATokenToKVPoolAllocator", 16, 8, 4), 4, 0),
        InvalidArgumentError,
    ),
    Case(
        "mamba-radix-insert-slot-0",
        mamba_radix,
        insert([7], [0], 2),
        ReservedIndexError,
        host=False,
    ),
    Case(
        "mamba-radix-insert-past-pool",
        mamba_radix,
        insert([7], [99], 2),
        IndexOutOfRangeError,
        host=False,
    ),
    Case(
        "mamba-radix-insert-float-slots",
        mamba_radix,
        insert([7], [5], 2, floats=True),
        InvalidArgumentError,
    ),
    Case(
        "mamba-radix-insert-mismatched", mamba_radix, insert([7, 8], [5], 2), InvalidArgumentError
    ),
    Case("mamba-radix-unlock-unlocked-node", mamba_radix, unlock, LockError),
    Case(
        "mamba-radix-ctor-paged",
        mamba_radix,
        lambda tw, fx: tw.new(
            "MambaRadixCache",
            tw.new("HybridReqToTokenPool", 2, 8, 4),
            tw.new("PagedTokenToKVPoolAllocator", 16, 2),
            2,
        ),
        ConfigError,
    ),
    Case(
        "unified-mamba-insert-slot-0",
        unified_mamba,
        insert([7], [0], 3),
        ReservedIndexError,
        host=False,
    ),
    Case(
        "unified-mamba-insert-mismatched",
        unified_mamba,
        insert([7, 8], [9], 3),
        InvalidArgumentError,
    ),
    Case("unified-mamba-unlock-unlocked-node", unified_mamba, unlock, LockError),
    Case(
        "unified-insert-slot-0",
        unified,
        unified_insert([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 0], 4),
        ReservedIndexError,
        host=False,
    ),
    Case(
        "unified-insert-mismatched",
        unified,
        unified_insert([5, 6], [9], 0),
        InvalidArgumentError,
    ),
    Case(
        "unified-insert-prev-prefix-negative",
        unified,
        unified_insert([1, 2, 3, 4, 5], [9, 10, 11, 12, 13], -1),
        InvalidArgumentError,
    ),
    Case(
        "unified-insert-prev-prefix-past-key",
        unified,
        unified_insert([1, 2, 3, 4, 5], [9, 10, 11, 12, 13], 6),
        InvalidArgumentError,
    ),
    Case(
        "unified-insert-prev-prefix-bool",
        unified,
        unified_insert([1, 2, 3, 4, 5], [9, 10, 11, 12, 13], True),
        InvalidArgumentError,
    ),
    Case(
        "unified-insert-prev-prefix-float",
        unified,
        unified_insert([1, 2, 3, 4, 5], [9, 10, 11, 12, 13], 2.0),
        InvalidArgumentError,
    ),
    Case("unified-unlock-unlocked-node", unified, unlock, LockError),
    Case(
        "unified-swa-insert-evicted-float",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8, swa_evicted_seqlen=4.0),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-evicted-bool",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8, swa_evicted_seqlen=True),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-evicted-unaligned",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8, swa_evicted_seqlen=3),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-evicted-past-key",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8, swa_evicted_seqlen=16),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-prev-prefix-negative",
        unified_swa,
        unified_swa_insert(prev_prefix_len=-4),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-prev-prefix-float",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8.0),
        InvalidArgumentError,
    ),
    Case(
        "unified-swa-insert-inserted-len-float",
        unified_swa,
        unified_swa_insert(prev_prefix_len=8, inserted_len=0.5),
        InvalidArgumentError,
    ),
    Case("unified-swa-unlock-unlocked-node", unified_swa, unlock, LockError),
    Case("unified-evict-negative", unified, evict(-1), InvalidArgumentError),
    Case("unified-mamba-evict-negative", unified_mamba, evict(-1, 0), InvalidArgumentError),
    Case("unified-mamba-evict-negative-states", unified_mamba, evict(0, -1), InvalidArgumentError),
    Case(
        "unified-mamba-ctor-paged",
        unified_mamba,
        lambda tw, fx: tw.new(
            "UnifiedMambaRadixCache",
            tw.new("HybridReqToTokenPool", 2, 8, 4),
            tw.new("PagedTokenToKVPoolAllocator", 16, 2),
            2,
        ),
        ConfigError,
    ),
]


@pytest.mark.parametrize("case", params(CASES))
def test_bad_input_is_refused_identically(case: Case) -> None:
    run_case(case, modes_of(case))
