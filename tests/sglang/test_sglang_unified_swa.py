"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's FULL+SWA ``UnifiedRadixCache`` over its own
``SWATokenToKVPoolAllocator``, over both tree cores, against kvpool's reference
``UnifiedSWARadixCache`` in lockstep, and against each other:

- the ``unified_swa_radix_cache`` machine, per core, at page size 1 and at page size 16
  (``kvpool verify --sglang 0.5.23 --component unified_swa_radix_cache [--tree-core python]``);
- the ``swa_allocator`` machine against 0.5.23's SWA allocator, and the knob it needs
  (``Rules.swa_free_unmapped``: without it the machine finds 0.5.23's ``free`` handing the
  sentinel slot to the SWA free list);
- SGLang's Python core against its Rust core, with no reference in between;
- the adapter: both cores give the same snapshot of one scripted history.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.unified_swa_radix import SGLangUnifiedSWARadixCache
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.unified_swa import UnifiedSWARadixTarget, coarse_swa_tree

pytestmark = pytest.mark.sglang_wheel

CORES = ("rust", "python")
RUNS = 10


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("core", CORES)
def test_unified_swa_machine_against_sglang_passes(
    core: str, page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = TARGETS["unified_swa_radix_cache"]
    assert isinstance(target, UnifiedSWARadixTarget)
    monkeypatch.setattr(target, "page_sizes", (page_size,))
    candidate = implementation("0.5.23", tree_core=core)
    result = run_machine("unified_swa_radix_cache", reference_implementation(), candidate,
                         3600.0, seed=23, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE["unified_swa_radix_cache"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["unified_swa_radix_cache"]) - 5, reached


def test_swa_allocator_campaign_against_0523_passes() -> None:
    candidate = implementation("0.5.23")
    result = run_machine("swa_allocator", reference_implementation(), candidate, 3600.0, seed=23,
                         max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.coverage.get("free:unmapped-slots", 0) > 0


def test_without_the_free_unmapped_knob_the_sentinel_is_freed() -> None:
    candidate = implementation("0.5.23")
    assert candidate.rules is not None and candidate.rules.swa_free_unmapped == "caller"
    lax = dataclasses.replace(candidate.rules, swa_free_unmapped="skip")
    result = run_machine("swa_allocator", reference_implementation(),
                         dataclasses.replace(candidate, rules=lax), 3600.0, seed=1,
                         max_runs=200)  # fmt: skip
    assert result.failure is not None
    assert result.failure.detector.startswith("INV-SWA-"), result.failure.report


def test_python_core_against_rust_core() -> None:
    python, rust = (implementation("0.5.23", tree_core=core) for core in ("python", "rust"))
    labels = ("sglang-python-core", "sglang-rust-core")
    result = run_machine("unified_swa_radix_cache", python, rust, 3600.0, seed=7,
                         max_runs=RUNS, labels=labels)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60


def _history(core: str) -> list[object]:
    modules = load_sglang("0.5.23")
    alloc = SGLangSWAAllocator(modules, 64, 64, 1)
    tree = SGLangUnifiedSWARadixCache(modules, alloc, 1, 3, tree_core=core)
    ref = reference_implementation()
    assert ref.radix_key is not None
    key = ref.radix_key
    out: list[object] = []
    slots = alloc.alloc(10)
    alloc.free_swa(slots[:2])
    out.append(tree.insert(key(list(range(1, 11)), None), slots, 0, 2))
    match = tree.match_prefix(key(list(range(1, 11)), None))
    out.append((match.device_indices.tolist(), match.last_device_node.node_id))
    out.append(tree.inc_lock_ref(match.last_device_node))
    out.append(tree.evict(0, 4))
    out.append(coarse_swa_tree(tree.snapshot(), swa_locks=False))
    out.append(alloc.snapshot())
    return out


def test_both_cores_tell_one_history_alike() -> None:
    rust, python = _history("rust"), _history("python")
    assert rust == python
    tree = rust[-2]
    # a 10-token insert, window 3, two tokens slid: tombstone (2), older part (5), leaf (3);
    # the SWA eviction of 4 tokens tombstoned the older part (least recently used, unlocked)
    assert [(len(n.key), n.swa_tombstone) for n in tree.nodes[1:]] == [  # type: ignore[attr-defined]
        (2, True), (5, True), (3, False)]  # fmt: skip
