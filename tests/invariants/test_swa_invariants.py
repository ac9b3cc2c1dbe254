"""Each ``INV-SWA-*`` invariant fires on a hand-made bad snapshot, naming the offending indices,
and stays quiet on a good one (taken from the reference allocator)."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS, check_swa_allocator, checks_for
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.snapshot import NodeSnapshot, SWAAllocatorSnapshot, TreeSnapshot

SWA_IDS = (
    "INV-SWA-MAPPING-SHAPE",
    "INV-SWA-FREE-UNMAPPED",
    "INV-SWA-ONE-MAPPING",
    "INV-SWA-NO-DOUBLE-FREE",
    "INV-SWA-SENTINEL",
    "INV-SWA-ACCOUNTING",
    "INV-SWA-TOMBSTONE",
    "INV-SWA-TREE-LOCKS",
)


def good() -> SWAAllocatorSnapshot:
    """Page size 1: full pool 8, SWA pool 4; slots 1, 2, 3 allocated, 1 slid out of the window
    (full 1 -> none, full 2 -> SWA 2, full 3 -> SWA 3)."""
    a = SWATokenToKVPoolAllocator(8, 4, 1)
    assert a.alloc(3) == [1, 2, 3]
    a.free_swa([1])
    return a.snapshot()


def with_mapping(snap: SWAAllocatorSnapshot, **entries: int) -> SWAAllocatorSnapshot:
    mapping = list(snap.full_to_swa)
    for key, value in entries.items():
        mapping[int(key.lstrip("f"))] = value
    return dataclasses.replace(snap, full_to_swa=tuple(mapping))


def swa_free(snap: SWAAllocatorSnapshot, *pages: int) -> SWAAllocatorSnapshot:
    return dataclasses.replace(snap, swa=dataclasses.replace(snap.swa, free_pages=pages))


def fires(invariant_id: str, indices: tuple[int, ...], snap: SWAAllocatorSnapshot, **kw: object
          ) -> None:  # fmt: skip
    with pytest.raises(InvariantViolation) as info:
        check_swa_allocator(snap, **kw)  # type: ignore[arg-type]
    assert info.value.invariant_id == invariant_id, str(info.value)
    assert info.value.indices == indices


def test_registered_in_the_swa_scope() -> None:
    assert [i for i, _ in checks_for("swa")] == list(SWA_IDS)
    assert all(INVARIANTS[i].description for i in SWA_IDS)


def test_quiet_on_a_good_snapshot() -> None:
    snap = good()
    assert check_swa_allocator(snap, {1, 2, 3}) > len(SWA_IDS)
    check_swa_allocator(snap, {1, 2, 3}, swa_held_tokens=2)


def test_mapping_shape() -> None:
    snap = good()
    fires("INV-SWA-MAPPING-SHAPE", (), dataclasses.replace(snap, full_to_swa=snap.full_to_swa[:-1]))
    fires("INV-SWA-MAPPING-SHAPE", (4,), with_mapping(snap, f4=9))  # no such SWA slot
    fires("INV-SWA-MAPPING-SHAPE", (0,), with_mapping(snap, f0=1))


def test_free_full_slot_still_mapped() -> None:
    # full slot 5 is free but keeps SWA slot 1: once recycled it would free someone's slot 1
    snap = swa_free(with_mapping(good(), f5=1), 4)
    fires("INV-SWA-FREE-UNMAPPED", (5,), snap)


def test_pending_slot_mapped_only_under_group_end_resolution() -> None:
    # full slot 2 freed inside a group, its entry (SWA 2) not yet read
    snap = good()
    grouped = dataclasses.replace(snap.full, in_free_group=True, pending_free=(2,))
    pending = dataclasses.replace(snap, full=grouped)
    fires("INV-SWA-FREE-UNMAPPED", (2,), pending)  # kvpool: read at the free
    late = dataclasses.replace(pending, resolves_at_group_end=True)
    check_swa_allocator(late, {1, 2, 3})  # SGLang 0.5.16: read at free_group_end
    fires("INV-SWA-FREE-UNMAPPED", (5,), swa_free(with_mapping(late, f5=1), 4))  # free: still


def test_swa_slot_named_twice_leaked_or_used_after_free() -> None:
    snap = good()
    fires("INV-SWA-ONE-MAPPING", (3,), with_mapping(snap, f1=3))  # two entries name SWA 3
    fires("INV-SWA-ONE-MAPPING", (3,), with_mapping(snap, f3=0))  # SWA 3 held, nobody maps it
    fires("INV-SWA-ONE-MAPPING", (1,), with_mapping(swa_free(snap, 1, 4), f1=1))  # freed, named


def test_swa_double_free() -> None:
    snap = good()
    fires("INV-SWA-NO-DOUBLE-FREE", (1,), swa_free(snap, 1, 4, 1))
    pending = dataclasses.replace(snap.swa, in_free_group=True, pending_free=(2, 2))
    unmapped = with_mapping(snap, f2=0)  # SWA 2 unmapped by a free in the group, pending twice
    fires("INV-SWA-NO-DOUBLE-FREE", (2,), dataclasses.replace(unmapped, swa=pending))


def test_sentinel_never_freed() -> None:
    fires("INV-SWA-SENTINEL", (0,), swa_free(good(), 1, 4, 0))


def test_accounting_against_what_requests_and_the_tree_hold() -> None:
    snap = good()
    fires("INV-SWA-ACCOUNTING", (), snap, swa_held_tokens=3)  # one SWA slot counted twice
    fires("INV-SWA-ACCOUNTING", (), snap, swa_held_tokens=1)  # one SWA slot leaked


def test_tombstoned_node_holds_no_swa_slot() -> None:
    snap = good()
    # a tombstone leaf whose full part a running request still locks
    node = NodeSnapshot(1, 0, (7, 8), None, (1, 2), 1, (), (), 0.0, swa_tombstone=True)
    root = NodeSnapshot(0, None, (), None, (), 1, (1,), ((7,),), 0.0, swa_lock_ref=1)
    tree = TreeSnapshot(1, False, "lru", 0, 2, (root, node))
    fires("INV-SWA-TOMBSTONE", (1,), snap, tree=tree)
    clean = dataclasses.replace(node, value=(1,), key=(7,))
    check_swa_allocator(snap, tree=dataclasses.replace(tree, nodes=(root, clean), protected_size=1))


def test_tree_locks_and_sizes() -> None:
    snap = good()
    root = NodeSnapshot(0, None, (), None, (), 1, (1,), ((7,),), 0.0, swa_lock_ref=1)
    node = NodeSnapshot(1, 0, (7,), None, (2,), 1, (), (), 0.0, swa_lock_ref=1)
    tree = TreeSnapshot(1, False, "lru", 0, 1, (root, node), 0, 1)
    check_swa_allocator(snap, tree=tree)
    over = dataclasses.replace(node, swa_lock_ref=2)
    fires("INV-SWA-TREE-LOCKS", (1,), snap, tree=dataclasses.replace(tree, nodes=(root, over)))
    fires("INV-SWA-TREE-LOCKS", (), snap, tree=dataclasses.replace(tree, swa_evictable_size=1))
    locked_tomb = dataclasses.replace(node, value=(1,), swa_tombstone=True)
    fires(
        "INV-SWA-TREE-LOCKS", (1,), snap, tree=dataclasses.replace(tree, nodes=(root, locked_tomb))
    )


def test_window_of_a_pool_snapshot() -> None:
    from kvpool.config import PoolConfig
    from kvpool.invariants import check_all
    from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager

    mm = SWAMemoryManager(PoolConfig(size=32, disable_radix_cache=True, sliding_window=2))
    mm.new_req("a", [1, 2, 3, 4])
    mm.extend(["a"])
    for tok in (5, 6, 7):
        mm.decode(["a"], [tok])
    snap = mm.snapshot()
    assert snap.swa is not None and snap.reqs[0].swa_evicted_seqlen == 4
    check_all(snap)
    req = snap.reqs[0]
    row = req.req_pool_idx
    assert row is not None
    wrong = dataclasses.replace(snap, reqs=(dataclasses.replace(req, swa_evicted_seqlen=3),))
    with pytest.raises(InvariantViolation) as info:
        check_all(wrong)
    assert info.value.invariant_id == "INV-SWA-WINDOW" and info.value.indices == (row,)
