"""The lifecycle promises (INV-SPEC-ALIGNED, INV-CAPACITY-HONOURED, INV-SESSION-HELD,
INV-SESSION-TRIMMED) accept real states and fire on a corrupted snapshot or a broken candidate."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import InvariantViolation, OutOfMemoryError
from kvpool.invariants import INVARIANTS, check_all
from kvpool.invariants import promises as pr
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.snapshot import PoolSnapshot


def spec_state() -> MemoryManager:
    """A paged request with a speculative over-allocation and an idle session holding KV."""
    mm = MemoryManager(PoolConfig(size=64, page_size=4, req_pool_size=3, max_context_len=32))
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.spec_step(["a"], [[7]], 2)
    mm.open_session("s")
    mm.new_req("t", [1, 2, 9], session_id="s")
    mm.extend(["t"])
    mm.finish(["t"])
    return mm


def test_registered_and_quiet_on_real_states() -> None:
    for inv in ("INV-SPEC-ALIGNED", "INV-CAPACITY-HONOURED", "INV-SESSION-HELD",
                "INV-SESSION-TRIMMED"):  # fmt: skip
        assert "pool" in INVARIANTS[inv].scopes and INVARIANTS[inv].description
    mm = spec_state()
    snap = mm.snapshot()
    assert any(r.kv_allocated_len > r.kv_committed_len for r in snap.reqs)
    assert check_all(snap, snap) > 0


def test_spec_aligned_fires_on_a_mid_page_over_allocation() -> None:
    snap = spec_state().snapshot()
    (req,) = [r for r in snap.reqs if r.kv_allocated_len > r.kv_committed_len]
    bad_req = dataclasses.replace(req, kv_allocated_len=req.kv_allocated_len - 1)
    bad = dataclasses.replace(snap, reqs=tuple(bad_req if r is req else r for r in snap.reqs))
    with pytest.raises(InvariantViolation) as info:
        pr.check_spec_aligned(bad, None)
    assert info.value.invariant_id == "INV-SPEC-ALIGNED"


def test_session_held_fires_when_a_session_loses_kv() -> None:
    snap = spec_state().snapshot()
    (s,) = snap.sessions
    shrunk = dataclasses.replace(s, kv_committed_len=s.kv_committed_len - 1)
    bad = dataclasses.replace(snap, sessions=(shrunk,))
    with pytest.raises(InvariantViolation) as info:
        pr.check_session_held(bad, snap)
    assert info.value.invariant_id == "INV-SESSION-HELD"
    pr.check_session_held(snap, bad)  # growing back is fine


class _Stingy(PagedTokenToKVPoolAllocator):
    """A candidate allocator that refuses every extend although pages are free."""

    def alloc_extend(self, *args: Any, **kwargs: Any) -> Any:
        return None


def test_capacity_honoured_fires_on_a_refusing_candidate() -> None:
    config = PoolConfig(size=64, page_size=4, req_pool_size=2, max_context_len=32)
    mm = MemoryManager(config, token_to_kv_pool_allocator=_Stingy(64, 4))
    before: PoolSnapshot = mm.snapshot()
    mm.new_req("a", [1, 2, 3])
    with pytest.raises(OutOfMemoryError):
        mm.extend(["a"])
    with pytest.raises(InvariantViolation) as info:
        pr.check_capacity_honoured(mm.snapshot(), before)
    assert info.value.invariant_id == "INV-CAPACITY-HONOURED"


def test_session_trimmed_fires_when_a_session_keeps_an_over_allocation() -> None:
    mm = MemoryManager(PoolConfig(size=64, page_size=4, req_pool_size=3, max_context_len=32))
    mm.open_session("s")
    mm.new_req("t", [1, 2, 9], session_id="s")
    mm.extend(["t"])
    mm.spec_step(["t"], [[7, 8]], 2)  # reserve past the committed tokens
    assert mm.reqs["t"].kv_allocated_len > mm.reqs["t"].kv_committed_len
    mm.finish(["t"])
    snap = mm.snapshot()
    (s,) = snap.sessions
    assert s.kv_allocated_len == s.kv_committed_len == 5  # the hand-over trimmed
    pr.check_session_trimmed(snap, None)
    kept = dataclasses.replace(s, kv_allocated_len=8)
    with pytest.raises(InvariantViolation) as info:
        pr.check_session_trimmed(dataclasses.replace(snap, sessions=(kept,)), None)
    assert info.value.invariant_id == "INV-SESSION-TRIMMED" and info.value.indices == (0,)
