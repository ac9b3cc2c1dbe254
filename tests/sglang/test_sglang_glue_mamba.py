"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's scheduler glue for a hybrid (Mamba) model in
lockstep (:mod:`kvpool.sglang.glue_mamba`): a hybrid lifecycle over SGLang's own
``HybridReqToTokenPool``, allocator and FULL+MAMBA ``UnifiedRadixCache`` runs SGLang's
``alloc_req_slots`` / ``ensure_mamba_capacity`` and ``release_kv_cache``, checked step by step
against kvpool's reference hybrid lifecycle, with the radix cache off and on (copy-on-write in
``match_kv_cache`` and at admission, a finished request's state donated by its checkpoint,
cached states evicted by ``ensure_mamba_capacity``, the early free of a waiting request's
copy-on-write slot); a planted release that forgets the Mamba state is caught with a short
trace marked reachable."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_mamba import SGLangMambaGlueManager
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op, RandomChooser, draw_config

pytestmark = pytest.mark.sglang_wheel

RULES = Rules.for_sglang("0.5.23")

MAMBA_GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_req_slots",
    "sglang:allocation.ensure_mamba_capacity",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.checkpoint_kv_cache",
    "sglang:common.release_kv_cache",
)


def hybrid_config(c: RandomChooser) -> PoolConfig:
    """A hybrid configuration as the lifecycle campaign draws them under 0.5.23's rules (the
    radix cache off, ``need_sort``: a few Mamba slots, 0 to 2 track slots per request)."""
    config = draw_config(c, hybrid=True, rules=RULES, disable_radix_cache=True, need_sort=True)
    assert config.mamba_slots is not None
    return config


MAMBA_TREE_GLUE = (
    "sglang:common.match_kv_cache",
    "sglang:allocation.ensure_mamba_capacity",
    "sglang:common.checkpoint_kv_cache",
    "sglang:common.release_kv_cache",
    "sglang:mamba.cow_in_match",
    "sglang:mamba.cow_at_admission",
    "sglang:mamba.ensure_capacity_evicts",
    "sglang:mamba.checkpoint_donated",
)
"""The glue functions and Mamba paths (``SGLangMambaGlueManager.mamba_glue``) a campaign with
the tree on must take."""


def hybrid_tree_config(c: RandomChooser) -> PoolConfig:
    """A hybrid configuration with the radix cache on, as the lifecycle campaign draws them
    under 0.5.23's rules (page size 1, ``need_sort``: the unified FULL+MAMBA tree, LRU, three to
    seven Mamba slots, no track slots)."""
    config = draw_config(c, page_size=1, hybrid=True, rules=RULES, disable_radix_cache=False,
                         need_sort=True)  # fmt: skip
    assert config.mamba_slots is not None and not config.disable_radix_cache
    return config


def test_the_campaign_draws_hybrid_configurations_for_the_glue() -> None:
    candidate = implementation("0.5.23")
    assert candidate.manager is not None and candidate.manager_runs_hybrid
    config = hybrid_config(RandomChooser(3))
    manager = candidate.manager(config)
    assert isinstance(manager, SGLangMambaGlueManager)
    assert candidate.reachability is not None
    assert candidate.reachability(config, []).startswith("reachable")


@pytest.mark.parametrize("tree_core", ["rust", "python"])
def test_hybrid_glue_campaign_passes_and_counts_the_mamba_glue(tree_core: str) -> None:
    candidate = implementation("0.5.23", tree_core=tree_core)
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=19,
                         max_runs=8, config_drawer=hybrid_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in MAMBA_GLUE if not result.coverage.get(name)]
    assert not missing, missing
    assert result.coverage.get("session:hybrid-restore"), dict(result.coverage)


@pytest.mark.parametrize("tree_core", ["rust", "python"])
def test_hybrid_glue_with_the_tree_on_passes_and_takes_the_tree_paths(tree_core: str) -> None:
    candidate = implementation("0.5.23", tree_core=tree_core)
    assert candidate.manager is not None
    manager = candidate.manager(hybrid_tree_config(RandomChooser(3)))
    assert isinstance(manager, SGLangMambaGlueManager) and manager.tree_on
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=2,
                         max_runs=12, config_drawer=hybrid_tree_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in MAMBA_TREE_GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))
    assert result.coverage.get("mamba-radix:evicted"), dict(result.coverage)


def cached_request(rid: str, tokens: list[int]) -> list[Op]:
    """``rid`` runs ``tokens`` and finishes: its state is donated to the tree."""
    return [Op("new_req", (rid, tokens)), Op("extend", ([rid],)), Op("finish", ([rid],))]


@pytest.mark.parametrize("tree_core", ["rust", "python"])
def test_copy_on_write_with_no_free_slot_and_the_early_free_agree_with_the_reference(
    tree_core: str,
) -> None:
    """Two Mamba slots, both cached states: b's match finds no free slot, so SGLang's
    ``MambaComponent`` evicts the other state (its node locked meanwhile) for b's copy;
    aborting b while it waits frees that slot through ``release_kv_cache``'s early path.
    Then one state cached, one running request: c's match of the cached state finds no slot
    even by eviction (SGLang would assert; kvpool leaves c without one) and c's admission is
    refused (nothing changed), on both sides alike. Last, with both slots cached states again,
    d's admission has ``ensure_mamba_capacity`` evict one."""
    config = PoolConfig(size=32, req_pool_size=3, max_context_len=16, mamba_slots=2,
                        rules=RULES)  # fmt: skip
    ops = [
        *cached_request("a", [1, 2, 3]),
        *cached_request("x", [7, 7]),
        Op("new_req", ("b", [1, 2, 3, 4])),
        Op("match_prefix", ("b",)),
        Op("abort", ("b",)),
        Op("new_req", ("r", [5, 6])),
        Op("extend", (["r"],)),
        Op("new_req", ("c", [1, 2, 3, 4])),
        Op("match_prefix", ("c",)),
        Op("extend", (["c"],)),
        Op("abort", ("c",)),
        Op("finish", (["r"],)),
        *cached_request("d", [9, 9]),
    ]
    done = execute("manager", reference_implementation(), implementation("0.5.23",
                   tree_core=tree_core), config, ops=ops)  # fmt: skip
    assert done.failure is None, done.failure
    for tag in ("sglang:mamba.cow_after_match", "sglang:mamba.early_free",
                "sglang:mamba.ensure_capacity_evicts", "mamba-radix:refused"):  # fmt: skip
        assert done.coverage.get(tag), (tag, dict(done.coverage))


def test_a_release_that_forgets_the_mamba_state_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.23").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def forgetful_release(req: Any, tree: Any, *, checkpoint: bool) -> None:
        """Planted: without a checkpoint (abort, retract) the tree is not told of the release
        (``on_release``), so the request's Mamba slot (and track slots) never go back; the
        KV, the lock, the over-allocation and the row are released as SGLang does."""
        if checkpoint or not req.kv.holds_kv:
            original(req, tree, checkpoint=checkpoint)
            return
        owned = req.owned_kv_len()
        tree.free_kv_row(req.kv, [(req.kv.cache_protected_len, owned)])
        tree.unlock(req.lock)
        req.lock = None
        common._release_overallocated_kv_indices(req, owned, req.kv.kv_allocated_len, tree)
        tree.req_to_token_pool.free(req)
        req.kv.mark_kv_released()

    monkeypatch.setattr(common, "release_kv_cache", forgetful_release)
    result = run_machine("manager", reference_implementation(), implementation("0.5.23"), 3600.0,
                         seed=1, max_runs=30, config_drawer=hybrid_config)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector == "INV-MAMBA-ACCOUNTING", report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report


def test_an_early_free_that_leaks_the_copy_on_write_slot_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planted: ``release_kv_cache``'s early path (a waiting request holding a copy-on-write
    slot, no row) returns without freeing the slot (the field bug of a waiting request's slot
    leaked on abort): the Mamba accounting catches it at the abort."""
    common = load_sglang("0.5.23").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def leaky_release(req: Any, tree: Any, *, checkpoint: bool) -> None:
        if req.kv.holds_kv:
            original(req, tree, checkpoint=checkpoint)

    monkeypatch.setattr(common, "release_kv_cache", leaky_release)
    config = PoolConfig(size=32, req_pool_size=3, max_context_len=16, mamba_slots=3,
                        rules=RULES)  # fmt: skip
    ops = [*cached_request("a", [1, 2, 3]), Op("new_req", ("b", [1, 2, 3, 4])),
           Op("match_prefix", ("b",)), Op("abort", ("b",))]  # fmt: skip
    done = execute("manager", reference_implementation(), implementation("0.5.23"), config,
                   ops=ops)  # fmt: skip
    assert done.failure is not None and done.failure.detector == "INV-MAMBA-ACCOUNTING"
    assert done.failure.step == len(ops), done.failure
