"""Each host-tier invariant (``INV-HOST-*``, scope ``"host"``) fires on a hand-made bad snapshot,
naming the offending indices, and stays quiet on a good one taken from the reference
``HiRadixCache`` with a write, a load and a prefetch in flight."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS, checks_for
from kvpool.invariants.host import check_host_tier
from kvpool.reference import RadixKey, ReqToTokenPool, TokenToKVPoolAllocator
from kvpool.reference.hicache.hiradix_cache import HiRadixCache
from kvpool.reference.hicache.memory_pool_host import MHATokenToKVPoolHost
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.snapshot import HostTierSnapshot, NodeSnapshot
from kvpool.tags import kv_tags

HOST_IDS = (
    "INV-HOST-DOUBLE-FREE",
    "INV-HOST-ACCOUNTING",
    "INV-HOST-PINNED",
    "INV-HOST-BACKUP-DONE",
    "INV-HOST-DEVICE-ACCOUNTING",
    "INV-HOST-KV-INTEGRITY",
)


def good() -> HostTierSnapshot:
    """Page size 1, 16 device slots, a host pool of 33 slots: ``[1, 2, 3, 4]`` written, acked,
    evicted to host and being loaded back; ``[5, 6]`` being written; a prefetch of ``[7, 8, 9]``
    with one page fetched (two slots still its worker's)."""
    dev = MHATokenToKVPool(16, 1, "float32", 1, 2, 2)
    alloc = TokenToKVPoolAllocator(16)
    host = MHATokenToKVPoolHost(dev, 2.0, 0, 1)
    tree = HiRadixCache(ReqToTokenPool(4, 32), alloc, 1, host, load_back_threshold=1,
                        prefetch_threshold=1, enable_storage=True)  # fmt: skip

    def insert(tokens: list[int]) -> None:
        slots = alloc.alloc(len(tokens))
        assert slots is not None
        dev.write_tags(slots, kv_tags(tokens))
        assert tree.insert(RadixKey(tokens), slots) == 0

    insert([1, 2, 3, 4])
    assert tree.writing_check() == 1
    assert tree.evict(4) == 4
    insert([5, 6])
    match = tree.match_prefix(RadixKey([1, 2, 3, 4]))
    assert match.host_hit_length == 4
    assert match.last_host_node is not None
    loaded, _ = tree.init_load_back(match.last_host_node)
    assert len(loaded) == 4 and tree.ready_to_load_host_cache() == 0
    assert tree.prefetch_from_storage("r0", tree.root_node, [7, 8, 9])
    assert tree.storage_hit("r0", 3) and tree.prefetch_io("r0", 1) == 1
    snap = tree.host_snapshot()
    assert len(snap.transfers) == 2 and len(snap.worker_held) == 2
    return snap


def node(snap: HostTierSnapshot, key: tuple[int, ...]) -> NodeSnapshot:
    return next(n for n in snap.tree.nodes if n.key == key)


def with_node(snap: HostTierSnapshot, key: tuple[int, ...], **fields: Any) -> HostTierSnapshot:
    nodes = tuple(dataclasses.replace(n, **fields) if n.key == key else n for n in snap.tree.nodes)
    return dataclasses.replace(snap, tree=dataclasses.replace(snap.tree, nodes=nodes))


def fires(snap: HostTierSnapshot, invariant_id: str) -> list[int]:
    with pytest.raises(InvariantViolation) as info:
        check_host_tier(snap)
    assert info.value.invariant_id == invariant_id, info.value
    return list(info.value.indices)


def test_registered_in_the_host_scope() -> None:
    assert [i for i, _ in checks_for("host")] == list(HOST_IDS)
    assert all(INVARIANTS[i].scopes == ("host",) for i in HOST_IDS)


def test_good_snapshot_passes_every_check() -> None:
    assert check_host_tier(good()) == len(HOST_IDS)


def test_double_free_fires_on_a_slot_free_twice_and_on_a_release_a_worker_repeats() -> None:
    snap = good()
    slot = snap.host.free_slots[0]
    twice = dataclasses.replace(snap.host, release_slots=(slot,))
    assert fires(dataclasses.replace(snap, host=twice), "INV-HOST-DOUBLE-FREE") == [slot]
    worker = snap.worker_held[0]
    queued = dataclasses.replace(snap, release_queue=(worker,))
    assert fires(queued, "INV-HOST-DOUBLE-FREE") == [worker]


def test_accounting_fires_on_a_leaked_host_slot() -> None:
    snap = good()
    leaked = snap.host.free_slots[-1]
    host = dataclasses.replace(snap.host, free_slots=snap.host.free_slots[:-1])
    assert fires(dataclasses.replace(snap, host=host), "INV-HOST-ACCOUNTING") == [leaked]


def test_accounting_fires_on_a_slot_held_by_a_node_and_free() -> None:
    snap = good()
    hosts = node(snap, (1, 2, 3, 4)).host_value
    assert hosts is not None
    host = dataclasses.replace(snap.host, free_slots=(*snap.host.free_slots, hosts[0]))
    assert fires(dataclasses.replace(snap, host=host), "INV-HOST-ACCOUNTING") == [hosts[0]]


def test_pinned_fires_on_a_node_loaded_without_lock_or_pin() -> None:
    snap = good()
    loading = node(snap, (1, 2, 3, 4))
    assert loading.lock_ref == 1 and not loading.evicted
    bad = with_node(snap, (1, 2, 3, 4), lock_ref=0)
    assert fires(bad, "INV-HOST-PINNED") == [loading.node_id]


def test_pinned_fires_on_a_node_written_without_lock() -> None:
    snap = good()
    writing = node(snap, (5, 6))
    assert writing.write_pending and writing.lock_ref == 1
    assert fires(with_node(snap, (5, 6), lock_ref=0), "INV-HOST-PINNED") == [writing.node_id]


def test_pinned_fires_on_a_prefetch_whose_node_is_not_pinned() -> None:
    snap = good()
    (prefetch,) = snap.prefetches
    moved = dataclasses.replace(prefetch, last_host_node_id=node(snap, (5, 6)).node_id)
    assert fires(dataclasses.replace(snap, prefetches=(moved,)), "INV-HOST-PINNED") == [
        moved.last_host_node_id
    ]


def test_backup_done_fires_on_a_host_only_node_whose_write_is_in_flight() -> None:
    snap = good()
    writing = node(snap, (5, 6))
    bad = with_node(snap, (5, 6), evicted=True, value=(), lock_ref=0, host_ref_counter=1)
    assert fires(bad, "INV-HOST-BACKUP-DONE") == [writing.node_id]


def test_device_accounting_fires_on_a_device_page_held_by_nobody() -> None:
    snap = good()
    page = snap.device.free_pages[0]
    device = dataclasses.replace(snap.device, free_pages=snap.device.free_pages[1:])
    assert fires(dataclasses.replace(snap, device=device), "INV-HOST-DEVICE-ACCOUNTING") == [page]


def test_device_accounting_fires_on_sizes_counting_host_only_tokens() -> None:
    snap = good()
    tree = dataclasses.replace(snap.tree, evictable_size=snap.tree.evictable_size + 3)
    fires(dataclasses.replace(snap, tree=tree), "INV-HOST-DEVICE-ACCOUNTING")


def test_kv_integrity_fires_on_a_host_copy_of_other_tokens() -> None:
    snap = good()
    backed = node(snap, (1, 2, 3, 4))
    assert backed.host_value is not None
    tags = list(snap.host.tags)
    tags[backed.host_value[2]] += 1
    host = dataclasses.replace(snap.host, tags=tuple(tags))
    bad = dataclasses.replace(snap, host=host)
    assert fires(bad, "INV-HOST-KV-INTEGRITY") == [backed.node_id]
