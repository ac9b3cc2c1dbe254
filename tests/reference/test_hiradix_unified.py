"""SGLang 0.5.23's host tier inside the unified cache (``Rules.hicache_host_tier ==
"unified"``), one worked case per difference from 0.5.16's ``HiRadixCache``
(specs/unified_cache.md, "The host tier inside the unified cache"), on both twins; each case
also states what the default rules (``"hiradix"``) do, so that it fails if the rule is ignored.
The lockstep machine compares the twins at scale (tests/optimized/test_diff_hiradix_unified.py)
and SGLang against the reference (tests/sglang/test_sglang_unified_hicache.py)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pytest

from kvpool.invariants.host import check_host_tier
from kvpool.rules import Rules
from kvpool.snapshot import NodeSnapshot
from kvpool.tags import kv_tags

TWINS = ("reference", "optimized")
UNIFIED = Rules.for_sglang("0.5.23")
HIRADIX = Rules()


def plain(x: Any) -> list[int]:
    return [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


@dataclass
class Rig:
    alloc: Any
    host: Any
    tree: Any
    key: Any
    dev: Any

    def insert(
        self, tokens: list[int], inserted_len: int | None = None, priority: int = 0
    ) -> tuple[list[int], int]:
        """A finishing request (of ``priority``): fresh slots, their KV written, ``insert``;
        the caller frees its duplicates unless the tree does. Returns the slots and
        ``insert``'s result."""
        slots = self.alloc.alloc(len(tokens))
        assert slots is not None
        self.dev.write_tags(slots, kv_tags(tokens))
        cached = int(self.tree.insert(self.key(tokens), slots, priority=priority,
                                      inserted_len=inserted_len))  # fmt: skip
        if cached and not self.tree.frees_duplicates:
            self.alloc.free(slots[:cached])
        check_host_tier(self.tree.host_snapshot())
        return plain(slots), cached

    def node(self, tokens: list[int]) -> NodeSnapshot:
        """The node whose key is ``tokens``."""
        nodes: tuple[NodeSnapshot, ...] = self.tree.host_snapshot().tree.nodes
        return next(n for n in nodes if list(n.key) == tokens)

    def key_list(self) -> list[list[int]]:
        return sorted(list(n.key) for n in self.tree.host_snapshot().tree.nodes[1:])


WINGED = {
    "radix_key": "radix_key",
    "req_to_token_pool": "pools.req_to_token_pool",
    "allocator": "pools.token_allocator",
    "paged_allocator": "pools.paged_allocator",
    "kv_cache": "kv.mha",
    "memory_pool_host": "hicache.memory_pool_host",
    "hiradix_cache": "hicache.hiradix_cache",
}
"""Each module the rig takes: its path inside the twin."""


def rig(
    twin: str,
    rules: Rules,
    policy: str = "write_through",
    ratio: float = 1.0,
    page_size: int = 1,
    eviction_policy: str = "lru",
) -> Rig:
    """16 device slots, a host pool of ``ratio`` times that, under ``rules``."""
    mod = {name: importlib.import_module(f"kvpool.{twin}.{WINGED[name]}") for name in (
        "radix_key", "req_to_token_pool", "allocator", "paged_allocator", "kv_cache",
        "memory_pool_host", "hiradix_cache")}  # fmt: skip
    dev = mod["kv_cache"].MHATokenToKVPool(16, page_size, "float32", 1, 2, 2)
    if page_size == 1:
        alloc = mod["allocator"].TokenToKVPoolAllocator(16)
    else:
        alloc = mod["paged_allocator"].PagedTokenToKVPoolAllocator(16, page_size)
    host = mod["memory_pool_host"].MHATokenToKVPoolHost(dev, ratio, 0, page_size)
    pool = mod["req_to_token_pool"].ReqToTokenPool(4, 32)
    tree = mod["hiradix_cache"].HiRadixCache(pool, alloc, page_size, host, write_policy=policy,
                                             eviction_policy=eviction_policy,
                                             load_back_threshold=1, rules=rules)  # fmt: skip
    return Rig(alloc, host, tree, mod["radix_key"].RadixKey, dev)


@pytest.mark.parametrize("twin", TWINS)
def test_1_writes_are_queued_and_issued_together_by_the_next_check(twin: str) -> None:
    r = rig(twin, UNIFIED)
    r.insert([1, 2, 3, 4])
    r.insert([5, 6])
    cc = r.tree.cache_controller
    assert r.host.available_size() == 16 - 6 + 1  # host slots reserved at once
    assert len(cc.write_queue) == 2 and not cc.ack_write_queue  # queued, not issued
    transfers = r.tree.host_snapshot().transfers
    assert [t.node_ids for t in transfers] == [(1,), (2,)]
    assert r.tree.writing_check(1) == 1  # one acknowledgement covers both writes
    assert r.tree.host_snapshot().transfers == ()
    assert r.tree.protected_size() == 0
    d = rig(twin, HIRADIX)
    d.insert([1, 2, 3, 4])
    d.insert([5, 6])
    assert d.tree.writing_check(1) == 1 and len(d.tree.host_snapshot().transfers) == 1


@pytest.mark.parametrize("twin", TWINS)
def test_2_a_write_through_backs_up_the_unbacked_ancestors_first(twin: str) -> None:
    for rules, backed in ((UNIFIED, {(1, 2, 3, 4): (0, 1, 2, 3), (5, 6): (4, 5)}), (HIRADIX, {})):
        r = rig(twin, rules)
        r.insert([1, 2, 3, 4], inserted_len=4)  # a chunk already counted: no hit, no write
        r.insert([1, 2, 3, 4, 5, 6], inserted_len=4)  # only the new leaf counts a hit
        got = {n.key: n.host_value for n in r.tree.host_snapshot().tree.nodes[1:]
               if n.host_value is not None}  # fmt: skip
        assert got == backed, rules.hicache_host_tier
    # the ancestors first, each its own acknowledgement id and lock
    assert [t.node_ids for t in rig_chain().tree.host_snapshot().transfers] == [(1,), (2,)]


def rig_chain() -> Rig:
    r = rig("reference", UNIFIED)
    r.insert([1, 2, 3, 4], inserted_len=4)
    r.insert([1, 2, 3, 4, 5, 6], inserted_len=4)
    assert r.node([1, 2, 3, 4]).lock_ref == 2 and r.node([5, 6]).lock_ref == 1
    return r


@pytest.mark.parametrize("twin", TWINS)
def test_3_insert_frees_the_duplicates_and_counts_host_only_tokens(twin: str) -> None:
    r = rig(twin, UNIFIED)
    r.insert([1, 2, 3, 4])
    r.tree.writing_check()
    assert r.tree.evict(4) == 4 and r.node([1, 2, 3, 4]).evicted
    slots, cached = r.insert([1, 2, 3, 4, 5, 6])
    assert cached == 4  # the host-only node's tokens count (0.5.16: 0)
    assert plain(r.node([1, 2, 3, 4]).value) == slots[:4]  # it took the caller's slots
    before = r.alloc.available_size()
    _, cached = r.insert([1, 2, 3, 4, 5, 6])
    assert cached == 6 and r.alloc.available_size() == before  # the tree freed all 6
    d = rig(twin, HIRADIX)
    d.insert([1, 2, 3, 4])
    d.tree.writing_check()
    d.tree.evict(4)
    assert d.insert([1, 2, 3, 4, 5, 6])[1] == 0


@pytest.mark.parametrize("twin", TWINS)
def test_4_device_slots_go_back_through_free_segment(twin: str) -> None:
    for rules, frees in ((UNIFIED, ["free_segment"] * 2), (HIRADIX, ["free"] * 2)):
        r = rig(twin, rules, page_size=2)
        r.insert([1, 2, 3, 4])
        r.insert([5, 6])
        r.tree.writing_check()
        calls: list[str] = []
        for name in ("free", "free_segment"):
            real = getattr(r.alloc, name)

            def spy(
                *args: Any, _real: Any = real, _name: str = name, _calls: list[str] = calls
            ) -> Any:
                _calls.append(_name)
                return _real(*args)

            setattr(r.alloc, name, spy)
        assert r.tree.evict(6) == 6
        # one free per demoted node; free_segment keeps the pages in the order given
        assert calls[: len(frees)] == frees, rules.hicache_host_tier


@pytest.mark.parametrize("twin", TWINS)
def test_5_write_back_eviction_demotes_leaf_by_leaf(twin: str) -> None:
    # a 2-slot host: the second leaf's backup evicts the first (already demoted) from host;
    # 0.5.16 staged the first (pinned), so the second found no room and was dropped
    for rules, left in ((UNIFIED, [[3, 4]]), (HIRADIX, [[1, 2]])):
        r = rig(twin, rules, "write_back", ratio=0.0625)
        assert r.host.size == 2
        r.insert([1, 2])
        r.insert([3, 4])
        assert r.tree.evict(4) == 4
        assert r.key_list() == left, rules.hicache_host_tier
        assert all(n.evicted for n in r.tree.host_snapshot().tree.nodes[1:])
        check_host_tier(r.tree.host_snapshot())


@pytest.mark.parametrize("twin", TWINS)
def test_6_a_load_back_evicts_only_the_shortfall_and_keeps_its_host_lock(twin: str) -> None:
    for rules, demoted in ((UNIFIED, 1), (HIRADIX, 2)):
        r = rig(twin, rules, ratio=2.0)
        r.insert([1, 2, 3, 4])
        r.tree.writing_check()
        r.tree.evict(4)
        for i in range(7):
            r.insert([10 + i, 20 + i])
        r.tree.writing_check()
        assert r.alloc.available_size() == 2
        m = r.tree.match_prefix(r.key([1, 2, 3, 4]))
        loaded, _ = r.tree.init_load_back(m.last_host_node)
        assert len(plain(loaded)) == 4
        small = [n for n in r.tree.host_snapshot().tree.nodes if len(n.key) == 2]
        assert sum(n.evicted for n in small) == demoted, rules.hicache_host_tier
        pinned = r.node([1, 2, 3, 4]).host_ref_counter
        assert pinned == (1 if rules is UNIFIED else 0)  # the anchor's host lock
        r.tree.ready_to_load_host_cache()
        assert r.tree.loading_check() == 1 and r.node([1, 2, 3, 4]).host_ref_counter == 0


@pytest.mark.parametrize("twin", TWINS)
def test_7_last_host_node_is_the_deepest_matched_node(twin: str) -> None:
    for rules, deepest in ((UNIFIED, True), (HIRADIX, False)):
        r = rig(twin, rules, "write_back")
        r.insert([1, 2, 3, 4])  # write-back: no backup
        m = r.tree.match_prefix(r.key([1, 2, 3, 4, 5]))
        assert (m.last_host_node is not r.tree.root_node) is deepest
    assert r.tree.evict_host(4) == 0  # the host tokens freed (none here)


@pytest.mark.parametrize("twin", TWINS)
def test_8_write_back_reclaims_host_duplicates_before_host_leaves(twin: str) -> None:
    for rules, reclaimed in ((UNIFIED, True), (HIRADIX, False)):
        r = rig(twin, rules, "write_back")
        r.insert([1, 2])
        r.insert([3, 4])
        r.tree.evict(4)  # both host-only
        r.insert([1, 2])  # back on device: a duplicate of its host copy
        r.insert([1, 2, 5, 6])  # an unbacked child: [1, 2] is no longer a device leaf
        assert r.tree.evict_host(2) == 2
        # unified: [1, 2]'s host copy goes, [3, 4] stays; 0.5.16: the host leaf [3, 4] goes
        assert (r.node([1, 2]).host_value is None) is reclaimed, rules.hicache_host_tier
        assert ([3, 4] in r.key_list()) is reclaimed
        check_host_tier(r.tree.host_snapshot())


@pytest.mark.parametrize("twin", TWINS)
def test_9_a_split_keeps_the_creation_time(twin: str) -> None:
    for rules, kept in ((UNIFIED, True), (HIRADIX, False)):
        r = rig(twin, rules)
        r.insert([1, 2, 3, 4])
        r.insert([7, 7])
        upper = r.tree.match_prefix(r.key([1, 2])).last_device_node  # splits [1, 2, 3, 4]
        low = next(iter(upper.children.values()))
        assert (upper.creation_time == low.creation_time) is kept, rules.hicache_host_tier


@pytest.mark.parametrize("twin", TWINS)
def test_11_a_split_raises_the_priority_of_the_matched_part_only(twin: str) -> None:
    # the campaign's case (hicache_manager, seed 3): a finished request's prompt is inserted
    # again with priority + 1, which splits its leaf; 0.5.16 raised the node before cutting it,
    # so the output part kept the raise too and outlived an older priority-0 leaf
    for rules, low_priority, first_out in ((UNIFIED, 0, [3, 4]), (HIRADIX, 1, [7, 7])):
        r = rig(twin, rules, eviction_policy="priority")
        r.insert([1, 2, 3, 4])
        r.insert([1, 2], priority=1)  # splits [1, 2, 3, 4]
        r.insert([7, 7])  # a newer priority-0 leaf
        assert r.node([1, 2]).priority == 1
        assert r.node([3, 4]).priority == low_priority, rules.hicache_host_tier
        r.tree.writing_check()  # every write acknowledged: both leaves are demoted, not deleted
        assert r.tree.evict(1) == 2
        evicted = [list(n.key) for n in r.tree.host_snapshot().tree.nodes[1:] if n.evicted]
        assert evicted == [first_out], rules.hicache_host_tier
        check_host_tier(r.tree.host_snapshot())
