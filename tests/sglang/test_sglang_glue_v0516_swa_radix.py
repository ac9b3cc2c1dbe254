"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's scheduler glue for a sliding-window model
with the radix cache on, in lockstep (:class:`kvpool.sglang.glue_v0516_swa_radix.
SGLangSWARadixGlueManagerV0516`): kvpool's SWA lifecycle over 0.5.16's SWA allocator,
``ReqToTokenPool`` and its own FULL+SWA ``UnifiedRadixCache`` runs 0.5.16's
``alloc_for_extend`` / ``alloc_for_decode`` / ``alloc_for_spec_decode`` with its
``maybe_evict_swa``, and the cache's own ``cache_unfinished_req`` (``maybe_cache_unfinished_req``)
and ``cache_finished_req`` (``release_kv_cache``), checked step by step against kvpool's reference
SWA lifecycle under ``Rules.for_sglang("0.5.16")`` (``swa_tree == "unified"``:
``UnifiedSWARadixLifecycleV0516``); the stand-ins refuse fields 0.5.16 does not read; a planted
insert that forgets the request's window cursor is caught with a short trace marked
reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.invariants import check_all
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager as Reference
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_swa import SWAReqState
from kvpool.sglang.glue_v0516 import KvRecords
from kvpool.sglang.glue_v0516_swa import SGLangSWAGlueManagerV0516, glue_covers_v0516_swa
from kvpool.sglang.glue_v0516_swa_radix import (
    SGLangSWARadixGlueManagerV0516,
    SWARadixGlueReqV0516,
    _SWALock,
)
from kvpool.testing.campaign import CampaignResult, run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.swa_manager import SWALifecycleTarget
from kvpool.testing.swarm import RandomChooser

pytestmark = pytest.mark.sglang_wheel

RULES = Rules.for_sglang("0.5.16")
RADIX_GLUE = (
    "sglang:schedule_batch.maybe_evict_swa",
    "sglang:schedule_batch._evict_swa",
    "sglang:common.free_swa_out_of_window_slots",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:common.evict_from_tree_cache",
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:allocation.alloc_for_spec_decode",
    "sglang:unified_radix_cache.cache_finished_req",
    "sglang:unified_radix_cache.cache_unfinished_req",
    "sglang:unified_radix_cache.evict",
    "sglang:unified_radix_cache.inc_lock_ref",
    "sglang:unified_radix_cache.dec_lock_ref",
)
"""The glue and cache calls a radix-cache campaign must have made (coverage tags)."""


def config(**fields: Any) -> PoolConfig:
    base = PoolConfig(size=64, page_size=1, req_pool_size=4, max_context_len=64,
                      disable_radix_cache=False, sliding_window=2, swa_full_tokens_ratio=0.5,
                      rules=RULES)  # fmt: skip
    return dataclasses.replace(base, **fields)


def radix_campaign(seed: int, runs: int) -> CampaignResult:
    """The ``swa_manager`` machine against 0.5.16 on radix-cache configurations only."""
    candidate = implementation("0.5.16")
    target = SWALifecycleTarget()

    def radix_on(c: RandomChooser) -> PoolConfig:
        return dataclasses.replace(target.draw_config(c, candidate), disable_radix_cache=False)

    return run_machine("swa_manager", reference_implementation(), candidate, 3600.0, seed=seed,
                       max_runs=runs, config_drawer=radix_on)  # fmt: skip


def test_the_radix_on_swa_manager_is_0_5_16s_glue_over_its_unified_tree() -> None:
    candidate = implementation("0.5.16")
    assert candidate.swa_manager is not None and candidate.reachability is not None
    on = config()
    assert RULES.swa_tree == "unified" and glue_covers_v0516_swa(on)
    assert type(candidate.swa_manager(on)) is SGLangSWARadixGlueManagerV0516
    assert candidate.reachability(on, []).startswith("reachable")
    assert type(candidate.swa_manager(config(disable_radix_cache=True))) is (
        SGLangSWAGlueManagerV0516
    )
    # kvpool's legacy pairing (0.5.16's SWARadixCache, which its server never builds) is not
    # SGLang's: kvpool's lifecycle, direct only
    legacy = config(rules=dataclasses.replace(RULES, swa_tree="swa_radix"))
    assert not glue_covers_v0516_swa(legacy)
    assert type(candidate.swa_manager(legacy)) is SWAMemoryManager
    assert candidate.reachability(legacy, []).startswith("direct only")
    modules = load_sglang("0.5.16")
    with pytest.raises(ConfigError, match="swa_tree"):
        SGLangSWARadixGlueManagerV0516(legacy, modules)
    with pytest.raises(ConfigError, match="disable_radix_cache"):
        SGLangSWARadixGlueManagerV0516(config(disable_radix_cache=True), modules)


def test_one_request_through_the_unified_tree_agrees_with_the_reference() -> None:
    """Page 1, window 2, SWA pool 32: a 10-token prompt in chunks of 4, 4, 2 (each chunk
    cached by the unified ``cache_unfinished_req``), three decodes (cursor 0, then 9, 10), an
    EAGLE v2 step, the finish (the committed tokens inserted with the cursor: tokens 9 to 11
    become a tombstone, 12 and 13, 14 stay live leaves); a second request matching 8 tokens
    aborts (one free of its own columns). Tree, pools and cursors agree with the reference."""
    seen = []
    for mm in (
        SGLangSWARadixGlueManagerV0516(config(), load_sglang("0.5.16")),
        Reference(config()),
    ):
        got: list[Any] = []
        mm.new_req("a", list(range(1, 11)))
        for chunk in (4, 4, None):
            mm.extend(["a"], [chunk])
        for token in (11, 12, 13):
            mm.decode(["a"], [token])
            got.append(mm.snapshot().reqs[0].swa_evicted_seqlen)
        mm.spec_step(["a"], [[14]], 1)
        mm.finish(["a"])
        mm.new_req("b", [*range(1, 9), 50])
        mm.extend(["b"])
        mm.abort("b")
        snap = mm.snapshot()
        check_all(snap)
        assert snap.tree is not None and snap.swa is not None
        got.append([(n.key, n.swa_tombstone, n.lock_ref, n.swa_lock_ref)
                    for n in snap.tree.nodes[1:]])  # fmt: skip
        got.append((snap.swa.full.available_size(), snap.swa.swa.available_size(),
                    snap.tree.evictable_size, snap.tree.swa_evictable_size))  # fmt: skip
        seen.append(got)
    assert seen[0] == seen[1]
    assert seen[0][:3] == [0, 9, 10]
    assert [(key, tomb) for key, tomb, *_ in seen[0][3]] == [
        ((1, 2), False), ((3, 4), False), ((5, 6), False), ((7, 8), False),
        ((9, 10, 11), True), ((12,), False), ((13, 14), False)]  # fmt: skip


def test_a_locked_recovery_frees_the_incoming_full_slots_at_once() -> None:
    """``kvpool verify --sglang 0.5.16 --component swa_manager --seed 31`` (shrunk): r10's
    finish inserts over r7's prefix, whose SWA part the window evicted and whose full slots
    r7 still locks. 0.5.16 keeps the locked full slots, takes r10's SWA slots for them and
    frees r10's full slots on the full pool at once, though the finish's free group is open;
    the rest of r10 is freed at the group's end. The free lists agree, in order."""
    cfg = config(size=24, page_size=2, max_context_len=48, eviction_policy="fifo",
                 swa_full_tokens_ratio=0.8)  # fmt: skip
    seen = []
    for mm in (SGLangSWARadixGlueManagerV0516(cfg, load_sglang("0.5.16")), Reference(cfg)):
        mm.new_req("r7", [2, 3, 3, 3, 1, 2, 1, 1, 1], extra_key="b")
        mm.new_req("r10", [2, 3, 3, 3, 1, 2, 1, 1, 1, 3, 2], extra_key="b")
        mm.extend(["r10"])
        mm.extend(["r7"], [6])
        mm.extend(["r7"], [2])
        mm.finish(["r10"])
        snap = mm.snapshot()
        check_all(snap)
        assert snap.swa is not None
        seen.append((snap.swa.full.free_pages, snap.swa.swa.free_pages, snap.swa.full_to_swa))
    assert seen[0] == seen[1]
    # pages 1 and 2 (r10's first four full slots) went back first, pages 3, 4 and 6 at the end
    assert seen[0][0][:5] == (3, 4, 6, 1, 2)


def test_radix_glue_campaign_passes_and_counts_the_glue() -> None:
    # radix:recovered (a tombstoned node made live again) is rare: a seed whose 20 runs reach
    # it (runs are deterministic)
    result = radix_campaign(seed=2, runs=20)
    assert result.failure is None, result.failure.report
    missing = [name for name in RADIX_GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))
    for tag in ("decode:window-slid", "spec_step:window-slid", "radix:tombstoned",
                "radix:recovered", "extend:chunked"):  # fmt: skip
        assert result.coverage.get(tag), (tag, dict(result.coverage))


def test_the_stand_in_maps_the_lock_fields_and_refuses_the_rest() -> None:
    modules = load_sglang("0.5.16")
    mgr = SGLangSWARadixGlueManagerV0516(config(), modules)
    mgr.new_req("a", [1, 2, 3])
    req = mgr.reqs["a"]
    lock = _SWALock()
    tree: Any = mgr.tree_cache
    glue = SWARadixGlueReqV0516(req, KvRecords(), SWAReqState(), lock, tree._inserted, None,
                                tree.node_ref)  # fmt: skip
    assert (glue.swa_uuid_for_lock, glue.swa_prefix_lock_released) == (None, False)
    glue.swa_uuid_for_lock = 7
    glue.swa_prefix_lock_released = True
    assert (lock.uuid, lock.released) == (7, True)
    # last_node is SGLang's node object; kvpool keeps its numbered reference
    root = tree.impl.root_node
    glue.last_node = root
    assert glue.last_node is root
    assert req.last_node is not None and req.last_node.node_id == 0
    # 0.5.16 reads these with getattr defaults on other paths: they stay unmapped
    assert getattr(glue, "swa_evict_floor", 0) == 0
    with pytest.raises(AttributeError, match="does not map"):
        _ = glue.mamba_pool_idx
    with pytest.raises(AttributeError, match="does not map"):
        glue.decode_batch_idx = 1  # type: ignore[misc]


def test_an_insert_that_forgets_the_window_cursor_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modules = load_sglang("0.5.16")
    swa_component = modules.attr(
        "sglang.srt.mem_cache.unified_cache_components.swa_component", "SWAComponent"
    )

    def forgetful(self: Any, req: Any, insert_params: Any, token_ids_len: int,
                  is_finished: bool) -> None:  # fmt: skip
        """Planted: the insert carries no cursor, so the request's window-dead slots (their
        SWA slots freed) enter the tree as live SWA KV."""
        insert_params.swa_evicted_seqlen = 0

    monkeypatch.setattr(swa_component, "prepare_for_caching_req", forgetful)
    result = radix_campaign(seed=1, runs=40)
    assert result.failure is not None
    report = result.failure.report
    assert not result.failure.detector.startswith("crash"), report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
