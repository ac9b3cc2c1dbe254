"""A hybrid model through the lifecycle, on both twins: admission refused for want of Mamba
slots changes nothing; every release path (finish, abort and retract, inside prefill or not)
gives the Mamba slot and track buffers back; every step's snapshot passes every invariant,
the Mamba ones included."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool import optimized, reference
from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, InvalidArgumentError, OutOfMemoryError
from kvpool.invariants import check_all
from kvpool.tags import mamba_state_tag

HYBRID = PoolConfig(size=64, req_pool_size=4, max_context_len=32, disable_radix_cache=True,
                    mamba_slots=3, mamba_track_buffers=1, mamba_layers=2)  # fmt: skip
TWINS = pytest.mark.parametrize("twin", [reference, optimized], ids=["reference", "optimized"])


def manager(twin: Any, config: PoolConfig = HYBRID) -> Any:
    return (
        twin.MemoryManager(config)
        if twin is reference
        else twin.MemoryManager(config, checked=True)
    )


def free_mamba(mm: Any) -> tuple[int, ...]:
    snap = mm.snapshot()
    check_all(snap)
    assert snap.mamba is not None
    free: tuple[int, ...] = snap.mamba.pool.mamba_allocator.free_slots
    return free


@TWINS
def test_admission_refused_for_want_of_slots_changes_nothing(twin: Any) -> None:
    mm = manager(twin)
    mm.new_req("a", [1, 2, 3])
    mm.new_req("b", [4, 5])
    mm.extend(["a"])  # a running slot and a track buffer: 2 of 3 slots
    assert free_mamba(mm) == (3,)
    before = mm.snapshot()
    with pytest.raises(OutOfMemoryError):
        mm.extend(["b"])  # needs 2 slots, 1 free
    assert mm.snapshot() == before
    mm.finish(["a"])
    assert free_mamba(mm) == (3, 1, 2)
    mm.extend(["b"])
    req = mm.snapshot().mamba.reqs[0]
    assert (req.rid, req.slot, req.track, req.expected_tag) == (
        "b",
        3,
        (1,),
        mamba_state_tag([4, 5]),
    )


@TWINS
def test_every_release_path_gives_the_slots_back(twin: Any) -> None:
    mm = manager(twin)
    mm.new_req("c", [1, 2, 3, 4, 5, 6])
    mm.extend(["c"], [3])  # inside prefill
    assert mm.snapshot().mamba.reqs[0].expected_tag == mamba_state_tag([1, 2, 3])
    mm.abort("c")
    assert free_mamba(mm) == (3, 1, 2)
    mm.new_req("d", [7, 8])
    mm.extend(["d"])
    mm.decode(["d"], [9])
    assert mm.snapshot().mamba.reqs[0].expected_tag == mamba_state_tag([7, 8, 9])
    mm.retract("d")  # back to waiting: no slot while it waits
    assert free_mamba(mm) == (2, 3, 1) and mm.snapshot().mamba.reqs == ()
    mm.extend(["d"])
    mm.finish(["d"], is_insert=False)
    assert free_mamba(mm) == (1, 2, 3)


@TWINS
def test_hybrid_scope(twin: Any) -> None:
    # the Mamba radix cache runs in the lifecycle without track buffers, at page size 1, LRU
    for bad in ({"mamba_track_buffers": 1}, {"page_size": 2, "size": 64},
                {"eviction_policy": "lfu"}):  # fmt: skip
        with pytest.raises(ConfigError):
            manager(twin, PoolConfig(mamba_slots=4, **bad))
    with pytest.raises(ConfigError):  # sessions are not modelled with it
        manager(twin, PoolConfig(mamba_slots=4)).open_session("s")
    mm = manager(twin)
    mm.open_session("s")
    with pytest.raises(InvalidArgumentError):
        mm.open_session("s")
    assert manager(twin, PoolConfig()).snapshot().mamba is None


def _views(mm: Any) -> list[tuple[str, int | None, int | None, tuple[int, ...], int | None]]:
    snap = mm.snapshot()
    assert check_all(snap) > 0
    return [(r.rid, r.row, r.slot, r.track, r.expected_tag) for r in snap.mamba.reqs]


@TWINS
def test_a_session_keeps_its_state_between_turns(twin: Any) -> None:
    """A finished turn's Mamba slot and track buffer stay with the session (the state after its
    committed tokens); the next turn resumes from them; closing gives them back."""
    mm = manager(twin)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3], session_id="s")
    mm.extend(["t1"])
    mm.decode(["t1"], [9])
    mm.finish(["t1"])
    row = mm.snapshot().req_to_token.free_slots
    assert _views(mm) == [("session s", 4, 1, (2,), mamba_state_tag([1, 2, 3, 9]))]
    assert free_mamba(mm) == (3,)
    mm.new_req("t2", [5], session_id="s")
    mm.new_req("x", [7, 7])
    before = mm.snapshot()
    with pytest.raises(OutOfMemoryError):  # x needs two slots: refused before the restore
        mm.extend(["t2", "x"])
    assert mm.snapshot() == before
    mm.extend(["t2"])  # no new slot: the session's
    assert _views(mm) == [("t2", 4, 1, (2,), mamba_state_tag([1, 2, 3, 9, 5]))]
    mm.finish(["t2"])
    mm.close_session("s")
    assert free_mamba(mm) == (3, 1, 2) and mm.snapshot().req_to_token.free_slots != row


@TWINS
@pytest.mark.parametrize("path", ["abort", "retract"])
def test_a_restored_turn_released_gives_the_session_state_back(twin: Any, path: str) -> None:
    mm = manager(twin)
    mm.open_session("s")
    mm.new_req("t1", [1, 2], session_id="s")
    mm.extend(["t1"])
    mm.finish(["t1"])
    mm.new_req("t2", [3], session_id="s")
    mm.extend(["t2"])
    getattr(mm, path)("t2")  # the turn's state (and the session's history) is released
    assert free_mamba(mm) == (3, 1, 2)
    assert [v for v in _views(mm) if v[0].startswith("session")] == []


@TWINS
def test_a_waiting_turn_aborted_leaves_the_session_state(twin: Any) -> None:
    mm = manager(twin)
    mm.open_session("s")
    mm.new_req("t1", [1, 2], session_id="s")
    mm.extend(["t1"])
    mm.finish(["t1"])
    mm.new_req("t2", [3], session_id="s")
    mm.abort("t2")  # never ran: nothing of the session's is released
    assert _views(mm) == [("session s", 4, 1, (2,), mamba_state_tag([1, 2]))]
    assert free_mamba(mm) == (3,)
