"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's scheduler glue for a sliding-window model in
lockstep (:mod:`kvpool.sglang.glue_v0516_swa`): with the radix cache disabled, kvpool's SWA
lifecycle over 0.5.16's own SWA allocator, ``ReqToTokenPool`` and ``SWAChunkCache`` runs
0.5.16's ``alloc_for_extend`` / ``alloc_for_decode`` / ``alloc_for_spec_decode`` with its
``ScheduleBatch.maybe_evict_swa`` / ``_evict_swa`` (``common.free_swa_out_of_window_slots``),
``maybe_cache_unfinished_req`` and ``release_kv_cache``, checked step by step against kvpool's
reference SWA lifecycle under ``Rules.for_sglang("0.5.16")`` (``swa_window_release ==
"maybe_evict"``); with the radix cache on, 0.5.16's glue over its unified tree runs
(tests/sglang/test_sglang_glue_v0516_swa_radix.py); the stand-ins refuse fields 0.5.16 does
not read; a planted window slide that forgets its free is caught with a short trace marked
reachable."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_swa import SWAReqState
from kvpool.sglang.glue_v0516 import KvRecords
from kvpool.sglang.glue_v0516_swa import (
    SGLangSWAGlueManagerV0516,
    SWAGlueBatchV0516,
    SWAGlueReqV0516,
    glue_covers_v0516_swa,
)
from kvpool.sglang.glue_v0516_swa_radix import SGLangSWARadixGlueManagerV0516
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

RULES = Rules.for_sglang("0.5.16")
SWA_GLUE = (
    "sglang:schedule_batch.maybe_evict_swa",
    "sglang:schedule_batch._evict_swa",
    "sglang:common.free_swa_out_of_window_slots",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:common._release_overallocated_kv_indices",
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:allocation.alloc_for_spec_decode",
)
"""The SWA glue a campaign must have run (coverage tags ``sglang:MODULE.FUNCTION``)."""


def config(**fields: Any) -> PoolConfig:
    base = PoolConfig(size=64, page_size=1, req_pool_size=4, max_context_len=64,
                      disable_radix_cache=True, sliding_window=2, swa_full_tokens_ratio=0.25,
                      rules=RULES)  # fmt: skip
    return dataclasses.replace(base, **fields)


def test_the_swa_manager_is_0_5_16s_glue_with_the_radix_cache_off() -> None:
    candidate = implementation("0.5.16")
    assert candidate.swa_manager is not None and candidate.reachability is not None
    assert candidate.rules == RULES and RULES.swa_window_release == "maybe_evict"
    off = config()
    assert glue_covers_v0516_swa(off)
    assert isinstance(candidate.swa_manager(off), SGLangSWAGlueManagerV0516)
    assert candidate.reachability(off, []).startswith("reachable")
    # with the radix cache on, 0.5.16's glue over its unified tree
    # (tests/sglang/test_sglang_glue_v0516_swa_radix.py); kvpool's lifecycle only for what
    # the glue does not drive (here kvpool's legacy pairing, 0.5.16's SWARadixCache)
    on = config(disable_radix_cache=False)
    assert glue_covers_v0516_swa(on)
    assert type(candidate.swa_manager(on)) is SGLangSWARadixGlueManagerV0516
    legacy = config(disable_radix_cache=False,
                    rules=dataclasses.replace(RULES, swa_tree="swa_radix"))  # fmt: skip
    assert not glue_covers_v0516_swa(legacy)
    assert type(candidate.swa_manager(legacy)) is SWAMemoryManager  # kvpool's lifecycle
    assert candidate.reachability(legacy, []).startswith("direct only")


def test_one_request_through_the_glue_slides_at_0_5_16s_times() -> None:
    """Chunk cache, page 1, window 2, SWA pool 16: a 10-token prompt in chunks of 4, 4, 2
    (0.5.16's ``maybe_evict_swa`` slides the later chunks at their prefix: cursors 2, 6), three
    decodes (none at the first, then 9 and 10), an EAGLE v2 step (11); the finish frees every
    SWA slot still mapped. The reference under the same rules agrees at each step."""
    from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager as Reference

    cursors = []
    for mm in (SGLangSWAGlueManagerV0516(config(), load_sglang("0.5.16")), Reference(config())):
        mm.new_req("a", list(range(1, 11)))
        got: list[Any] = []
        for chunk in (4, 4, None):
            mm.extend(["a"], [chunk])
            got.append(mm.snapshot().reqs[0].swa_evicted_seqlen)
        for token in (11, 12, 13):
            mm.decode(["a"], [token])
            snap = mm.snapshot()
            assert snap.swa is not None
            got.append((snap.reqs[0].swa_evicted_seqlen, snap.swa.swa.available_size()))
        mm.spec_step(["a"], [[14]], 1)
        got.append(mm.snapshot().reqs[0].swa_evicted_seqlen)
        mm.finish(["a"])
        snap = mm.snapshot()
        assert snap.swa is not None
        got.append(snap.swa.swa.available_size())
        cursors.append(got)
    assert cursors[0] == cursors[1] == [0, 2, 6, (6, 11), (9, 13), (10, 13), 11, 16]


def test_swa_glue_campaign_passes_and_counts_the_swa_glue() -> None:
    candidate = implementation("0.5.16")
    result = run_machine("swa_manager", reference_implementation(), candidate, 3600.0, seed=7,
                         max_runs=16)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in SWA_GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))
    for tag in ("decode:window-slid", "spec_step:ok", "spec_step:window-slid", "extend:chunked"):
        assert result.coverage.get(tag), (tag, dict(result.coverage))


def test_the_stand_ins_refuse_fields_0_5_16_does_not_read() -> None:
    modules = load_sglang("0.5.16")
    record_cls = modules.attr("sglang.srt.managers.schedule_batch", "ReqKvInfo")
    mgr = SGLangSWAGlueManagerV0516(config(), modules)
    mgr.new_req("a", [1, 2, 3])
    req = mgr.reqs["a"]
    records, state = KvRecords(), SWAReqState()
    glue = SWAGlueReqV0516(req, records, state)
    # SGLang reads the floor with getattr(req, "swa_evict_floor", 0): it must stay unmapped
    assert getattr(glue, "swa_evict_floor", 0) == 0
    with pytest.raises(AttributeError, match="does not map"):
        _ = glue.swa_uuid_for_lock  # the radix path's field: 0.5.16's SWAChunkCache has none
    with pytest.raises(AttributeError, match="does not map"):
        glue.decode_batch_idx = 1  # type: ignore[misc]  # the scheduler's, not the glue's
    # a waiting request: no KV record; seqlen is the committed tokens plus the sampled one
    assert glue.kv is None and glue.seqlen == req.kv_committed_len + 1 == 1
    glue.kv = record_cls(kv_allocated_len=3, swa_evicted_seqlen=0)  # SGLang's own dataclass
    kv: Any = glue.kv
    kv.swa_evicted_seqlen = 2
    assert state.evicted == {"swa": 2} and kv.swa_evicted_seqlen == 2
    with pytest.raises(AttributeError, match="starts at 0"):
        glue.kv = record_cls(kv_allocated_len=3, swa_evicted_seqlen=2)
    with pytest.raises(AttributeError, match="does not map"):
        _ = kv.swa_evict_floor
    pool: Any = mgr.req_to_token_pool
    tree: Any = mgr.tree_cache
    batch = SWAGlueBatchV0516([glue], pool.impl, tree.impl, mgr._sb16)
    assert (batch.forward_iter, batch.enable_overlap) == (0, False)
    with pytest.raises(AttributeError):
        batch.hisparse_coordinator = None  # type: ignore[attr-defined]


def test_a_window_slide_that_forgets_its_free_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.16").module("sglang.srt.mem_cache.common")
    original = common.free_swa_out_of_window_slots

    class Forgetful:
        """The SWA allocator as the planted slide sees it: ``free_swa`` does nothing."""

        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def free_swa(self, free_index: Any) -> None:
            """Planted: the cursor moves on, the SWA slots behind it stay mapped (a leak)."""

    def forgetful_slide(req: Any, pre_len: int, **kwargs: Any) -> None:
        kwargs["token_to_kv_pool_allocator"] = Forgetful(kwargs["token_to_kv_pool_allocator"])
        original(req, pre_len, **kwargs)

    # ScheduleBatch._evict_swa looks the function up in common when it runs
    monkeypatch.setattr(common, "free_swa_out_of_window_slots", forgetful_slide)
    result = run_machine("swa_manager", reference_implementation(), implementation("0.5.16"),
                         3600.0, seed=1, max_runs=40)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector.startswith("INV-SWA"), report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
