"""A hybrid model with the Mamba radix cache through the lifecycle, on both twins: a prefix match
copies the cached state into the request's own slot; a finish with insert donates the request's
slot as the tree's checkpoint, without insert frees it; a prefill chunk caches a copy; aborts and
retracts return exactly the request's slots; admission evicts cached states, and refuses with
nothing changed when even eviction leaves too few. Every step's snapshot passes every invariant
(the Mamba accounting counts the tree's checkpoints), and both twins end in the same state."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool import optimized, reference
from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.invariants.mamba import tree_checkpoints
from kvpool.snapshot import PoolSnapshot
from kvpool.tags import mamba_state_tag

CONFIG = PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=4)
TWINS = pytest.mark.parametrize("twin", [reference, optimized], ids=["reference", "optimized"])


def manager(twin: Any, config: PoolConfig = CONFIG) -> Any:
    if twin is reference:
        return twin.MemoryManager(config)
    return twin.MemoryManager(config, checked=True)


def snap(mm: Any) -> PoolSnapshot:
    s: PoolSnapshot = mm.snapshot()
    assert check_all(s) > 0
    assert s.mamba is not None and s.mamba.tree is not None
    return s


def checkpoints(mm: Any) -> dict[int, int]:
    """Cached state slot -> the tag it holds now."""
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    return {slot: s.mamba.pool.mamba_pool.state_tag(slot) for slot, _ in
            tree_checkpoints(s.mamba.tree)}  # fmt: skip


def slot_of(mm: Any, rid: str) -> int:
    s = snap(mm)
    assert s.mamba is not None
    (slot,) = [r.slot for r in s.mamba.reqs if r.rid == rid]
    assert slot is not None
    return slot


def tag_at(mm: Any, slot: int) -> int:
    s = snap(mm)
    assert s.mamba is not None
    return s.mamba.pool.mamba_pool.state_tag(slot)


def free_slots(mm: Any) -> int:
    s = snap(mm)
    assert s.mamba is not None
    return len(s.mamba.pool.mamba_allocator.free_slots)


def finished_prefix(mm: Any) -> int:
    """Request a: [1..5], one decode (6), finished with insert: its slot is the checkpoint."""
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.decode(["a"], [6])
    slot = slot_of(mm, "a")
    mm.finish(["a"])
    assert checkpoints(mm) == {slot: mamba_state_tag([1, 2, 3, 4, 5, 6])}
    return slot


@TWINS
def test_match_copies_the_cached_state_into_a_slot_of_its_own(twin: Any) -> None:
    mm = manager(twin)
    cached = finished_prefix(mm)
    mm.new_req("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert mm.match_prefix("b") == 6
    own = slot_of(mm, "b")
    assert own != cached and tag_at(mm, own) == tag_at(mm, cached)
    mm.extend(["b"])
    assert tag_at(mm, own) == mamba_state_tag(list(range(1, 9)))
    assert checkpoints(mm) == {cached: mamba_state_tag([1, 2, 3, 4, 5, 6])}  # not written


@TWINS
def test_every_release_path_returns_exactly_the_requests_slots(twin: Any) -> None:
    mm = manager(twin)
    finished_prefix(mm)
    free = free_slots(mm)
    mm.new_req("w", [1, 2, 3, 4, 5, 6, 9])
    mm.match_prefix("w")  # a copy-on-write slot
    assert free_slots(mm) == free - 1
    mm.abort("w")
    assert free_slots(mm) == free
    for how in ("abort", "retract", "finish-no-insert"):
        mm.new_req(how, [7, 8, 9])
        mm.extend([how])
        assert free_slots(mm) == free - 1
        if how == "abort":
            mm.abort(how)
        elif how == "retract":
            mm.retract(how)
            mm.abort(how)
        else:
            mm.finish([how], is_insert=False)
        assert free_slots(mm) == free


@TWINS
def test_a_prefill_chunk_caches_a_copy_and_keeps_its_slot(twin: Any) -> None:
    mm = manager(twin)
    mm.new_req("c", [1, 2, 3, 4, 5, 6])
    mm.extend(["c"], [3])
    own = slot_of(mm, "c")
    cached = checkpoints(mm)
    assert own not in cached and list(cached.values()) == [mamba_state_tag([1, 2, 3])]
    mm.extend(["c"])
    assert tag_at(mm, own) == mamba_state_tag([1, 2, 3, 4, 5, 6])
    assert checkpoints(mm) == cached


@TWINS
def test_admission_evicts_states_then_refuses_with_nothing_changed(twin: Any) -> None:
    mm = manager(twin, PoolConfig(size=64, req_pool_size=4, max_context_len=32, mamba_slots=3))
    mm.new_req("f", [1, 2])
    mm.extend(["f"])
    mm.finish(["f"])
    assert free_slots(mm) == 2 and len(checkpoints(mm)) == 1
    mm.new_req("x", [50, 51])
    mm.extend(["x"])  # fewer free slots than the headroom (3 a request): the state goes
    assert free_slots(mm) == 2 and checkpoints(mm) == {}
    mm.new_req("y", [60, 61])
    mm.extend(["y"])
    mm.new_req("z", [70, 71, 72, 73])
    before = snap(mm)
    with pytest.raises(OutOfMemoryError):
        mm.extend(["z"], [2])  # a slot for z and one for its chunk's copy: too few
    assert snap(mm) == before


def _script(mm: Any) -> PoolSnapshot:
    finished_prefix(mm)
    mm.new_req("b", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    mm.match_prefix("b")
    mm.extend(["b"], [1])
    mm.extend(["b"])
    mm.spec_step(["b"], [[10, 11]], 2)
    mm.finish(["b"])
    mm.new_req("d", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12])
    mm.extend(["d"])
    mm.retract("d")
    mm.extend(["d"])
    return snap(mm)


def test_both_twins_end_in_the_same_state() -> None:
    assert _script(manager(reference)) == _script(manager(optimized))


def test_pool_scope_mamba_invariants_fire_on_bad_lifecycle_snapshots() -> None:
    """The tree's checkpoints are owners at pool scope: forgetting them leaks their slots, and
    a request naming a checkpoint's slot shares it."""
    mm = manager(reference)
    cached = finished_prefix(mm)
    mm.new_req("b", [7, 8, 9])
    mm.extend(["b"])
    good = snap(mm)
    assert good.mamba is not None
    forgotten = dataclasses.replace(good, mamba=dataclasses.replace(good.mamba, tree=None))
    with pytest.raises(InvariantViolation) as info:
        check_all(forgotten)
    assert info.value.invariant_id == "INV-MAMBA-ACCOUNTING" and info.value.indices == (cached,)
    (view,) = good.mamba.reqs
    shared = dataclasses.replace(
        good, mamba=dataclasses.replace(good.mamba, reqs=(dataclasses.replace(view, slot=cached),))
    )
    with pytest.raises(InvariantViolation) as info:
        check_all(shared)
    assert info.value.invariant_id == "INV-MAMBA-ONE-OWNER" and info.value.indices == (cached,)
