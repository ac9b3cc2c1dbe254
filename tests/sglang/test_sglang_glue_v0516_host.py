"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's scheduler glue with its host tier in lockstep
(:mod:`kvpool.sglang.glue_v0516_host`): the full-attention family's glue over 0.5.16's own
``HiRadixCache``, with the scheduler's calls into the tree (``check_hicache_events``,
``ready_to_load_host_cache``, ``flush_write_through_acks``, ``init_load_back`` under a
temporary device lock) made where 0.5.16's scheduler makes them; configurations the glue does
not drive (storage, ``+kvpool-lifecycle``) keep kvpool's lifecycle; a lock leak planted in
0.5.16's write acknowledgement is caught with a short trace marked reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_v0516 import glue_covers_v0516
from kvpool.sglang.glue_v0516_host import SGLangHiCacheGlueManagerV0516
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

OLD = Rules.for_sglang("0.5.16")
GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.evict_from_tree_cache",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:hiradix_cache.check_hicache_events",
    "sglang:hiradix_cache.ready_to_load_host_cache",
    "sglang:hiradix_cache.flush_write_through_acks",
    "sglang:hiradix_cache.init_load_back",
)
HOST = ("host:to-host-only", "host:load-back", "host:write-issued", "hicache_ack_writes:acked")
CONFIG = PoolConfig(size=32, page_size=4, req_pool_size=3, max_context_len=64, rules=OLD,
                    enable_hierarchical_cache=True, hicache_load_back_threshold=0)  # fmt: skip


def test_host_configurations_get_0_5_16s_host_tier_glue() -> None:
    manager: Any = implementation("0.5.16").manager
    assert glue_covers_v0516(CONFIG)
    assert isinstance(manager(CONFIG), SGLangHiCacheGlueManagerV0516)
    stored = dataclasses.replace(CONFIG, hicache_storage=True)
    assert not glue_covers_v0516(stored)
    assert not isinstance(manager(stored), SGLangHiCacheGlueManagerV0516)
    own: Any = implementation("0.5.16", glue=False).manager
    assert own is None  # +kvpool-lifecycle: the lifecycle machine builds kvpool's manager


def test_one_request_written_through_evicted_and_loaded_back() -> None:
    """Finish a request (its insert issues the write-through), acknowledge the writes (SGLang's
    event check unlocks the nodes), evict them to host, then a new request's admission loads
    them back through ``init_load_back`` and the next extend issues the load."""
    manager: Any = implementation("0.5.16").manager
    mgr = manager(CONFIG)
    common = mgr.glue_calls[1]  # the process's count of common.py's functions (shared)
    released = common["common.release_kv_cache"]
    tokens = list(range(1, 14))
    mgr.new_req("a", tokens)
    mgr.extend(["a"])
    mgr.decode(["a"], [20])
    mgr.finish(["a"])
    assert mgr.hicache_ack_writes(8) >= 1
    assert mgr.evict(32) == 12  # the three pages, now held on host only
    mgr.new_req("b", tokens)
    assert mgr.match_prefix("b") == 12  # loaded back from host
    assert mgr.host_glue["hiradix_cache.init_load_back"] == 1
    mgr.extend(["b"])
    assert mgr.hicache_ack_loads(1) == 1
    mgr.finish(["b"])
    assert common["common.release_kv_cache"] == released + 2
    assert mgr.host_glue["hiradix_cache.check_hicache_events"] == 2  # this manager's own
    assert mgr.host_glue["hiradix_cache.flush_write_through_acks"] == 1


def test_host_glue_campaign_passes_with_host_coverage() -> None:
    result = run_machine("hicache_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=7, max_runs=40)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [t for t in GLUE + HOST if not result.coverage.get(t)]
    assert not missing, (missing, dict(result.coverage))


def test_a_lock_leak_planted_in_the_write_acknowledgement_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    hiradix = load_sglang("0.5.16").module("sglang.srt.mem_cache.hiradix_cache").HiRadixCache
    original = hiradix._finish_write_through_ack

    def leaky_ack(self: Any, ack_id: int, *, release_lock: bool) -> None:
        """Planted: the written node is published, its write-through lock never dropped."""
        original(self, ack_id, release_lock=False)

    monkeypatch.setattr(hiradix, "_finish_write_through_ack", leaky_ack)
    result = run_machine("hicache_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=1, max_runs=40)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector != "crash", report
    assert "hicache_ack_writes" in report, report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
