"""Speculative decoding in the reference lifecycle: EAGLE v2 over-allocation, v1 borrowing."""

from __future__ import annotations

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import (
    ContextOverflowError,
    InvalidArgumentError,
    OutOfMemoryError,
    UnknownRequestError,
)
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.tags import kv_tags
from tests.reference.test_memory_manager import refused


def running(ps: int, size: int = 64, tokens: tuple[int, ...] = (1, 2, 3)) -> MemoryManager:
    mm = MemoryManager(PoolConfig(size=size, page_size=ps, req_pool_size=2, max_context_len=32))
    mm.new_req("a", list(tokens))
    mm.extend(["a"])
    return mm


@pytest.mark.parametrize("ps", [1, 4])
def test_v2_allocation_runs_ahead_and_is_freed_on_release(ps: int) -> None:
    mm = running(ps)
    req = mm.reqs["a"]
    new = mm.spec_step(["a"], [[4, 5]], reserve=2)
    target = -(-(3 + 4) // ps) * ps
    assert req.kv_allocated_len == target and req.kv_committed_len == 5
    assert len(new) == target - 3  # columns [3, target); paged: col 3 finishes page 1
    check_all(mm.snapshot())
    assert mm.spec_step(["a"], [[]], reserve=1) == []  # never shrinks, nothing new
    free = mm.token_to_kv_pool_allocator.available_size()
    slot = mm.decode(["a"], [6])  # covered by the over-allocation
    assert mm.token_to_kv_pool_allocator.available_size() == free
    assert req.kv_committed_len == 6 and len(slot) == 1
    snap = mm.snapshot()
    check_all(snap)
    assert snap.reqs[0].kv_tags == tuple(kv_tags([1, 2, 3, 4, 5, 6]))
    mm.finish(["a"])
    snap = mm.snapshot()
    check_all(snap)
    assert snap.allocator.available_size() + snap.tree.evictable_size == 64
    assert snap.tree.evictable_size == 6 // ps * ps


def test_v2_rejects_bad_arguments_and_oom_changes_nothing() -> None:
    mm = running(1, size=8)
    refused(mm, InvalidArgumentError, lambda: mm.spec_step(["a"], [[1, 2, 3]], reserve=1))
    refused(mm, InvalidArgumentError, lambda: mm.spec_step(["a"], [[]], reserve=-1))
    refused(mm, InvalidArgumentError, lambda: mm.spec_step(["a"], [[], []], reserve=1))
    refused(mm, ContextOverflowError, lambda: mm.spec_step(["a"], [[]], reserve=20))
    refused(mm, OutOfMemoryError, lambda: mm.spec_step(["a"], [[]], reserve=3))  # 6 > 5 free
    refused(mm, InvalidArgumentError, lambda: mm.spec_draft_v1(["a"], -1))
    refused(mm, OutOfMemoryError, lambda: mm.spec_draft_v1(["a"], 6))
    refused(mm, UnknownRequestError, lambda: mm.spec_step(["b"], [[]], reserve=1))


@pytest.mark.parametrize("ps", [1, 4])
def test_v1_borrows_slots_that_stay_free(ps: int) -> None:
    mm = running(ps)
    before = mm.token_to_kv_pool_allocator.snapshot()
    draft = mm.spec_draft_v1(["a"], 3)
    assert len(draft) == 3
    assert mm.token_to_kv_pool_allocator.snapshot() == before
    expected = kv_tags([1, 2, 3, 0, 0, 0])[3:]
    assert mm.kv_cache.read_tags(draft) == expected
    check_all(mm.snapshot())
    if ps == 4:
        row = mm.reqs["a"].req_pool_idx
        assert row is not None
        assert draft[0] == mm.req_to_token_pool.read(row, 2, 3)[0] + 1  # finishes its page


@pytest.mark.parametrize("twin", ["reference", "optimized"])
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_draft_borrow_evicts_before_its_backup_under_sglang_rules(twin: str, version: str) -> None:
    # Found by the lifecycle campaign against SGLang's own classes: under SGLang's eviction
    # bound, a second eviction inside the backup_state/restore_state window freed tree pages
    # that the restore then threw away (INV-POOL-ACCOUNTING: a page leaked).
    from kvpool.config import PoolConfig
    from kvpool.invariants import check_all
    from kvpool.rules import Rules
    from kvpool.testing.implementations import resolve_implementation

    config = PoolConfig(size=8, page_size=2, req_pool_size=4, max_context_len=16,
                        eviction_policy="lru", rules=Rules.for_sglang(version))  # fmt: skip
    manager = resolve_implementation(twin).manager
    assert manager is not None
    mm = manager(config)
    mm.new_req("r1", [1, 2, 3])
    mm.extend(["r1"])
    mm.finish(["r1"])
    mm.new_req("r2", [4, 5, 6])
    mm.extend(["r2"])
    before = mm.snapshot()
    drafts = mm.spec_draft_v1(["r2"], 1)
    assert len(list(drafts)) == 1
    check_all(mm.snapshot(), before)
