"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's scheduler glue for a hybrid (Mamba) model
with the radix cache off in lockstep (:mod:`kvpool.sglang.glue_v0516_mamba`): 0.5.16's glue over
its ``HybridReqToTokenPool`` and its own ``ChunkCache`` (the Mamba slots taken inside
``alloc_req_slots``, freed by ``release_kv_cache``'s ``free_mamba_cache``); with the radix cache
on, 0.5.16's glue over its unified tree (test_sglang_glue_v0516_mamba_radix.py); with
layer-wise loading kvpool's lifecycle, reported direct only with the reason; the stand-in
refuses fields 0.5.16 does not read; a Mamba-state leak planted in 0.5.16's release glue is
caught with a short trace marked reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_v0516 import MAMBA_TREE_V0516, KvRecords
from kvpool.sglang.glue_v0516_mamba import MambaGlueReqV0516, SGLangMambaGlueManagerV0516
from kvpool.sglang.glue_v0516_mamba_radix import SGLangMambaRadixGlueManagerV0516
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.swarm import Op

pytestmark = pytest.mark.sglang_wheel

OLD = Rules.for_sglang("0.5.16")
GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_req_slots",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:mamba.slots_in_alloc_req_slots",
    "sglang:mamba.freed_in_release_kv_cache",
)
CONFIG = PoolConfig(size=64, page_size=1, req_pool_size=4, max_context_len=64, rules=OLD,
                    mamba_slots=4, disable_radix_cache=True)  # fmt: skip


def test_hybrid_configurations_get_0_5_16s_glue_without_layerwise_loading() -> None:
    candidate = implementation("0.5.16")
    assert candidate.manager is not None and candidate.manager_runs_hybrid
    assert candidate.provides("mamba_manager")
    assert isinstance(candidate.manager(CONFIG), SGLangMambaGlueManagerV0516)
    # the radix cache on: 0.5.16's glue over its unified tree (test_sglang_glue_v0516_mamba_radix)
    tree_on = dataclasses.replace(CONFIG, disable_radix_cache=False)
    assert isinstance(candidate.manager(tree_on), SGLangMambaRadixGlueManagerV0516)
    layerwise = dataclasses.replace(tree_on, layerwise_loading=True)
    own = candidate.manager(layerwise)
    assert isinstance(own, MemoryManager) and not isinstance(own, SGLangMambaGlueManagerV0516)
    assert candidate.reachability is not None
    ops = [Op("new_req", ("r1", [1, 2, 3])), Op("extend", (["r1"],))]
    assert candidate.reachability(CONFIG, ops).startswith("reachable")
    assert candidate.reachability(tree_on, ops).startswith("reachable")
    assert candidate.reachability(layerwise, ops) == f"direct only: {MAMBA_TREE_V0516}"


def test_one_request_through_the_hybrid_glue() -> None:
    """Extend in two chunks, decode, finish: SGLang's pool gives the row and a Mamba slot at the
    first chunk, the chunk cache keeps the prefix, the release frees the state, row and KV."""
    manager: Any = implementation("0.5.16").manager
    mgr = manager(dataclasses.replace(CONFIG, mamba_track_buffers=1))
    pool = mgr.req_to_token_pool
    free = pool.mamba_allocator.available_size()
    mgr.new_req("a", list(range(1, 11)))
    mgr.extend(["a"], [6])
    req = mgr.reqs["a"]
    assert req.mamba_pool_idx is not None and req.mamba_ping_pong_track_buffer is not None
    assert pool.mamba_allocator.available_size() == free - 2  # the state and one track slot
    assert len(req.prefix_indices) == 6  # ChunkCache.cache_unfinished_req: extend_range.end
    mgr.extend(["a"])
    mgr.decode(["a"], [11])
    mgr.finish(["a"])
    assert pool.mamba_allocator.available_size() == free
    assert mgr.token_to_kv_pool_allocator.available_size() == 64
    assert mgr.mamba_glue["mamba.freed_in_release_kv_cache"] == 1


def test_the_stand_in_refuses_fields_0_5_16_does_not_read() -> None:
    manager: Any = implementation("0.5.16").manager
    mgr = manager(CONFIG)
    mgr.new_req("a", [1, 2, 3])
    req = mgr.reqs["a"]
    glue = MambaGlueReqV0516(req, KvRecords())
    assert glue.mamba_pool_idx is None and glue.extend_range.end == len(req.fill_ids)
    glue.mamba_pool_idx = torch.tensor(3)
    assert req.mamba_pool_idx == 3 and int(glue.mamba_pool_idx) == 3
    glue.mamba_pool_idx = None
    for name in ("mamba_cow_src_index", "mamba_last_track_seqlen", "swa_evict_floor", "seqlen"):
        with pytest.raises(AttributeError, match="does not map"):
            getattr(glue, name)
    with pytest.raises(AttributeError, match="does not map"):
        glue.mamba_cow_src_index = torch.tensor([1])


def test_mamba_glue_campaign_passes_and_names_the_glue_that_ran() -> None:
    result = run_machine("mamba_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=3, max_runs=30)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))


def test_a_mamba_leak_planted_in_sglangs_release_glue_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.16").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def leaky_release(req: Any, tree: Any, is_insert: bool = True) -> None:
        """Planted: an aborted or retracted request's Mamba state and track slots are dropped
        from the request, never given back to the pool."""
        pool = tree.req_to_token_pool
        if is_insert or req.req_pool_idx is None:
            original(req, tree, is_insert=is_insert)
            return

        def drop(r: Any, *args: Any, **kwargs: Any) -> None:
            r.mamba_pool_idx = None
            if pool.enable_mamba_extra_buffer:
                r.mamba_ping_pong_track_buffer = None
                r.mamba_next_track_idx = None

        pool.free_mamba_cache = drop
        try:
            original(req, tree, is_insert=is_insert)
        finally:
            del pool.free_mamba_cache

    monkeypatch.setattr(common, "release_kv_cache", leaky_release)
    result = run_machine("mamba_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=1, max_runs=40)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector != "crash", report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
