"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's scheduler glue for a hybrid (Mamba) model
with the radix cache on, in lockstep (:class:`~kvpool.sglang.glue_v0516_mamba_radix.
SGLangMambaRadixGlueManagerV0516`): 0.5.16's glue over its FULL+MAMBA ``UnifiedRadixCache``
against kvpool's reference under ``Rules.for_sglang("0.5.16")`` (the unified tree with 0.5.16's
release). The routing, one request through chunks and a finish beside the reference, the
stand-in's fields, a seeded campaign reaching every glue and cache call, and a planted state
leak in 0.5.16's MAMBA component caught with a short trace marked reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_v0516 import KvRecords
from kvpool.sglang.glue_v0516_mamba_radix import (
    MambaRadixGlueReqV0516,
    SGLangMambaRadixGlueManagerV0516,
    _LockFields,
)
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.lifecycle import without_kv_order
from kvpool.testing.swarm import Op, RandomChooser, draw_config

pytestmark = pytest.mark.sglang_wheel

OLD = Rules.for_sglang("0.5.16")
CONFIG = PoolConfig(size=64, page_size=1, req_pool_size=4, max_context_len=64, rules=OLD,
                    mamba_slots=5, disable_radix_cache=False)  # fmt: skip
GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_req_slots",
    "sglang:allocation.alloc_for_decode",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:unified_radix_cache.cache_finished_req",
    "sglang:unified_radix_cache.cache_unfinished_req",
    "sglang:unified_radix_cache.evict",
    "sglang:unified_radix_cache.inc_lock_ref",
    "sglang:unified_radix_cache.dec_lock_ref",
    "sglang:mamba.cow_in_match",
    "sglang:mamba.cow_at_admission",
    "sglang:mamba.state_donated",
    "sglang:mamba.headroom_evicts",
    "sglang:mamba.early_free",
)


def radix_config(c: RandomChooser) -> PoolConfig:
    """A hybrid configuration with the radix cache on, without layer-wise loading (the glue's)."""
    config = draw_config(c, page_size=1, hybrid=True, rules=OLD, disable_radix_cache=False,
                         need_sort=True)  # fmt: skip
    return dataclasses.replace(config, layerwise_loading=False)


def test_the_radix_cache_on_routes_to_0_5_16s_glue_over_its_unified_tree() -> None:
    candidate = implementation("0.5.16")
    assert candidate.manager is not None
    mgr = candidate.manager(CONFIG)
    assert isinstance(mgr, SGLangMambaRadixGlueManagerV0516)
    assert type(mgr.glue_tree.impl).__name__ == "UnifiedRadixCache"
    assert mgr.glue_tree.impl.supports_mamba()
    assert candidate.reachability is not None
    ops = [Op("new_req", ("r1", [1, 2, 3])), Op("extend", (["r1"],)), Op("finish", (["r1"],))]
    assert candidate.reachability(CONFIG, ops).startswith("reachable")


def test_requests_through_the_glue_as_the_reference_tells_it() -> None:
    """a: two chunks (a copy of its state cached at the first), a decode, a finish (its own
    state donated); b matches a's prompt (a copy-on-write) and aborts; both sides agree."""
    glue: Any = implementation("0.5.16").manager(CONFIG)  # type: ignore[misc]
    ref = MemoryManager(CONFIG)
    for mm in (glue, ref):
        mm.new_req("a", list(range(1, 11)))
        mm.extend(["a"], [6])
        mm.extend(["a"])
        mm.decode(["a"], [11])
        mm.finish(["a"])
        mm.new_req("b", [*range(1, 12), 13])
        assert mm.match_prefix("b") == 11
        mm.extend(["b"])
        mm.abort("b")
    assert without_kv_order(glue.snapshot()) == without_kv_order(ref.snapshot())
    assert check_all(glue.snapshot()) > 0
    calls = glue.glue_tree.calls
    assert calls["unified_radix_cache.cache_unfinished_req"] == 1
    assert calls["unified_radix_cache.cache_finished_req"] == 2
    assert glue.mamba_glue["mamba.state_donated"] == 1
    assert glue.mamba_glue["mamba.cow_in_match"] == 1


def test_the_stand_in_maps_the_lock_fields_and_refuses_the_rest() -> None:
    mgr: Any = implementation("0.5.16").manager(CONFIG)  # type: ignore[misc]
    mgr.new_req("a", [1, 2, 3])
    req = mgr.reqs["a"]
    lock = _LockFields()
    glue = MambaRadixGlueReqV0516(req, KvRecords(), lock)
    assert glue.swa_uuid_for_lock is None and glue.swa_prefix_lock_released is False
    glue.swa_uuid_for_lock, glue.swa_prefix_lock_released = 7, True
    assert (lock.uuid, lock.released) == (7, True)
    glue.mamba_last_track_seqlen = None  # the MAMBA component's cleanup after a chunk
    with pytest.raises(AttributeError):
        glue.mamba_last_track_seqlen = 3
    for name in ("mamba_last_track_seqlen", "mamba_cow_src_index", "swa_evict_floor", "seqlen"):
        with pytest.raises(AttributeError, match="does not map"):
            getattr(glue, name)
    glue.mamba_pool_idx = torch.tensor(2)
    assert req.mamba_pool_idx == 2


def test_radix_campaign_passes_and_reaches_every_glue_path() -> None:
    result = run_machine("mamba_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=2, max_runs=60, config_drawer=radix_config)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))


def test_a_state_leak_planted_in_0_5_16s_mamba_component_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    component = load_sglang("0.5.16").attr(
        "sglang.srt.mem_cache.unified_cache_components.mamba_component", "MambaComponent"
    )
    original = component.cleanup_after_caching_req

    def leaky_cleanup(self: Any, req: Any, is_finished: bool, insert_result: Any = None,
                      insert_params: Any = None) -> None:  # fmt: skip
        """Planted: a finished request whose end node already caches a state keeps its own
        state slot (never freed)."""
        if is_finished and insert_result is not None and insert_result.mamba_exist:
            return
        original(self, req, is_finished, insert_result, insert_params)

    monkeypatch.setattr(component, "cleanup_after_caching_req", leaky_cleanup)
    result = run_machine("mamba_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=1, max_runs=60, config_drawer=radix_config)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector != "crash", report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert "INV-MAMBA-ACCOUNTING" in report, report
    assert report.count("  step ") <= 11, report
