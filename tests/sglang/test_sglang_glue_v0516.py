"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's own scheduler glue in lockstep
(:mod:`kvpool.sglang.glue_v0516`): ``alloc_for_extend``, ``alloc_for_decode``,
``alloc_for_spec_decode``, ``maybe_cache_unfinished_req`` and ``release_kv_cache`` run on every
lifecycle campaign against 0.5.16 over its allocator, ``ReqToTokenPool`` and legacy
``RadixCache``; the stand-ins refuse fields 0.5.16 does not read; ``+kvpool-lifecycle`` runs no
glue; a leak planted in 0.5.16's release glue is caught with a short trace marked reachable."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.sglang import from_spec, implementation, load_sglang
from kvpool.sglang.glue_v0516 import (
    GlueBatchV0516,
    GlueReqV0516,
    KvRecords,
    SGLangGlueManagerV0516,
    glue_covers_v0516,
)
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_req_slots",
    "sglang:allocation.write_cache_indices",
    "sglang:allocation.alloc_token_slots",
    "sglang:allocation.alloc_paged_token_slots_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:allocation.alloc_paged_token_slots_decode",
    "sglang:allocation.alloc_for_spec_decode",
    "sglang:common.evict_from_tree_cache",
    "sglang:common.maybe_cache_unfinished_req",
    "sglang:common.release_kv_cache",
    "sglang:common._release_overallocated_kv_indices",
)


def test_glue_campaign_passes_and_names_the_glue_that_ran() -> None:
    candidate = implementation("0.5.16")
    assert candidate.manager is not None and candidate.reachability is not None
    # hybrid lifecycles too (kvpool.sglang.glue_v0516_mamba, tests/sglang/
    # test_sglang_glue_v0516_mamba.py)
    assert candidate.label.endswith("-glue") and candidate.manager_runs_hybrid
    # seed 1: the first 16 configurations reach every glue path, page size 1 included
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=1,
                         max_runs=16)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in GLUE if not result.coverage.get(name)]
    assert not missing, missing


def test_the_glue_manager_runs_where_the_glue_covers() -> None:
    manager: Any = implementation("0.5.16").manager
    config = PoolConfig(size=64, page_size=4, req_pool_size=4, max_context_len=64)
    assert glue_covers_v0516(config)
    assert isinstance(manager(config), SGLangGlueManagerV0516)
    # the radix cache off has its own manager (tests/sglang/test_sglang_glue_v0516_chunk.py), the
    # host tier too (tests/sglang/test_sglang_glue_v0516_host.py)
    off: tuple[dict[str, Any], ...] = ({"layerwise_loading": True},)
    for fields in off:
        other = dataclasses.replace(config, **fields)
        assert not glue_covers_v0516(other)
        assert not isinstance(manager(other), SGLangGlueManagerV0516)


def test_one_request_through_the_glue() -> None:
    """Extend in two chunks, decode, finish: SGLang's glue sets the row, the record and the
    allocated length, the chunk boundary inserts into SGLang's tree, the finish inserts the
    rest and frees the row and record."""
    manager: Any = implementation("0.5.16").manager
    mgr = manager(PoolConfig(size=64, page_size=4, req_pool_size=4, max_context_len=64))
    mgr.new_req("a", list(range(1, 11)))
    mgr.extend(["a"], [6])
    req = mgr.reqs["a"]
    assert req.req_pool_idx is not None and req.kv_allocated_len == 6
    assert mgr._records.holds(req)
    assert mgr.tree_cache.impl.total_size() == 4 and req.cache_protected_len == 4
    mgr.extend(["a"])
    mgr.decode(["a"], [11])
    assert req.kv_allocated_len == 11 == req.kv_committed_len
    counts = sum(mgr.glue_calls, start=type(mgr.glue_calls[0])())
    before = counts["common.release_kv_cache"]
    mgr.finish(["a"])
    counts = sum(mgr.glue_calls, start=type(mgr.glue_calls[0])())
    assert counts["common.release_kv_cache"] == before + 1
    assert not mgr._records.holds(req) and req.req_pool_idx is None
    assert mgr.tree_cache.impl.total_size() == 8  # the page-aligned 11 tokens
    assert mgr.token_to_kv_pool_allocator.available_size() == 64 - 8


def test_the_stand_ins_refuse_fields_0_5_16_does_not_read() -> None:
    modules = load_sglang("0.5.16")
    record_cls = modules.attr("sglang.srt.managers.schedule_batch", "ReqKvInfo")
    manager: Any = implementation("0.5.16").manager
    mgr = manager(PoolConfig(size=64, page_size=1, req_pool_size=4, max_context_len=64))
    mgr.new_req("a", [1, 2, 3])
    req = mgr.reqs["a"]
    records = KvRecords()
    glue = GlueReqV0516(req, records)
    with pytest.raises(AttributeError, match="does not map"):
        setattr(glue, "kv_committed_len", 3)  # noqa: B010 (a read-only field: SGLang never writes it)
    with pytest.raises(AttributeError, match="does not map"):
        _ = glue.mamba_pool_idx
    assert glue.kv is None
    glue.kv = record_cls(kv_allocated_len=3, swa_evicted_seqlen=0)  # SGLang's own dataclass
    assert records.holds(req) and req.kv_allocated_len == 3
    kv: Any = glue.kv
    kv.kv_allocated_len += 1
    assert req.kv_allocated_len == 4
    with pytest.raises(AttributeError, match="does not map"):
        _ = kv.swa_evicted_seqlen
    with pytest.raises(AttributeError, match="sliding window"):
        glue.kv = record_cls(kv_allocated_len=3, swa_evicted_seqlen=2)
    glue.kv = None
    assert not records.holds(req)
    batch = GlueBatchV0516([glue], mgr.req_to_token_pool.impl, mgr.tree_cache.impl)
    with pytest.raises(AttributeError):
        batch.hisparse_coordinator = None  # type: ignore[attr-defined]
    assert batch.for_decode([1], [3]).seq_lens_cpu.tolist() == [3]
    assert torch.equal(batch.req_pool_indices, torch.tensor([1]))


def test_kvpool_lifecycle_option_runs_no_glue() -> None:
    assert from_spec("0.5.16+kvpool-lifecycle").manager is None
    candidate = implementation("0.5.16", glue=False)
    assert candidate.manager is None
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=16,
                         max_runs=3)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert not [t for t in result.coverage if t.startswith("sglang:")]


def test_a_leak_planted_in_sglangs_release_glue_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.16").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def leaky_release(req: Any, tree: Any, is_insert: bool = True) -> None:
        """Planted: without an insert (abort, retract) the row's slots are not freed; the lock,
        the row and the record are released."""
        if is_insert or req.req_pool_idx is None:
            original(req, tree, is_insert=is_insert)
            return
        if req.last_node is not None:
            tree.dec_lock_ref(req.last_node)
        tree.req_to_token_pool.free(req)
        req.kv = None

    monkeypatch.setattr(common, "release_kv_cache", leaky_release)
    result = run_machine("manager", reference_implementation(), implementation("0.5.16"), 3600.0,
                         seed=1, max_runs=60)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector.startswith("INV-"), report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report


def test_a_release_that_keeps_the_kv_record_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: 0.5.16's release frees everything but leaves ``req.kv`` set (the record that
    must exist exactly while the request holds a row). kvpool drops its side of the record
    itself, so the manager checks SGLang's: ``INV-LENGTHS`` at the first release."""
    common = load_sglang("0.5.16").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def keeping_release(req: Any, tree: Any, is_insert: bool = True) -> None:
        held = req.kv is not None
        original(req, tree, is_insert=is_insert)
        if held and req.kv is None:  # a record set again after SGLang dropped it
            req.kv = SimpleNamespace(kv_allocated_len=0, swa_evicted_seqlen=0)

    monkeypatch.setattr(common, "release_kv_cache", keeping_release)
    result = run_machine("manager", reference_implementation(), implementation("0.5.16"), 3600.0,
                         seed=1, max_runs=20)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector == "INV-LENGTHS", report
    assert "kept request" in report and "KV record (req.kv)" in report, report
