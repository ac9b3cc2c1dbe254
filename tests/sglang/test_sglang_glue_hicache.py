"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's host tier inside the request lifecycle,
driven by its own scheduler glue (:mod:`kvpool.sglang.glue_hicache`) against kvpool's reference
lifecycle under ``Rules.hicache_host_tier == "unified"``: seeded campaigns restricted to host
configurations pass on both tree cores with demotions, load-backs and acknowledgements in the
coverage and the glue functions counted; a bug planted in SGLang's write acknowledgement (the
backup's lock is never dropped) is caught with a short trace marked reachable; the host tier
the pool snapshot builds from a step's tree and allocator snapshots equals a fresh read."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_hicache import SGLangHiCacheGlueManager
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.lifecycle import manager_factory
from kvpool.testing.swarm import Chooser, draw_config

pytestmark = pytest.mark.sglang_wheel

NEW = Rules.for_sglang("0.5.23")
GLUE = (
    "sglang:common.match_kv_cache",
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.checkpoint_kv_cache",
    "sglang:common.release_kv_cache",
)
HOST = ("host:to-host-only", "host:load-back", "host:write-issued", "hicache_ack_writes:acked")


def draw_host_config(c: Chooser) -> PoolConfig:
    """A lifecycle configuration with a host tier (the swarm's draw pinned to the radix cache
    and 3 rows, which :func:`~kvpool.testing.config_variants.host_tier_fields` applies to)."""
    return draw_config(c, host=True, rules=NEW, disable_radix_cache=False, req_pool_size=3)


def test_host_configurations_get_sglangs_host_tier_glue() -> None:
    candidate = implementation("0.5.23")
    assert candidate.manager is not None
    config = PoolConfig(size=16, page_size=1, req_pool_size=3, rules=NEW,
                        enable_hierarchical_cache=True)  # fmt: skip
    assert isinstance(manager_factory(candidate, True)(config), SGLangHiCacheGlueManager)
    stored = PoolConfig(size=16, page_size=1, req_pool_size=3, rules=NEW,
                        enable_hierarchical_cache=True, hicache_storage=True)  # fmt: skip
    assert not isinstance(manager_factory(candidate, True)(stored), SGLangHiCacheGlueManager)


@pytest.mark.parametrize("core", ["rust", "python"])
def test_host_tier_glue_campaign_passes_with_host_coverage(core: str) -> None:
    candidate = implementation("0.5.23", tree_core=core)
    # a load-back needs a host-only node that a later prompt reaches: about two in 40 runs,
    # none in seed 7's since the checkpoint rules' extends take shared prompts together
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=2,
                         max_runs=40, config_drawer=draw_host_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == 40 * 60
    missing = [t for t in GLUE + HOST if not result.coverage.get(t)]
    assert not missing, (missing, dict(result.coverage))


def test_a_lock_leak_planted_in_the_write_acknowledgement_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cls = load_sglang("0.5.23").module("sglang.srt.mem_cache.unified_radix_cache")
    unified = cls.UnifiedRadixCache

    def leaky_ack(self: Any, ack_id: int) -> None:
        """Planted: the write-through's node is published, its lock never dropped."""
        _, _, publish_node_ids = self.ongoing_write_through.pop(ack_id)
        self.tree_core.finish_write_through(publish_node_ids, ack_id)

    monkeypatch.setattr(unified, "_finish_write_through_ack", leaky_ack)
    result = run_machine("manager", reference_implementation(), implementation("0.5.23"), 3600.0,
                         seed=1, max_runs=40, config_drawer=draw_host_config)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector != "crash", report
    assert "hicache_ack_writes" in report, report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report


def test_the_host_tier_snapshot_built_from_the_steps_parts_equals_a_fresh_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lifecycle's pool snapshot hands the adapter the tree and allocator snapshots it just
    took (``host_snapshot_takes_parts``); at every step of a campaign the host tier built from
    them equals the one the adapter reads itself."""
    from kvpool.sglang.unified_hicache import SGLangUnifiedHiCache

    own = SGLangUnifiedHiCache.host_snapshot
    handed: list[bool] = []

    def compared(self: SGLangUnifiedHiCache, tree: Any = None, device: Any = None) -> Any:
        built = own(self, tree, device)
        handed.append(tree is not None and device is not None)
        assert built == own(self)
        return built

    monkeypatch.setattr(SGLangUnifiedHiCache, "host_snapshot", compared)
    result = run_machine("manager", reference_implementation(), implementation("0.5.23"), 3600.0,
                         seed=2, max_runs=6, config_drawer=draw_host_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert len(handed) >= 6 * 60 and all(handed)
