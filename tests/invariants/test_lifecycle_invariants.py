"""Each tree/lifecycle invariant accepts real states and rejects a corrupted snapshot."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation
from kvpool.invariants import INVARIANTS, check_all
from kvpool.invariants import lifecycle as lc
from kvpool.invariants import tree as tr
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.snapshot import PoolSnapshot

Check = Callable[[PoolSnapshot, PoolSnapshot | None], None]

IDS = (
    "INV-POOL-ACCOUNTING",
    "INV-ROW-OWNERS",
    "INV-ONE-OWNER",
    "INV-LOCKS",
    "INV-TREE-SHAPE",
    "INV-ROW-SLOTS",
    "INV-LENGTHS",
    "INV-IDLE",
    "INV-KV-INTEGRITY",
)


def busy_state(ps: int = 2) -> MemoryManager:
    """A finished request in the tree, a running one sharing its prefix, a session turn."""
    mm = MemoryManager(PoolConfig(size=32, page_size=ps, req_pool_size=3, max_context_len=16))
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    mm.new_req("b", [1, 2, 3, 4, 6, 7])
    mm.extend(["b"])
    mm.open_session("s")
    mm.new_req("t", [1, 2, 9], session_id="s")
    mm.extend(["t"])
    mm.finish(["t"])
    return mm


def expect(check: Check, snap: PoolSnapshot, invariant_id: str) -> InvariantViolation:
    with pytest.raises(InvariantViolation) as info:
        check(snap, None)
    assert info.value.invariant_id == invariant_id
    return info.value


def test_all_registered_with_descriptions() -> None:
    for inv in IDS:
        assert inv in INVARIANTS and INVARIANTS[inv].description
        assert "pool" in INVARIANTS[inv].scopes


@pytest.mark.parametrize("ps", [1, 2])
def test_real_states_pass(ps: int) -> None:
    mm = busy_state(ps)
    assert check_all(mm.snapshot()) >= len(IDS)
    mm.abort("b")
    check_all(mm.snapshot())  # idle apart from the session


def test_accounting_and_one_owner_catch_a_leaked_page() -> None:
    snap = busy_state().snapshot()
    alloc = dataclasses.replace(snap.allocator, free_pages=snap.allocator.free_pages[1:])
    bad = dataclasses.replace(snap, allocator=alloc)
    err = expect(lc.check_pool_accounting, bad, "INV-POOL-ACCOUNTING")
    assert snap.allocator.free_pages[0] in err.indices
    expect(lc.check_one_owner, bad, "INV-ONE-OWNER")


def test_one_owner_catches_a_page_both_free_and_in_the_tree() -> None:
    snap = busy_state().snapshot()
    tree_page = snap.tree.nodes[1].value[0] // 2
    alloc = dataclasses.replace(snap.allocator, free_pages=(*snap.allocator.free_pages, tree_page))
    err = expect(lc.check_one_owner, dataclasses.replace(snap, allocator=alloc), "INV-ONE-OWNER")
    assert tree_page in err.indices


def test_row_owners_catch_a_lost_row() -> None:
    snap = busy_state().snapshot()
    table = dataclasses.replace(snap.req_to_token, free_slots=snap.req_to_token.free_slots[1:])
    expect(lc.check_row_owners, dataclasses.replace(snap, req_to_token=table), "INV-ROW-OWNERS")


def test_locks_catch_wrong_counts_and_sizes_and_evicted_locked_node() -> None:
    snap = busy_state().snapshot()
    nodes = list(snap.tree.nodes)
    nodes[1] = dataclasses.replace(nodes[1], lock_ref=nodes[1].lock_ref + 1)
    tree = dataclasses.replace(snap.tree, nodes=tuple(nodes))
    expect(tr.check_locks, dataclasses.replace(snap, tree=tree), "INV-LOCKS")
    sized = dataclasses.replace(snap.tree, evictable_size=snap.tree.evictable_size + 2)
    expect(tr.check_locks, dataclasses.replace(snap, tree=sized), "INV-LOCKS")
    locked = [n for n in snap.tree.nodes[1:] if n.lock_ref > 0]
    assert locked
    gone = dataclasses.replace(
        snap.tree, nodes=tuple(n for n in snap.tree.nodes if n.node_id != locked[-1].node_id)
    )
    with pytest.raises(InvariantViolation) as info:
        tr.check_locks(dataclasses.replace(snap, tree=gone), snap)
    assert info.value.invariant_id == "INV-LOCKS"


def test_tree_shape_catches_bad_values_and_keys() -> None:
    snap = busy_state().snapshot()
    nodes = list(snap.tree.nodes)
    nodes[1] = dataclasses.replace(nodes[1], value=nodes[1].value[:-1])
    bad = dataclasses.replace(snap, tree=dataclasses.replace(snap.tree, nodes=tuple(nodes)))
    expect(tr.check_tree_shape, bad, "INV-TREE-SHAPE")
    nodes = list(snap.tree.nodes)
    nodes[0] = dataclasses.replace(nodes[0], child_keys=((9, 9),) * len(nodes[0].child_keys))
    bad = dataclasses.replace(snap, tree=dataclasses.replace(snap.tree, nodes=tuple(nodes)))
    expect(tr.check_tree_shape, bad, "INV-TREE-SHAPE")


def _replace_req(snap: PoolSnapshot, **changes: object) -> PoolSnapshot:
    reqs = list(snap.reqs)
    reqs[0] = dataclasses.replace(reqs[0], **changes)  # type: ignore[arg-type]
    return dataclasses.replace(snap, reqs=tuple(reqs))


def test_row_slots_catch_a_free_slot_and_a_wrong_prefix() -> None:
    snap = busy_state().snapshot()
    (b,) = [r for r in snap.reqs if r.rid == "b"]
    assert snap.reqs[0] is b
    free_slot = snap.allocator.free_pages[0] * 2
    row = (*b.row[:-1], free_slot)
    expect(lc.check_row_slots, _replace_req(snap, row=row), "INV-ROW-SLOTS")
    swapped = (b.row[1], b.row[0], *b.row[2:])
    expect(lc.check_row_slots, _replace_req(snap, row=swapped), "INV-ROW-SLOTS")


def test_lengths_and_kv_integrity() -> None:
    snap = busy_state().snapshot()
    b = snap.reqs[0]
    expect(lc.check_lengths, _replace_req(snap, kv_committed_len=1), "INV-LENGTHS")
    tags = (b.kv_tags[0] + 1, *b.kv_tags[1:])
    err = expect(lc.check_kv_integrity, _replace_req(snap, kv_tags=tags), "INV-KV-INTEGRITY")
    assert err.indices == (b.row[0],)


def test_idle_catches_a_held_row() -> None:
    mm = busy_state()
    mm.abort("b")
    snap = mm.snapshot()
    lc.check_idle(snap, None)
    table = dataclasses.replace(snap.req_to_token, free_slots=snap.req_to_token.free_slots[1:])
    expect(lc.check_idle, dataclasses.replace(snap, req_to_token=table), "INV-IDLE")
    nodes = list(snap.tree.nodes)
    idx = next(i for i, n in enumerate(nodes) if i and n.lock_ref == 0)
    nodes[idx] = dataclasses.replace(nodes[idx], lock_ref=1)
    bad = dataclasses.replace(snap, tree=dataclasses.replace(snap.tree, nodes=tuple(nodes)))
    expect(lc.check_idle, bad, "INV-IDLE")
