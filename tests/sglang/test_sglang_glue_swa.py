"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's scheduler glue for a sliding-window model in
lockstep (:mod:`kvpool.sglang.glue_swa`): kvpool's SWA lifecycle over SGLang's own SWA allocator,
``ReqToTokenPool`` and FULL+SWA ``UnifiedRadixCache`` (or the disabled one) runs SGLang's
``alloc_for_extend`` / ``alloc_for_decode`` with ``ScheduleBatch.maybe_evict_swa`` (and an EAGLE
v2 step's, before ``alloc_for_spec_decode``), the tree's
``evict_sliding_windows`` (``common.free_swa_out_of_window_slots``), ``checkpoint_kv_cache``
and ``release_kv_cache`` (``free_kv_row_segments``), checked step by step against kvpool's
reference SWA lifecycle under ``Rules.for_sglang("0.5.23")``, on both tree cores; a planted
window slide that forgets its free is caught with a short trace marked reachable."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.glue_swa import SGLangSWAGlueManager
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.swa_manager import SWALifecycleTarget
from kvpool.testing.swarm import RandomChooser

pytestmark = pytest.mark.sglang_wheel

SWA_GLUE = (
    "sglang:schedule_batch.maybe_evict_swa",
    "sglang:schedule_batch._evict_swa",
    "sglang:common.free_swa_out_of_window_slots",
    "sglang:common.free_kv_row_segments",
    "sglang:common.checkpoint_kv_cache",
    "sglang:common.release_kv_cache",
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_for_decode",
    "sglang:allocation.alloc_for_spec_decode",
)
"""The SWA glue a campaign must have run (coverage tags ``sglang:MODULE.FUNCTION``)."""


def test_the_swa_manager_is_sglangs_glue_under_0_5_23s_rules() -> None:
    candidate = implementation("0.5.23")
    assert candidate.swa_manager is not None
    assert candidate.rules == Rules.for_sglang("0.5.23")
    config = SWALifecycleTarget().draw_config(RandomChooser(2), candidate)
    assert config.rules.swa_window_release == "scheduler"
    manager = candidate.swa_manager(config)
    assert isinstance(manager, SGLangSWAGlueManager)
    assert candidate.reachability is not None
    assert candidate.reachability(config, []).startswith("reachable")


@pytest.mark.parametrize("naive", [False, True], ids=["triton-kernels", "naive"])
def test_naive_reaches_the_swa_managers_allocators(naive: bool) -> None:
    """``+naive`` puts both paged allocators of the SWA lifecycle's allocator on SGLang's torch
    path (``use_triton_kernels = False``), as it does the FULL allocator's; without it they run
    their Triton kernels. A campaign passes either way."""
    candidate = implementation("0.5.23", naive_extend=naive)
    assert candidate.swa_manager is not None
    drawn = (SWALifecycleTarget().draw_config(RandomChooser(i), candidate) for i in range(64))
    config = next(c for c in drawn if c.page_size > 1)  # paged allocators
    alloc: Any = candidate.swa_manager(config).token_to_kv_pool_allocator
    subs = (alloc.impl.full_attn_allocator, alloc.impl.swa_attn_allocator)
    assert [sub.use_triton_kernels for sub in subs] == [not naive, not naive]
    standalone: Any = candidate.swa_allocator(config)  # type: ignore[misc]
    assert standalone.impl.full_attn_allocator.use_triton_kernels is not naive
    result = run_machine("swa_manager", reference_implementation(), candidate, 3600.0, seed=5,
                         max_runs=4)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == 4 * 60


@pytest.mark.parametrize("tree_core", ["rust", "python"])
def test_swa_glue_campaign_passes_and_counts_the_swa_glue(tree_core: str) -> None:
    candidate = implementation("0.5.23", tree_core=tree_core)
    result = run_machine("swa_manager", reference_implementation(), candidate, 3600.0, seed=5,
                         max_runs=16)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in SWA_GLUE if not result.coverage.get(name)]
    assert not missing, (missing, dict(result.coverage))
    # EAGLE v2 steps run, and eagle_prepare_for_decode's maybe_evict_swa slides windows there
    for tag in ("decode:window-slid", "spec_step:ok", "spec_step:window-slid"):
        assert result.coverage.get(tag), (tag, dict(result.coverage))
    assert result.coverage.get("radix:tombstoned"), dict(result.coverage)


def test_a_window_slide_that_forgets_its_free_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.23").module("sglang.srt.mem_cache.common")
    original = common.free_swa_out_of_window_slots

    def forgetful_slide(req: Any, pre_len: int, **kwargs: Any) -> None:
        """Planted: the window's cursor moves on but the SWA slots that left the window are
        never freed (a leak of SWA slots still mapped behind the cursor)."""
        kwargs["free_segment"] = lambda free_slots, start_pos=0: None
        original(req, pre_len, **kwargs)

    # the tree's evict_sliding_windows imports the function from common when it runs
    monkeypatch.setattr(common, "free_swa_out_of_window_slots", forgetful_slide)
    # every seed catches it; the seed is one whose first failing run does not need a session
    # (kvpool's own step, "direct only") to show the leak
    result = run_machine("swa_manager", reference_implementation(), implementation("0.5.23"),
                         3600.0, seed=2, max_runs=40)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector.startswith("INV-SWA"), report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
