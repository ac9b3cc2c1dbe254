"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's ``SWATokenToKVPoolAllocator`` and
``SWARadixCache`` in lockstep with kvpool's reference (specs/sglang.md, "Sliding-window
attention"), and the two SGLang defects the allocator campaign found, as fixed traces:

- ``restore_state`` puts back the free lists but not the mapping: the stale entries of a page
  the draft allocation used make a later ``free`` release another request's SWA page;
- ``alloc_decode`` runs both pools' decode before it looks at either result: the pages of the
  pool that fits are dropped when the other is short.

The campaigns pass only under SGLang's rules preset (``Rules.swa_free_resolve="group_end"``,
``swa_restore_mapping=False``, ``swa_decode_refusal_clean=False``); with kvpool's rules in their
place the machine finds the difference each knob stands for."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE

pytestmark = pytest.mark.sglang_wheel

RUNS = 12
"""Seeded runs per campaign (60 steps each)."""


@pytest.mark.parametrize("component", ["swa_allocator", "swa_radix_cache"])
def test_swa_campaign_against_sglang_0_5_16_passes(component: str) -> None:
    result = run_machine(component, reference_implementation(), implementation("0.5.16"),
                         seconds=3600.0, seed=16, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE[component] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE[component]) // 2, reached


def _with_rules(impl: Implementation, **knobs: Any) -> Implementation:
    return replace(impl, rules=replace(impl.rules_or_default(), **knobs))


@pytest.mark.parametrize(
    ("knobs", "detectors"),
    [
        ({"swa_free_resolve": "free"}, {"lockstep-diff"}),
        ({"swa_restore_mapping": True}, {"INV-SWA-FREE-UNMAPPED"}),
        ({"swa_decode_refusal_clean": True}, {"INV-TOKEN-ACCOUNTING", "lockstep-diff"}),
    ],
)
def test_each_swa_knob_stands_for_a_real_difference(
    knobs: dict[str, Any], detectors: set[str]
) -> None:
    candidate = _with_rules(implementation("0.5.16"), **knobs)
    result = run_machine("swa_allocator", reference_implementation(), candidate,
                         seconds=3600.0, seed=3, max_runs=200)  # fmt: skip
    assert result.failure is not None, "the campaign should find the difference"
    assert result.failure.detector in detectors, result.failure.report


def test_sglang_restore_leaves_a_stale_mapping_that_frees_another_requests_swa_page() -> None:
    modules = load_sglang("0.5.16")
    sgl = SGLangSWAAllocator(modules, 10, 10, 2, need_sort=True)
    ref = SWATokenToKVPoolAllocator(10, 10, 2, need_sort=True)
    held: dict[str, list[int]] = {}
    for name, alloc in (("sglang", sgl), ("reference", ref)):

        def extend(n: int, a: object = alloc) -> list[int]:
            got = a.alloc_extend([0], [0], [n], [n], [-1], n)  # type: ignore[attr-defined]
            return [int(x) for x in got]

        a_slots = extend(4)  # request A: full pages 1, 2 <-> SWA pages 1, 2
        alloc.free_swa(a_slots[:2])  # A's first page left the window: SWA page 1 staged
        state = alloc.backup_state()
        extend(4)  # a draft: full pages 3, 4 <-> SWA pages 1, 3 (the merge pulls page 1 in)
        alloc.restore_state(state)
        c_slots = extend(1)  # request C: full page 3 <-> SWA page 3
        d_slots = extend(4)  # request D: full pages 4, 5 <-> SWA pages 1, 4
        d_swa = [int(x) for x in alloc.translate_loc_from_full_to_swa(d_slots)]
        assert d_swa[:2] == [2, 3]  # D holds SWA page 1
        alloc.free(c_slots)  # C finishes
        held[name] = [int(p) for p in alloc.snapshot().swa.release_pages]
    # SGLang read the draft's entry for slot 7 (SWA slot 3) and released D's SWA page 1
    assert held["sglang"] == [1, 3]
    assert held["reference"] == [3]


def test_sglang_alloc_decode_drops_the_pages_of_the_pool_that_fits() -> None:
    modules = load_sglang("0.5.16")
    sgl = SGLangSWAAllocator(modules, 6, 4, 2, need_sort=True)
    ref = SWATokenToKVPoolAllocator(6, 4, 2, need_sort=True)
    for alloc in (sgl, ref):
        got: Any = alloc.alloc_extend([0], [0], [2], [2], [-1], 2)
        a = [int(x) for x in got]
        alloc.alloc_extend([0], [0], [2], [2], [-1], 2)
        assert alloc.full_available_size() == 2 and alloc.swa_available_size() == 0
        assert alloc.alloc_decode([3], [3], [a[-1]]) is None  # its third token: a new page
    assert sgl.full_available_size() == 0  # SGLang: the full page it took is gone
    assert ref.full_available_size() == 2  # kvpool: a refusal changes nothing
