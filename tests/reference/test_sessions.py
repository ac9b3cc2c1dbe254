"""Session ownership transfer: take on finish, restore on the next turn, return on close."""

from __future__ import annotations

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError, RequestStateError, UnknownRequestError
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from tests.reference.test_memory_manager import refused


def manager(ps: int = 1, **kw: object) -> MemoryManager:
    cfg: dict[str, object] = {"size": 64, "page_size": ps, "req_pool_size": 2}
    cfg.update(kw)
    return MemoryManager(PoolConfig(**cfg))  # type: ignore[arg-type]


@pytest.mark.parametrize("ps", [1, 4])
def test_two_turns_then_close_returns_everything(ps: int) -> None:
    mm = manager(ps)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5], session_id="s")
    mm.extend(["t1"])
    mm.spec_step(["t1"], [[6]], reserve=2)  # over-allocates past the committed KV
    row = mm.reqs["t1"].req_pool_idx
    allocated = -(-(6 - 1 + 2 * 2) // ps) * ps  # ceil_align(committed 5 + 2R, ps) before the step
    assert row is not None and mm.reqs["t1"].kv_allocated_len == allocated
    kv = mm.req_to_token_pool.read(row, 0, allocated)
    free_before = mm.token_to_kv_pool_allocator.available_size()
    mm.finish(["t1"])
    # The hand-over frees the over-allocation [ceil_align(6), allocated), as both SGLang
    # releases' streaming sessions do (_trim_overshoot); the session keeps the committed 6.
    over = allocated - -(-6 // ps) * ps
    assert mm.token_to_kv_pool_allocator.available_size() == free_before + over
    slot = mm.sessions["s"]
    assert slot.req_pool_idx == row and slot.kv_committed_len == 6
    assert slot.kv_allocated_len == 6 and slot.busy_with is None
    snap = mm.snapshot()
    check_all(snap)
    assert snap.sessions[0].row == tuple(kv[:6])  # the session took the committed columns
    assert mm.req_to_token_pool.available_size() == 1  # the session keeps the row

    mm.new_req("t2", [7, 8], session_id="s")
    assert mm.reqs["t2"].all_token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert mm.match_prefix("t2") == 6
    free_before = mm.token_to_kv_pool_allocator.available_size()
    mm.extend(["t2"])
    # Restore frees nothing more; t2 then takes its new pages.
    new = 2 if ps == 1 else (-(-8 // ps) - -(-6 // ps)) * ps
    assert mm.token_to_kv_pool_allocator.available_size() == free_before - new
    t2 = mm.reqs["t2"]
    assert t2.req_pool_idx == row and t2.kv_committed_len == 8
    assert slot.req_pool_idx is None and slot.busy_with == "t2"
    check_all(mm.snapshot())
    mm.finish(["t2"])
    check_all(mm.snapshot())
    mm.close_session("s")
    snap = mm.snapshot()
    check_all(snap)
    assert snap.sessions == () and snap.tree.protected_size == 0
    assert snap.allocator.available_size() == 64
    assert len(snap.req_to_token.free_slots) == 2


def test_session_turn_shares_tree_prefix_lock() -> None:
    mm = manager()
    mm.new_req("a", [1, 2, 3, 4])
    mm.extend(["a"])
    mm.finish(["a"])
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5], session_id="s")
    mm.extend(["t1"])
    mm.finish(["t1"])
    assert mm.sessions["s"].cache_protected_len == 4
    assert mm.tree_cache.protected_size() == 4  # the session holds the lock
    assert mm.evict(100) == 0
    check_all(mm.snapshot())
    mm.close_session("s")
    assert mm.tree_cache.protected_size() == 0
    check_all(mm.snapshot())


def test_session_rules_refuse_and_change_nothing() -> None:
    mm = manager()
    refused(mm, UnknownRequestError, lambda: mm.new_req("x", [1], session_id="nope"))
    mm.open_session("s")
    refused(mm, InvalidArgumentError, lambda: mm.open_session("s"))
    mm.new_req("t1", [1, 2], extra_key="ns", session_id="s")
    refused(mm, RequestStateError, lambda: mm.new_req("t1b", [1], session_id="s"))  # one turn
    refused(mm, RequestStateError, lambda: mm.close_session("s"))
    mm.extend(["t1"])
    mm.finish(["t1"])
    refused(
        mm, InvalidArgumentError, lambda: mm.new_req("t2", [3], extra_key="other", session_id="s")
    )
    mm.new_req("t2", [3], session_id="s")
    assert mm.reqs["t2"].extra_key == "ns"  # inherits the session's namespace
    refused(mm, UnknownRequestError, lambda: mm.close_session("nope"))
    refused(mm, RequestStateError, lambda: mm.close_session("s"))  # busy with t2


def test_abort_of_restored_turn_releases_the_history() -> None:
    mm = manager(4)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5, 6], session_id="s")
    mm.extend(["t1"])
    mm.finish(["t1"])
    mm.new_req("t2", [7], session_id="s")
    mm.abort("t2")  # waiting: the session keeps everything
    assert mm.sessions["s"].holds_kv()
    mm.new_req("t3", [7], session_id="s")
    mm.extend(["t3"])
    mm.abort("t3")  # running: its KV (the session's history) is released
    slot = mm.sessions["s"]
    assert not slot.holds_kv() and slot.tokens == [] and slot.busy_with is None
    snap = mm.snapshot()
    check_all(snap)
    assert snap.allocator.available_size() == 64


def test_retract_of_restored_turn_then_finish() -> None:
    mm = manager()
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3], session_id="s")
    mm.extend(["t1"])
    mm.finish(["t1"])
    mm.new_req("t2", [4], session_id="s")
    mm.extend(["t2"])
    mm.retract("t2")
    check_all(mm.snapshot())
    assert mm.reqs["t2"].origin_input_ids == [1, 2, 3, 4]
    mm.extend(["t2"])
    mm.finish(["t2"])
    assert mm.sessions["s"].kv_committed_len == 4
    check_all(mm.snapshot())
