"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's own ``HybridReqToTokenPool`` (its
``MambaPool`` and ``MambaSlotAllocator``) and ``MambaRadixCache`` in lockstep with kvpool's
reference, through ``kvpool.sglang``'s adapters; and the behaviours of SGLang the campaigns
avoid (``Rules.mamba_slot_shortage``, clear inside an alloc group), pinned on SGLang itself."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.reference.mamba import lifecycle as life
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool
from kvpool.sglang import implementation
from kvpool.tags import mamba_state_tag
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.hybrid import MachineMambaReq as Req

pytestmark = pytest.mark.sglang_wheel

RUNS = 10
"""Seeded runs per campaign (60 steps each)."""


@pytest.mark.parametrize("component", ["hybrid_req_to_token_pool", "mamba_radix_cache"])
def test_hybrid_campaign_against_sglang_passes(component: str) -> None:
    candidate = implementation("0.5.16")
    assert candidate.provides(component)
    result = run_machine(component, reference_implementation(), candidate, seconds=3600.0,
                         seed=11, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE[component] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE[component]) // 2, reached


def _pools(track_buffers: int) -> tuple[HybridReqToTokenPool, Any]:
    impl = implementation("0.5.16")
    assert impl.hybrid_req_to_token_pool is not None
    rules = impl.rules_or_default()
    config = PoolConfig(req_pool_size=3, max_context_len=16, mamba_slots=6,
                        mamba_track_buffers=track_buffers, rules=rules)  # fmt: skip
    ref = HybridReqToTokenPool(3, 16, 6, track_buffers=track_buffers, rules=rules)
    return ref, impl.hybrid_req_to_token_pool(config)


def test_sglang_pool_copies_and_clears_states_like_the_reference() -> None:
    ref, sgl = _pools(track_buffers=2)
    for pool in (ref, sgl):
        a = Req()
        assert life.admit(pool, [a]) == [1]
        assert (a.mamba_pool_idx, a.mamba_ping_pong_track_buffer) == (1, [2, 3])
        assert life.prepare_forward(pool, [a]) == (0, 1)
        life.forward_state(pool, [a], [mamba_state_tag([4, 5])])
        b = Req()
        assert life.stage_cow(pool, b, 1) and b.mamba_pool_idx == 4
        assert life.admit(pool, [b]) == [2]
        assert life.prepare_forward(pool, [b]) == (1, 0)
        assert pool.mamba_pool.state_tags([1, 4]) == [mamba_state_tag([4, 5])] * 2
        assert life.release_running(pool, a, keep=1) == [3]
    assert sgl.hybrid_snapshot() == ref.hybrid_snapshot()


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_sglang_mamba_buffers_read_as_tags_per_layer_and_slot(version: str) -> None:
    """The adapter's tag view of SGLang's state buffers: a slot's value per layer, -1 where a
    slot's elements disagree (a NaN never equals itself)."""
    impl = implementation(version)
    assert impl.hybrid_req_to_token_pool is not None
    config = PoolConfig(req_pool_size=3, max_context_len=16, mamba_slots=6, mamba_layers=2,
                        rules=impl.rules_or_default())  # fmt: skip
    pool = impl.hybrid_req_to_token_pool(config).mamba_pool
    pool.write_state([1, 2, 5], [7, 9, 4])
    convs, temporal = pool._buffers()
    temporal[1, 2] = 5.0  # layer 1 of slot 2 holds another tag
    convs[0][0, 5] = float("nan")  # layer 0's conv state of slot 5 unreadable
    snap = pool.snapshot()
    assert snap.conv == ((0, 7, 9, 0, 0, -1, 0), (0, 7, 9, 0, 0, 4, 0))
    assert snap.temporal == ((0, 7, 9, 0, 0, 4, 0), (0, 7, 5, 0, 0, 4, 0))
    assert [snap.state_tag(s) for s in (1, 2, 3, 5)] == [7, -1, 0, -1]


def test_sglang_alloc_asserts_after_taking_rows_when_mamba_slots_are_short() -> None:
    """Rules.mamba_slot_shortage="assert": why the campaigns never drive SGLang there."""
    ref, sgl = _pools(track_buffers=2)
    for pool in (ref, sgl):
        assert life.admit(pool, [Req(), Req()]) == [1, 2]  # 6 slots taken
    assert life.admit(ref, [Req()]) is None  # kvpool: refused, nothing changed
    with pytest.raises(AssertionError, match="Not enough space for mamba cache"):
        life.admit(sgl, [Req()])
    assert sgl.free_slots == []  # the row was taken first


def test_sglang_clear_inside_an_alloc_group_hands_a_slot_out_twice() -> None:
    """SGLang's MambaSlotAllocator.clear keeps an open group's prefetched slots, which are then
    free as well; kvpool's clear drops the group (the campaigns clear outside groups)."""
    _, sgl = _pools(track_buffers=0)
    alloc = sgl.mamba_allocator
    alloc.alloc_group_begin(2)  # slots 1 and 2 prefetched
    sgl.clear()
    first = alloc.alloc(1)  # from the group: 1
    second = alloc.alloc(2)  # from the free list: 1, 2
    assert first == [1] and second == [1, 2]
    assert isinstance(alloc.impl.free_slots, torch.Tensor)


def test_sglang_cow_match_asserts_when_no_slot_is_left_after_eviction() -> None:
    """Rules.mamba_slot_shortage="assert" for the tree: kvpool's match leaves the request
    without a slot; SGLang's asserts (after the eviction, its lock released)."""
    impl = implementation("0.5.16")
    assert impl.mamba_radix_cache is not None and impl.allocator is not None
    assert impl.radix_key is not None and impl.hybrid_req_to_token_pool is not None
    config = PoolConfig(size=16, req_pool_size=2, max_context_len=16, mamba_slots=2,
                        rules=impl.rules_or_default())  # fmt: skip
    pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
    tree = impl.mamba_radix_cache(config, pool, kv)
    state = pool.mamba_allocator.alloc(1)
    assert tree.insert(impl.radix_key([1, 2], None), kv.alloc(2), state[0]) == (0, False)
    assert pool.mamba_allocator.alloc(1) is not None  # the last slot, held elsewhere
    with pytest.raises(AssertionError, match="Can not alloc mamba cache"):
        tree.match_prefix(impl.radix_key([1, 2, 3], None), Req(), True)
    snap = tree.snapshot()
    assert [(n.mamba_value, n.full_lock_ref, n.mamba_lock_ref) for n in snap.nodes[1:]] == [
        (state[0], 0, 0)
    ]
