"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's own scheduler glue in lockstep
(:mod:`kvpool.sglang.glue_manager`): ``alloc_for_extend``, ``alloc_for_decode``,
``checkpoint_kv_cache`` and ``release_kv_cache`` run on every lifecycle campaign against
0.5.23, over both tree cores and the legacy tree; the campaign's coverage names each glue
function that ran; a bug planted in SGLang's glue (the kind the field reported: a retract that
leaks its row's private slots) is caught with a short trace marked reachable."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.sglang import implementation, load_sglang
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation

pytestmark = pytest.mark.sglang_wheel

GLUE = (
    "sglang:allocation.alloc_for_extend",
    "sglang:allocation.alloc_req_slots",
    "sglang:allocation.write_cache_indices",
    "sglang:allocation.alloc_for_decode",
    "sglang:allocation.alloc_for_spec_decode",
    "sglang:common.checkpoint_kv_cache",
    "sglang:common.release_kv_cache",
    "sglang:common.free_kv_row_segments",
)


@pytest.mark.parametrize(
    "options", [{"tree_core": "rust"}, {"tree_core": "python"}, {"unified_lifecycle": False}]
)
def test_glue_campaign_passes_and_names_the_glue_that_ran(options: dict[str, Any]) -> None:
    candidate = implementation("0.5.23", **options)
    assert candidate.manager is not None and candidate.reachability is not None
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=23,
                         max_runs=12)  # fmt: skip
    assert result.failure is None, result.failure.report
    missing = [name for name in GLUE if not result.coverage.get(name)]
    assert not missing, missing


def test_kvpool_lifecycle_option_runs_no_glue() -> None:
    candidate = implementation("0.5.23", glue=False)
    assert candidate.manager is None
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=23,
                         max_runs=3)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert not [t for t in result.coverage if t.startswith("sglang:")]


def test_a_leak_planted_in_sglangs_glue_is_caught_and_reachable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    common = load_sglang("0.5.23").module("sglang.srt.mem_cache.common")
    original = common.release_kv_cache

    def leaky_release(req: Any, tree: Any, *, checkpoint: bool) -> None:
        """Planted: without a checkpoint (abort, retract) the row's private slots are not
        freed; the row, the lock and the record are released."""
        if checkpoint or not req.kv.holds_kv:
            original(req, tree, checkpoint=checkpoint)
            return
        tree.unlock(req.lock)
        req.lock = None
        tree.req_to_token_pool.free(req)
        req.kv.mark_kv_released()

    monkeypatch.setattr(common, "release_kv_cache", leaky_release)
    result = run_machine("manager", reference_implementation(), implementation("0.5.23"), 3600.0,
                         seed=1, max_runs=60)  # fmt: skip
    assert result.failure is not None
    report = result.failure.report
    assert result.failure.detector.startswith("INV-"), report
    assert "reachability: reachable through SGLang's scheduler glue" in report, report
    assert report.count("  step ") <= 8, report
