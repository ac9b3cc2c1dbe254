"""The host tier in both twins: the host pool's allocator, and ``HiRadixCache``'s write
policies, acknowledgements, evictions, load-back and prefetches on small worked cases (each twin
must give the same slots; the lockstep machine compares them at scale)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import pytest

from kvpool.errors import (
    AlignmentError,
    ConfigError,
    DoubleFreeError,
    InvalidArgumentError,
    LockError,
)
from kvpool.invariants.host import check_host_tier
from kvpool.tags import kv_tags

TWINS = ("reference", "optimized")


def plain(x: Any) -> Any:
    """A list of ints from a list or a tensor (None stays None)."""
    return None if x is None else [int(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


@dataclass
class Rig:
    dev: Any
    alloc: Any
    host: Any
    tree: Any
    key: Any

    def insert(self, tokens: list[int]) -> int:
        slots = self.alloc.alloc(len(tokens))
        assert slots is not None
        self.dev.write_tags(slots, kv_tags(tokens))
        cached = int(self.tree.insert(self.key(tokens), slots))
        if cached:
            self.alloc.free(slots[:cached])
        check_host_tier(self.tree.host_snapshot())
        return cached

    def tags(self, tokens: list[int]) -> list[int]:
        got = self.tree.match_prefix(self.key(tokens)).device_indices
        return list(self.dev.read_tags(got))


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


def rig(twin: str, policy: str = "write_through", page_size: int = 1, **kw: Any) -> Rig:
    """A 16-slot device pool (MHA, 2 layers), its allocator and a host pool of ``ratio`` times
    its size, under a ``HiRadixCache`` of ``twin``."""
    mod = {name: importlib.import_module(f"kvpool.{twin}.{WINGED[name]}") for name in (
        "radix_key", "req_to_token_pool", "allocator", "paged_allocator", "kv_cache",
        "memory_pool_host", "hiradix_cache")}  # fmt: skip
    dev = mod["kv_cache"].MHATokenToKVPool(16, page_size, "float32", 1, 2, 2)
    if page_size == 1:
        alloc = mod["allocator"].TokenToKVPoolAllocator(16)
    else:
        alloc = mod["paged_allocator"].PagedTokenToKVPoolAllocator(16, page_size)
    host = mod["memory_pool_host"].MHATokenToKVPoolHost(dev, kw.pop("ratio", 1.0), 0, page_size)
    kw.setdefault("load_back_threshold", 1)
    pool = mod["req_to_token_pool"].ReqToTokenPool(4, 32)
    tree = mod["hiradix_cache"].HiRadixCache(pool, alloc, page_size, host, write_policy=policy,
                                             **kw)  # fmt: skip
    return Rig(dev, alloc, host, tree, mod["radix_key"].RadixKey)


@pytest.mark.parametrize("twin", TWINS)
def test_host_pool_sizes_allocates_from_the_front_and_merges_released_chunks(twin: str) -> None:
    r = rig(twin, ratio=0.5)
    host = r.host
    assert host.size == 9 and host.available_size() == 9  # (16 * 0.5 // 1 + 1) pages
    assert plain(host.alloc(3)) == [0, 1, 2]
    assert plain(host.alloc(4)) == [3, 4, 5, 6]
    assert host.free([5, 1]) == 2 and host.available_size() == 4
    assert plain(host.alloc(2)) == [7, 8]  # the free list first
    assert plain(host.alloc(2)) == [5, 1]  # then the released chunk, merged
    assert host.alloc(1) is None and host.available_size() == 0


@pytest.mark.parametrize("twin", TWINS)
def test_host_pool_refuses_misuse_and_changes_nothing(twin: str) -> None:
    host = rig(twin, page_size=4, ratio=1.0).host
    assert host.size == 20  # (16 // 4 + 1) pages of 4
    with pytest.raises(AlignmentError):
        host.alloc(3)
    got = plain(host.alloc(4))
    before = host.snapshot()
    with pytest.raises(DoubleFreeError):
        host.free([got[0], got[0]])
    with pytest.raises(DoubleFreeError):
        host.free([10])
    with pytest.raises(InvalidArgumentError):
        host.free([99])
    assert host.snapshot() == before


@pytest.mark.parametrize("twin", TWINS)
def test_write_through_locks_until_the_ack_then_evicts_to_host_and_loads_back(twin: str) -> None:
    r = rig(twin)
    tree = r.tree
    assert r.insert([1, 2, 3, 4]) == 0
    snap = tree.host_snapshot()
    assert [t.kind for t in snap.transfers] == ["write"]
    assert tree.evict(4) == 0 and tree.protected_size() == 4  # locked by the write in flight
    assert tree.writing_check() == 1 and tree.evictable_size() == 4
    assert tree.evict(4) == 4 and tree.total_size() == 0 and r.alloc.available_size() == 16
    m = tree.match_prefix(r.key([1, 2, 3, 9]))
    assert plain(m.device_indices) == [] and m.host_hit_length == 3
    assert m.last_device_node is tree.root_node and m.last_host_node.key.token_ids == [1, 2, 3]
    loaded, node = tree.init_load_back(m.last_host_node)
    assert len(plain(loaded)) == 3 and node is m.last_host_node
    assert tree.ready_to_load_host_cache() == 0 and node.lock_ref == 1
    assert tree.evict(16) == 0  # the loaded path is locked until the load completes
    assert tree.loading_check() == 1 and node.lock_ref == 0
    assert r.tags([1, 2, 3]) == kv_tags([1, 2, 3, 4])[:3]
    check_host_tier(tree.host_snapshot())


@pytest.mark.parametrize("twin", TWINS)
def test_selective_write_through_waits_for_the_second_hit(twin: str) -> None:
    r = rig(twin, "write_through_selective")
    r.insert([1, 2])
    assert not r.tree.host_snapshot().transfers
    assert r.insert([1, 2, 3]) == 2  # the second hit of [1, 2] writes it
    assert [t.host_indices for t in r.tree.host_snapshot().transfers] == [(0, 1)]


@pytest.mark.parametrize("twin", TWINS)
def test_write_back_writes_on_eviction_and_frees_the_device_after_the_ack(twin: str) -> None:
    r = rig(twin, "write_back")
    r.insert([5, 6, 7])
    assert not r.tree.host_snapshot().transfers
    assert r.tree.evict(3) == 3 and r.alloc.available_size() == 16
    snap = r.tree.host_snapshot()
    (n,) = snap.tree.nodes[1:]
    assert n.evicted and n.host_value == (0, 1, 2) and not snap.transfers
    assert [snap.host.tags[h] for h in n.host_value] == kv_tags([5, 6, 7])
    check_host_tier(snap)


@pytest.mark.parametrize("twin", TWINS)
def test_write_back_with_the_host_full_drops_the_subtree_in_stack_walk_order(twin: str) -> None:
    """The host has room for both leaves but not for their parent: the parent's subtree is
    dropped node by node as a stack walk visits them (SGLang 0.5.16's order), so the host slots
    of the leaf inserted last go back first. A breadth-first drop gives (0, 1, 2, 3, 4)."""
    r = rig(twin, "write_back", ratio=0.3)
    assert r.host.size == 5
    r.insert([1, 2, 3, 4, 5, 6])
    assert r.insert([1, 2, 3, 7, 8]) == 3
    assert r.tree.evict(6) == 8 and r.alloc.available_size() == 16
    snap = r.tree.host_snapshot()
    assert snap.tree.nodes[1:] == ()
    assert snap.host.release_slots == (3, 4, 0, 1, 2)
    check_host_tier(snap)


@pytest.mark.parametrize("twin", TWINS)
def test_evict_host_frees_unpinned_host_only_leaves(twin: str) -> None:
    r = rig(twin, ratio=0.25)  # 5 host slots
    r.insert([1, 2])
    r.tree.writing_check()
    r.tree.evict(2)
    host_only = r.tree.match_prefix(r.key([1, 2])).last_host_node
    host_only.protect_host()
    assert r.tree.evict_host(2) == 0
    host_only.release_host()
    with pytest.raises(LockError):
        host_only.release_host()
    assert r.tree.evict_host(2) == 2 and r.host.available_size() == 5
    assert r.tree.match_prefix(r.key([1, 2])).host_hit_length == 0
    with pytest.raises(InvalidArgumentError):
        r.tree.evict_host(-1)


@pytest.mark.parametrize("twin", TWINS)
def test_load_back_below_the_threshold_or_over_the_quota_changes_nothing(twin: str) -> None:
    r = rig(twin, load_back_threshold=3)
    r.insert([1, 2])
    r.tree.writing_check()
    r.tree.evict(2)
    node = r.tree.match_prefix(r.key([1, 2])).last_host_node
    before = r.tree.host_snapshot()
    assert r.tree.load_back(node) is None
    assert r.tree.host_snapshot() == before
    r.tree.load_back_threshold = 0
    assert r.tree.load_back(node, mem_quota=1) is None
    assert r.tree.host_snapshot() == before


@pytest.mark.parametrize("twin", TWINS)
def test_partial_prefetch_inserts_what_was_fetched_and_the_worker_releases_the_rest(
    twin: str,
) -> None:
    r = rig(twin, page_size=2, prefetch_threshold=2, enable_storage=True)
    tree, root = r.tree, r.tree.root_node
    assert not tree.prefetch_from_storage("a", root, [1])  # below the threshold
    assert tree.prefetch_from_storage("a", root, [1, 2, 3, 4, 5, 6, 7])
    assert root.host_ref_counter == 1
    assert tree.storage_hit("a", 6) and tree.prefetch_io("a", 1) == 2
    assert tree.check_prefetch_progress("a") and root.host_ref_counter == 0
    snap = tree.host_snapshot()
    assert [(n.key, n.evicted, n.host_value) for n in snap.tree.nodes[1:]] == [
        ((1, 2), True, (0, 1))
    ]
    assert snap.worker_held == (2, 3, 4, 5)
    check_host_tier(snap)
    assert tree.prefetch_io("a", 5) == 0  # the worker sees the termination
    snap = tree.host_snapshot()
    assert snap.worker_held == () and snap.release_queue == (2, 3, 4, 5)
    assert tree.drain_storage_control_queues() == 4
    check_host_tier(tree.host_snapshot())
    assert tree.match_prefix(r.key([1, 2, 3])).host_hit_length == 2


@pytest.mark.parametrize("twin", TWINS)
def test_an_aborted_prefetch_queues_only_its_fetched_slots(twin: str) -> None:
    r = rig(twin, page_size=2, prefetch_threshold=2, enable_storage=True)
    tree = r.tree
    assert tree.prefetch_from_storage("a", tree.root_node, [1, 2, 3, 4])
    assert tree.storage_hit("a", 4) and tree.prefetch_io("a", 1) == 2
    tree.release_aborted_request("a")
    snap = tree.host_snapshot()
    assert snap.release_queue == (0, 1) and snap.worker_held == (2, 3) and not snap.prefetches
    check_host_tier(snap)
    assert tree.prefetch_io("a", 1) == 0
    assert tree.host_snapshot().release_queue == (0, 1, 2, 3)
    assert tree.drain_storage_control_queues() == 4 and r.host.available_size() == r.host.size


@pytest.mark.parametrize("twin", TWINS)
def test_unknown_write_policy_is_a_config_error(twin: str) -> None:
    with pytest.raises(ConfigError):
        rig(twin, "write_around")
