"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's glue for a full-attention model with the
radix cache off, over the tree its registry builds for ``--disable-radix-cache``, its own
``ChunkCache`` (:class:`~kvpool.sglang.glue_v0516.SGLangChunkGlueManagerV0516`): one request
through it, a campaign of such configurations reaching the chunk cache's hand-overs, the
stand-in's one extra field, and a planted leak caught with a short trace marked reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_v0516 import ChunkGlueReqV0516, SGLangChunkGlueManagerV0516
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.swarm import RandomChooser

pytestmark = pytest.mark.sglang_wheel

GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
)

CONFIG = PoolConfig(size=64, page_size=4, req_pool_size=4, max_context_len=64,
                    disable_radix_cache=True)  # fmt: skip


def radix_off(chooser: RandomChooser) -> PoolConfig:
    """The manager machine's configuration for 0.5.16, with the radix cache off (full
    attention, no host tier, no layer-wise loading)."""
    config = TARGETS["manager"].draw_config(chooser, implementation("0.5.16"))
    return dataclasses.replace(config, disable_radix_cache=True, enable_hierarchical_cache=False,
                               mamba_slots=None, layerwise_loading=False)  # fmt: skip


def test_the_chunk_glue_manager_runs_with_the_radix_cache_off() -> None:
    manager: Any = implementation("0.5.16").manager
    mgr = manager(CONFIG)
    assert isinstance(mgr, SGLangChunkGlueManagerV0516)
    tree: Any = mgr.tree_cache
    assert type(tree.impl).__name__ == "ChunkCache"
    with pytest.raises(Exception, match="radix cache off only"):
        SGLangChunkGlueManagerV0516(dataclasses.replace(CONFIG, disable_radix_cache=False),
                                    load_sglang("0.5.16"))  # fmt: skip


def test_one_request_through_the_chunk_glue() -> None:
    """Two chunks, a decode, a finish: the chunk boundary is SGLang's
    ``ChunkCache.cache_unfinished_req`` (the row's first ``extend_range.end`` slots become the
    prefix; nothing is cached), the finish frees every slot and the row."""
    manager: Any = implementation("0.5.16").manager
    mgr = manager(CONFIG)
    mgr.new_req("a", list(range(1, 11)))
    mgr.extend(["a"], [6])
    req = mgr.reqs["a"]
    assert list(req.prefix_indices) == list(mgr.req_to_token_pool.read(req.req_pool_idx, 0, 6))
    glue = mgr._glue(req)
    assert isinstance(glue, ChunkGlueReqV0516) and glue.extend_range.end == 6
    mgr.extend(["a"])
    mgr.decode(["a"], [11])
    # the counters are the process's (a test run before this one counted too): compare
    counts = sum(mgr.glue_calls, start=type(mgr.glue_calls[0])())
    before = counts["common.release_kv_cache"]
    assert counts["common.maybe_cache_unfinished_req"] >= 1
    mgr.finish(["a"])
    counts = sum(mgr.glue_calls, start=type(mgr.glue_calls[0])())
    assert counts["common.release_kv_cache"] == before + 1
    assert req.req_pool_idx is None
    assert mgr.token_to_kv_pool_allocator.available_size() == 64


def test_a_radix_off_campaign_passes_and_runs_the_glue() -> None:
    result = run_machine("manager", reference_implementation(), implementation("0.5.16"), 3600.0,
                         seed=1, max_runs=16, config_drawer=radix_off)  # fmt: skip
    assert result.failure is None, result.failure.report
    for name in GLUE:
        assert result.coverage.get(name), (name, dict(result.coverage))


def test_a_leak_planted_in_the_chunk_caches_release_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunk = load_sglang("0.5.16").module("sglang.srt.mem_cache.chunk_cache").ChunkCache
    original = chunk.cache_finished_req

    def leaky(self: Any, req: Any, is_insert: bool = True, **kwargs: Any) -> None:
        """Planted: an aborted or retracted request's KV is not freed."""
        if is_insert:
            original(self, req, is_insert, **kwargs)

    monkeypatch.setattr(chunk, "cache_finished_req", leaky)
    result = run_machine("manager", reference_implementation(), implementation("0.5.16"), 3600.0,
                         seed=1, max_runs=60, config_drawer=radix_off)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector != "crash", report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 10, report
