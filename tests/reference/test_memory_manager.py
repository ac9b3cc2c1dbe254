"""Unit tests of the reference MemoryManager: extend, chunked prefill, decode, finish, abort,
retract, eviction and out-of-memory (every pool unchanged)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import (
    ContextOverflowError,
    InvalidArgumentError,
    KVPoolError,
    OutOfMemoryError,
    RequestStateError,
    RowReuseError,
    UnknownRequestError,
)
from kvpool.invariants import check_all
from kvpool.protocols.kv import KVCacheProtocol
from kvpool.protocols.lifecycle import MemoryManagerProtocol
from kvpool.protocols.radix import RadixCacheProtocol
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.reference.kv.mla import MLATokenToKVPool
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.req import Req
from kvpool.tags import kv_tags


def manager(**kw: object) -> MemoryManager:
    base: dict[str, object] = {
        "size": 32,
        "page_size": 1,
        "req_pool_size": 4,
        "max_context_len": 32,
    }
    base.update(kw)
    return MemoryManager(PoolConfig(**base))  # type: ignore[arg-type]


def identity(mm: MemoryManager) -> int:
    """available + evictable + protected + held by requests (tokens)."""
    ps = mm.page_size
    held = sum(
        -(-r.kv_allocated_len // ps) * ps - r.cache_protected_len
        for r in mm.reqs.values()
        if r.req_pool_idx is not None
    )
    tree = mm.tree_cache
    return (
        mm.token_to_kv_pool_allocator.available_size()
        + tree.evictable_size()
        + tree.protected_size()
        + held
    )


def test_extend_decode_finish_and_prefix_reuse() -> None:
    mm = manager()
    mm.new_req("a", [1, 2, 3, 4])
    assert mm.extend(["a"]) == [1, 2, 3, 4]
    assert mm.decode(["a"], [5]) == [5]
    check_all(mm.snapshot())
    mm.finish(["a"])
    assert "a" not in mm.reqs and mm.tree_cache.total_size() == 5
    mm.new_req("b", [1, 2, 3, 4, 5, 6])
    assert mm.match_prefix("b") == 5
    assert mm.extend(["b"]) == [6]
    snap = mm.snapshot()
    check_all(snap)
    (rb,) = snap.reqs
    assert rb.row == (1, 2, 3, 4, 5, 6) and rb.cache_protected_len == 5
    assert rb.kv_tags == rb.expected_tags == tuple(kv_tags([1, 2, 3, 4, 5, 6]))
    assert identity(mm) == 32


def test_match_caps_at_len_minus_one_and_relocks() -> None:
    mm = manager()
    mm.new_req("a", [1, 2, 3])
    mm.extend(["a"])
    mm.finish(["a"])
    mm.new_req("b", [1, 2, 3])
    assert mm.match_prefix("b") == 2  # one token is always computed
    assert mm.match_prefix("b") == 2  # matching again moves the lock, does not add one
    check_all(mm.snapshot())
    assert mm.tree_cache.protected_size() == 2
    mm.abort("b")
    assert mm.tree_cache.protected_size() == 0
    check_all(mm.snapshot())


def test_two_chunk_prefill_keeps_row_and_inserts() -> None:
    mm = manager(page_size=4, size=64)
    mm.new_req("a", list(range(1, 11)))
    first = mm.extend(["a"], [6])
    req = mm.reqs["a"]
    assert len(first) == 6 and req.is_chunked == 1 and req.cache_protected_len == 4
    row = req.req_pool_idx
    check_all(mm.snapshot())
    second = mm.extend(["a"])
    assert len(second) == 4 and req.is_chunked == 0 and req.req_pool_idx == row
    assert req.kv_committed_len == 10
    check_all(mm.snapshot())
    with pytest.raises(RequestStateError):
        mm.extend(["a"])  # running, not chunked


def test_oom_in_extend_changes_nothing_and_releases_its_locks() -> None:
    mm = manager(size=8)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])  # tree: 5 tokens, 3 free
    mm.new_req("b", [1, 2, 3, 4, 9, 9, 9, 9, 9])  # prefix 4 locked; needs 5, only 3 + 1
    before = mm.snapshot()
    with pytest.raises(OutOfMemoryError):
        mm.extend(["b"])
    after = mm.snapshot()
    assert after.allocator == before.allocator and after.reqs == before.reqs
    assert after.req_to_token == before.req_to_token
    assert after.tree.protected_size == 0 and after.tree.evictable_size == 5
    check_all(after)


def test_extend_evicts_exactly_the_shortfall() -> None:
    mm = manager(size=8)
    for rid, toks in (("a", [1, 1, 1]), ("b", [2, 2, 2])):
        mm.new_req(rid, toks)
        mm.extend([rid])
        mm.finish([rid])
    mm.new_req("c", [3, 3, 3, 3])  # 2 free; shortfall 2 -> evicts "a"'s leaf (3 tokens)
    mm.extend(["c"])
    assert mm.tree_cache.evictable_size() == 3
    assert mm.token_to_kv_pool_allocator.available_size() == 1
    check_all(mm.snapshot())


def test_rows_are_checked_first() -> None:
    mm = manager(req_pool_size=1)
    mm.new_req("a", [1, 2])
    mm.new_req("b", [3, 4])
    with pytest.raises(OutOfMemoryError):
        mm.extend(["a", "b"])
    assert all(not r.matched for r in mm.reqs.values())
    mm.extend(["a"])
    with pytest.raises(OutOfMemoryError):
        mm.extend(["b"])
    check_all(mm.snapshot())


def test_abort_and_retract() -> None:
    mm = manager(page_size=2, size=32)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.decode(["a"], [6])
    mm.retract("a")
    req = mm.reqs["a"]
    assert req.state == "waiting" and req.origin_input_ids == [1, 2, 3, 4, 5, 6]
    assert req.req_pool_idx is None and mm.tree_cache.total_size() == 0
    check_all(mm.snapshot())
    mm.extend(["a"])
    mm.abort("a")
    snap = mm.snapshot()
    check_all(snap)
    assert snap.reqs == () and snap.allocator.available_size() == 32


def test_finish_batch_in_one_free_group() -> None:
    mm = manager(page_size=2, size=32)
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.new_req("b", [1, 2, 3, 4, 6])
    mm.extend(["a", "b"])
    mm.finish(["a", "b"])
    snap = mm.snapshot()
    check_all(snap)
    assert not snap.allocator.in_free_group
    assert snap.tree.evictable_size == 4  # shared pages once, tails freed
    assert snap.allocator.available_size() == 28


def refused(mm: MemoryManager, error: type[Exception], action: Callable[[], object]) -> None:
    """``action`` raises exactly ``error`` (a typed KVPoolError) and the whole state is unchanged:
    pools, tree, request and session tables (the snapshot compares them all)."""
    before = mm.snapshot()
    reqs_before = {rid: repr(r) for rid, r in mm.reqs.items()}
    with pytest.raises(error) as info:
        action()
    assert type(info.value) is error and isinstance(info.value, KVPoolError)
    assert mm.snapshot() == before
    assert {rid: repr(r) for rid, r in mm.reqs.items()} == reqs_before


def test_errors_change_nothing() -> None:
    mm = manager(max_context_len=6)
    refused(mm, UnknownRequestError, lambda: mm.match_prefix("nope"))
    refused(mm, InvalidArgumentError, lambda: mm.new_req("x", []))
    refused(mm, ContextOverflowError, lambda: mm.new_req("x", [1] * 7))
    mm.new_req("a", [1] * 6)
    refused(mm, InvalidArgumentError, lambda: mm.new_req("a", [1]))
    refused(mm, RequestStateError, lambda: mm.decode(["a"], [1]))
    refused(mm, InvalidArgumentError, lambda: mm.extend(["a", "a"]))
    refused(mm, InvalidArgumentError, lambda: mm.extend(["a"], [0]))
    refused(mm, InvalidArgumentError, lambda: mm.extend(["a"], [1, 1]))
    refused(mm, UnknownRequestError, lambda: mm.extend(["a", "nope"]))
    refused(mm, RequestStateError, lambda: mm.finish(["a"]))
    refused(mm, RequestStateError, lambda: mm.retract("a"))
    mm.extend(["a"])
    refused(mm, ContextOverflowError, lambda: mm.decode(["a"], [1]))
    refused(mm, InvalidArgumentError, lambda: mm.decode(["a"], [1, 2]))
    refused(mm, RequestStateError, lambda: mm.match_prefix("a"))
    refused(mm, RequestStateError, lambda: mm.extend(["a"]))  # running, not chunked
    refused(mm, InvalidArgumentError, lambda: mm.evict(-1))
    check_all(mm.snapshot())


def test_disabled_radix_cache_frees_everything() -> None:
    mm = manager(disable_radix_cache=True, page_size=4, size=32)
    mm.new_req("a", [1, 2, 3, 4, 5, 6])
    mm.extend(["a"], [4])
    mm.extend(["a"])
    assert mm.reqs["a"].cache_protected_len == 0
    mm.finish(["a"])
    mm.new_req("b", [1, 2, 3, 4, 5, 6])
    assert mm.match_prefix("b") == 0
    snap = mm.snapshot()
    check_all(snap)
    assert snap.allocator.available_size() == 32 and snap.tree.nodes == ()


def test_mla_layout_tags() -> None:
    mm = manager(kv_layout="mla", num_layers=2, start_layer=3)
    mm.new_req("a", [7, 8, 9])
    slots = mm.extend(["a"])
    assert mm.kv_cache.read_tags(slots) == kv_tags([7, 8, 9])
    check_all(mm.snapshot())


def test_satisfies_the_protocols() -> None:
    """Checked statically by mypy (assignments to the protocol types) and at run time here."""
    mm = manager()
    proto: MemoryManagerProtocol[list[int]] = mm
    cache: RadixCacheProtocol[list[int]] = mm.tree_cache
    mha: KVCacheProtocol = MHATokenToKVPool(4, 1, "float32", 1, 1, 1)
    mla: KVCacheProtocol = MLATokenToKVPool(4, 1, 1, 1, 1)
    kv: KVCacheProtocol = mm.kv_cache
    assert proto is mm and cache is mm.tree_cache and kv is mm.kv_cache
    assert mha.size == mla.size == 4


@pytest.mark.parametrize("ps", [1, 4])
def test_oom_in_decode_changes_nothing(ps: int) -> None:
    mm = manager(page_size=ps, size=8 if ps == 1 else 16)  # the prompt fills the pool
    mm.new_req("a", [1] * mm.config.size)
    mm.extend(["a"])
    before = mm.snapshot()
    with pytest.raises(OutOfMemoryError):
        mm.decode(["a"], [2])
    assert mm.snapshot() == before
    check_all(before)


def test_same_prompt_chunked_together_shares_after_the_first_chunk() -> None:
    mm = manager(page_size=2, size=32, need_sort=True)
    mm.new_req("a", [1, 2, 3, 4, 5, 6])
    mm.new_req("b", [1, 2, 3, 4, 5, 6])
    mm.extend(["a", "b"], [4, 4])
    a, b = mm.reqs["a"], mm.reqs["b"]
    assert a.prefix_indices == b.prefix_indices  # b's duplicates freed, its row rewritten
    assert mm.tree_cache.protected_size() == 4
    check_all(mm.snapshot())
    mm.extend(["a", "b"])
    mm.finish(["a", "b"])
    snap = mm.snapshot()
    check_all(snap)
    assert snap.tree.evictable_size == 6 and snap.allocator.available_size() == 26


def test_priority_eviction_through_the_manager() -> None:
    mm = manager(eviction_policy="priority", size=8)
    mm.new_req("hi", [1, 1, 1], priority=5)
    mm.new_req("lo", [2, 2, 2], priority=1)
    mm.extend(["hi", "lo"])
    mm.finish(["hi", "lo"])
    assert mm.evict(1) == 3
    remaining = [n.key for n in mm.snapshot().tree.nodes[1:]]
    assert remaining == [(1, 1, 1)]


def test_primitives_refuse_misuse_before_allocating() -> None:
    # alloc_for_extend used to allocate (and evict) the slots before alloc_req_slots found the
    # illegal row reuse: the RowReuseError then leaked the slots. Every check now comes first.
    mm = manager(size=16, req_pool_size=2, max_context_len=16)
    mm.new_req("a", [1, 2, 3])
    mm.extend(["a"])
    squatter = Req("x", [5, 6, 7])
    squatter.req_pool_idx = mm.reqs["a"].req_pool_idx  # held by "a"; x has no committed KV
    refused(mm, RowReuseError, lambda: mm.alloc_for_extend([squatter], [3]))
    fresh = Req("y", [5, 6, 7])
    refused(mm, ContextOverflowError, lambda: mm.alloc_for_extend([fresh], [17]))
    row_a = mm.reqs["a"].req_pool_idx
    assert row_a is not None
    fresh.prefix_indices = mm.req_to_token_pool.read(row_a, 0, 2)  # a held row: a prefix
    refused(mm, InvalidArgumentError, lambda: mm.alloc_for_extend([fresh], [1]))
    rowless = Req("z", [5])
    refused(mm, InvalidArgumentError, lambda: mm.alloc_for_decode([mm.reqs["a"], rowless]))
    refused(mm, InvalidArgumentError, lambda: mm.release_kv_cache(rowless))
    refused(mm, InvalidArgumentError, lambda: mm.tree_cache.cache_finished_req(rowless))
    refused(mm, InvalidArgumentError, lambda: mm.tree_cache.cache_unfinished_req(rowless))
    assert fresh.req_pool_idx is None and squatter.kv_allocated_len == 0
    check_all(mm.snapshot())
