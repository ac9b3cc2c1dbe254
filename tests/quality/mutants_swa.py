"""Seeded SWA bugs (the field bugs of sliding-window KV caches): :data:`SWA_MUTANTS`.

Each patch takes one built :class:`kvpool.optimized.swa.allocator.SWATokenToKVPoolAllocator`
(or :class:`kvpool.optimized.swa.radix_cache.SWARadixCache`, or
:class:`kvpool.optimized.lifecycle.swa_memory_manager.SWAMemoryManager`) and re-creates, on that
instance only, a bug seen in the field; the component's machine hunts it
(:func:`kvpool.testing.quality.hunt_component`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.rules import Rules
from kvpool.testing.quality import ComponentMutant, need, wrap


def stale_mapping_on_free(alloc: Any) -> None:
    """``free`` releases the SWA slots but leaves the entries: the full slot, once recycled,
    still names the old SWA slot, which by then may be another request's."""
    need(alloc, "_release_swa", "swa_attn_allocator")

    def release(indices: torch.Tensor, swa: torch.Tensor) -> None:
        alloc.swa_attn_allocator.free(swa)  # the index_fill_ of the entries is missing

    def make(orig: Any) -> Callable[[Any], None]:
        def free(free_index: Any) -> None:
            saved = alloc._release_swa
            alloc._release_swa = release
            try:
                orig(free_index)
            finally:
                alloc._release_swa = saved

        return free

    wrap(alloc, "free", make)


def sentinel_freed(alloc: Any) -> None:
    """The SWA slots a free resolves keep the 0 entries: the sentinel is freed as a slot."""
    need(alloc, "_mapping_indices", "full_to_swa_index_mapping")

    def resolve(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices = alloc._mapping_indices(slots)
        return indices, alloc.full_to_swa_index_mapping[indices]  # no `!= 0` filter

    alloc._resolve_swa = resolve


def lazy_group_resolution(alloc: Any) -> None:
    """Inside a free group the mapping is read at ``free_group_end`` instead of at ``free``:
    until then a freed full slot keeps its SWA slot (and a later re-pointing would win)."""
    need(alloc, "_in_free_group", "full_attn_allocator", "free_group_end")
    deferred: list[torch.Tensor] = []

    def make_free(orig: Any) -> Callable[[Any], None]:
        def free(free_index: Any) -> None:
            if not alloc._in_free_group:
                return orig(free_index)  # type: ignore[no-any-return]
            slots = torch.as_tensor(free_index).reshape(-1).to(torch.int64)
            alloc.full_attn_allocator.free(slots)
            deferred.append(slots)
            return None

        return free

    def make_end(orig: Any) -> Callable[[], None]:
        def free_group_end() -> None:
            slots = torch.cat(deferred) if deferred else None
            deferred.clear()
            if slots is not None and slots.numel():
                indices, swa = alloc._resolve_swa(slots)
                alloc._release_swa(indices, swa)
            orig()

        return free_group_end

    wrap(alloc, "free", make_free)
    wrap(alloc, "free_group_end", make_end)


def window_slot_leaked(alloc: Any) -> None:
    """``free_swa`` (tokens leaving the window) zeroes the entries but never frees the slots."""
    need(alloc, "full_to_swa_index_mapping", "_mapping_indices")

    def free_swa(free_index: Any) -> None:
        slots = torch.as_tensor(free_index).reshape(-1).to(torch.int64)
        indices = alloc._mapping_indices(slots)
        alloc.full_to_swa_index_mapping.index_fill_(0, indices, RESERVED_INDEX)

    alloc.free_swa = free_swa


def window_slot_freed_twice(alloc: Any) -> None:
    """``free_swa`` frees the slots but keeps the entries: the request's final ``free`` frees
    them again."""
    need(alloc, "_resolve_swa", "swa_attn_allocator")

    def free_swa(free_index: Any) -> None:
        slots = torch.as_tensor(free_index).reshape(-1).to(torch.int64)
        _, swa = alloc._resolve_swa(slots)
        alloc.swa_attn_allocator.free(swa)

    alloc.free_swa = free_swa


def decode_takes_full_before_swa(alloc: Any) -> None:
    """SGLang 0.5.16's ``alloc_decode`` order: the full pool allocates first, and when the SWA
    pool then refuses, the full pages already taken are dropped (leaked)."""
    need(alloc, "full_attn_allocator", "swa_attn_allocator", "full_to_swa_index_mapping")

    def alloc_decode(seq_lens: Any, seq_lens_cpu: Any, last_loc: Any) -> Any:
        swa_loc = alloc.full_to_swa_index_mapping[torch.as_tensor(last_loc)]
        full = alloc.full_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, last_loc)
        swa = alloc.swa_attn_allocator.alloc_decode(seq_lens, seq_lens_cpu, swa_loc)
        if full is None or swa is None:
            return None
        alloc.full_to_swa_index_mapping[full] = swa
        return full

    alloc.alloc_decode = alloc_decode


def window_evicted_under_lock(tree: Any) -> None:
    """SWA eviction ignores the SWA lock: a running request's window is tombstoned under it."""
    need(tree, "_swa_evictable")
    tree._swa_evictable = lambda node: not node.swa_tombstone


def locked_leaf_deleted(tree: Any) -> None:
    """SWA eviction treats a leaf whose full part is still locked (a tombstone recovered from
    another request while its own request runs) as unlocked: it deletes it, freeing full slots
    the running request reads."""
    need(tree, "_keeps_full")
    tree._keeps_full = lambda node: bool(node.children)


def window_never_released(mm: Any) -> None:
    """The manager never moves a request's window: the SWA slots of tokens that slid out of it
    stay held (leaked) until the request ends."""
    need(mm, "sliding_window")
    mm.sliding_window = 1 << 30


def window_overshoot(mm: Any) -> None:
    """The window release is off by one token: a page whose last token the next decode still
    reads loses its SWA slots."""
    need(mm, "sliding_window")
    mm.sliding_window = max(mm.sliding_window - 1, 0)


def restore_keeps_mapping(alloc: Any) -> None:
    """``restore_state`` puts back the free lists only (SGLang 0.5.16): the entries written since
    the backup stay on full slots that are free again."""
    need(alloc, "restore_state", "full_to_swa_index_mapping")

    def make(orig: Any) -> Callable[[Any], None]:
        def restore_state(state: Any) -> None:
            current = alloc.full_to_swa_index_mapping.clone()
            orig(state)
            alloc.full_to_swa_index_mapping.copy_(current)

        return restore_state

    wrap(alloc, "restore_state", make)


def split_keeps_time(tree: Any) -> None:
    """A split leaves both halves at the old node's time instead of making them the most
    recently used: after a match that splits a node, eviction takes another node first."""
    need(tree, "_split_node")

    def make(orig: Any) -> Callable[[Any, int], Any]:
        def split(child: Any, split_len: int) -> Any:
            then = child.last_access_time
            upper = orig(child, split_len)
            upper.last_access_time = child.last_access_time = then
            return upper

        return split

    wrap(tree, "_split_node", make)


def tombstone_keeps_swa(mm: Any) -> None:
    """The lifecycle's SWA eviction tombstones a node without freeing its SWA slots: they leak,
    still named by the tombstone's full slots."""
    tree = getattr(mm.tree_cache, "tree", None)
    if tree is None:
        return  # the chunk cache: nothing to seed (the run stays clean)
    alloc = tree.token_to_kv_pool_allocator

    def make(orig: Any) -> Callable[[int, int], Any]:
        def evict(num_tokens: int, swa_num_tokens: int = 0) -> Any:
            saved = alloc.free_swa
            alloc.free_swa = lambda free_index: None
            try:
                return orig(num_tokens, swa_num_tokens)
            finally:
                alloc.free_swa = saved

        return evict

    wrap(tree, "evict", make)


def finish_forgets_window(mm: Any) -> None:
    """A finish inserts the request's tokens as if its window had released nothing: the tokens
    whose SWA slots are gone enter the tree as SWA-holding nodes."""
    if getattr(mm.tree_cache, "tree", None) is None:
        return
    mm.tree_cache.evicted_of = lambda req: 0


def eagle_frontier_by_tokens(mm: Any) -> None:
    """Under EAGLE's bigram keys a checkpoint slides the window at its key's token count, not at
    its last slot (SGLang's call site before its #34870): the window slides one slot further than
    SGLang 0.5.23 slides it, so the tree's tombstone boundary and the request's cursor differ."""
    tree = mm.tree_cache
    if not getattr(tree, "is_eagle", False):
        return  # token keys: the two counts agree (the run stays clean)

    def make(orig: Any) -> Callable[[Any, int, bool], None]:
        def checkpoint(req: Any, up_to: int, finished: bool) -> None:
            saved, first = mm._slide, [True]

            def slide(req: Any, pre_len: int, window: int, sharing: bool) -> None:
                if first[0]:  # the slide before the insert (a running request's only)
                    first[0], pre_len = False, pre_len + 1
                saved(req, pre_len, window, sharing)

            mm._slide = slide
            try:
                orig(req, up_to, finished)
            finally:
                mm._slide = saved

        return checkpoint

    wrap(mm, "_checkpoint", make)


SWA_MUTANTS: tuple[ComponentMutant, ...] = (
    ComponentMutant("swa-stale-mapping", "a recycled full slot keeps a stale SWA mapping",
                    ("INV-SWA-FREE-UNMAPPED",), stale_mapping_on_free),
    ComponentMutant("swa-sentinel-freed", "the mapping's 0 sentinel freed as an SWA slot",
                    ("INV-SWA-SENTINEL",), sentinel_freed),
    ComponentMutant("swa-lazy-group", "mappings resolved at free_group_end, not at free",
                    ("INV-SWA-FREE-UNMAPPED", "lockstep-diff"), lazy_group_resolution),
    ComponentMutant("swa-window-leak", "SWA slots of tokens that left the window leaked",
                    ("INV-SWA-ONE-MAPPING", "INV-SWA-ACCOUNTING"), window_slot_leaked),
    ComponentMutant("swa-window-double-free", "SWA slots of tokens that left the window freed "
                    "twice", ("INV-SWA-ONE-MAPPING", "INV-SWA-NO-DOUBLE-FREE"),
                    window_slot_freed_twice),
    ComponentMutant("swa-decode-leaks-full", "a decode refused by the SWA pool keeps full pages",
                    ("unchanged-on-error", "INV-TOKEN-ACCOUNTING"), decode_takes_full_before_swa,
                    page_sizes=(2, 4)),
    ComponentMutant("swa-window-evicted-locked", "a node's SWA part evicted inside a running "
                    "request's window", ("INV-SWA-TREE-LOCKS",), window_evicted_under_lock,
                    "swa_radix_cache"),
    ComponentMutant("swa-locked-leaf-deleted", "SWA eviction deletes a leaf whose full part is "
                    "still locked", ("INV-SWA-TREE-LOCKS", "lockstep-diff"), locked_leaf_deleted,
                    "swa_radix_cache"),
    ComponentMutant("swa-window-never-released", "SWA slots of tokens that left the window kept "
                    "(leaked) by the lifecycle", ("lockstep-diff",), window_never_released,
                    "swa_manager"),
    ComponentMutant("swa-window-overshoot", "the lifecycle releases a page still inside the "
                    "window", ("lockstep-diff",), window_overshoot, "swa_manager"),
    ComponentMutant("swa-restore-stale-mapping", "restore_state leaves the entries written since "
                    "the backup", ("INV-SWA-FREE-UNMAPPED",), restore_keeps_mapping),
    ComponentMutant("swa-split-keeps-time", "a split does not make its halves the most recently "
                    "used", ("lockstep-diff",), split_keeps_time, "swa_radix_cache"),
    ComponentMutant("swa-tombstone-keeps-swa", "the lifecycle's SWA eviction tombstones a node "
                    "without freeing its SWA slots", ("INV-SWA-TOMBSTONE", "INV-SWA-ACCOUNTING",
                    "INV-CAPACITY-HONOURED"),
                    tombstone_keeps_swa, "swa_manager"),
    ComponentMutant("swa-finish-forgets-window", "a finish inserts released window tokens as "
                    "SWA-holding nodes", ("INV-SWA-ACCOUNTING", "INV-SWA-ONE-MAPPING",
                    "lockstep-diff"), finish_forgets_window, "swa_manager"),
    ComponentMutant("swa-eagle-frontier-by-tokens", "under EAGLE a checkpoint slides the window "
                    "at its key's token count, not its last slot", ("lockstep-diff",),
                    eagle_frontier_by_tokens, "swa_manager", rules=Rules.for_sglang("0.5.23")),
)  # fmt: skip
"""The seeded SWA bugs of the quality suite (allocator, radix cache, lifecycle)."""

__all__ = [
    "SWA_MUTANTS",
    "decode_takes_full_before_swa",
    "finish_forgets_window",
    "lazy_group_resolution",
    "locked_leaf_deleted",
    "restore_keeps_mapping",
    "sentinel_freed",
    "split_keeps_time",
    "stale_mapping_on_free",
    "tombstone_keeps_swa",
    "window_evicted_under_lock",
    "window_never_released",
    "window_overshoot",
    "window_slot_freed_twice",
    "window_slot_leaked",
]
