"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` (the tree its
registry builds for a sliding-window model with the radix cache on) over its own
``SWATokenToKVPoolAllocator``, against kvpool's reference ``UnifiedSWARadixCache`` under
``Rules.for_sglang("0.5.16")`` in lockstep:

- the ``unified_swa_radix_cache`` machine at page size 1 and 16
  (``kvpool verify --sglang 0.5.16 --component unified_swa_radix_cache``);
- each 0.5.16 knob the machine reaches (``unified_free``, ``unified_split_recency``) set back
  to 0.5.23's value: the machine finds the difference (a planted bug, caught);
- the knob it does not reach (``unified_tombstone_lock``: a matched node's window never holds
  a tombstone), by a scripted lock on a leaf under a tombstone, as SGLang and the reference
  tell it;
- the adapter: kvpool's node numbers and uuids.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator as RefAlloc
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache as RefTree
from kvpool.rules import Rules
from kvpool.sglang.implementation import implementation
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.swa import SGLangSWAAllocator
from kvpool.sglang.unified16_swa_radix import SGLangUnified16SWARadixCache
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines import TARGETS
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.unified_swa import UnifiedSWARadixTarget, coarse_swa_tree

pytestmark = pytest.mark.sglang_wheel

RUNS = 10
NEW = Rules.for_sglang("0.5.23")


@pytest.mark.parametrize("page_size", [1, 16])
def test_unified_swa_machine_against_0516_passes(
    page_size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = TARGETS["unified_swa_radix_cache"]
    assert isinstance(target, UnifiedSWARadixTarget)
    monkeypatch.setattr(target, "page_sizes", (page_size,))
    candidate = implementation("0.5.16")
    assert candidate.unified_swa_radix_cache is not None
    result = run_machine("unified_swa_radix_cache", reference_implementation(), candidate,
                         3600.0, seed=16, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE["unified_swa_radix_cache"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["unified_swa_radix_cache"]) - 5, reached


@pytest.mark.parametrize("knob", ["unified_free", "unified_split_recency"])
def test_each_0516_knob_set_back_is_caught(knob: str) -> None:
    candidate = implementation("0.5.16")
    assert candidate.rules is not None
    lax = dataclasses.replace(candidate.rules, **{knob: getattr(NEW, knob)})
    result = run_machine("unified_swa_radix_cache", reference_implementation(),
                         dataclasses.replace(candidate, rules=lax), 3600.0, seed=1,
                         max_runs=200)  # fmt: skip
    assert result.failure is not None
    assert result.failure.detector == "lockstep-diff", result.failure.report
    assert result.failure.report.count("  step ") <= 8, result.failure.report


def _lock_over_a_tombstone(tree: Any, alloc: Any, key: Any) -> list[object]:
    """A 5-token insert whose first two tokens left the window (a tombstone above a 3-token
    leaf), a lock of the leaf with a 4-token window, its early release and its unlock."""
    out: list[object] = []
    slots = alloc.alloc(5)
    alloc.free_swa(slots[:2])
    out.append(tree.insert(key([1, 2, 3, 4, 5], None), slots, 0, 2))
    match = tree.match_prefix(key([1, 2, 3, 4, 5], None))
    out.append(match.last_device_node.node_id)  # the root: the window is short
    leaf = _node(tree, 1)
    out.append(tree.inc_lock_ref(leaf))
    out.append(coarse_swa_tree(tree.snapshot()))
    tree.dec_swa_lock_only(leaf, out[-2])
    out.append(coarse_swa_tree(tree.snapshot()))
    tree.dec_lock_ref(leaf, out[-3], skip_swa=True)
    out.append(coarse_swa_tree(tree.snapshot()))
    out.append(alloc.snapshot())
    return out


def _node(tree: Any, node_id: int) -> Any:
    """The node ``node_id`` of either side (SGLang's wrapped, the reference's itself)."""
    if isinstance(tree, SGLangUnified16SWARadixCache):
        nodes = [n for n, _ in tree.python_nodes() if tree.snapshot_id(int(n.id)) == node_id]
        return tree.node_ref(nodes[0])
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.node_id == node_id:
            return node
        stack.extend(node.children.values())
    raise AssertionError(node_id)


@pytest.mark.parametrize("rules", [Rules.for_sglang("0.5.16"), NEW])
def test_a_window_lock_over_a_tombstone(rules: Rules) -> None:
    modules = load_sglang("0.5.16")
    alloc = SGLangSWAAllocator(modules, 32, 32, 1)
    sglang = _lock_over_a_tombstone(SGLangUnified16SWARadixCache(modules, alloc, 1, 4), alloc,
                                    implementation("0.5.16").radix_key)  # fmt: skip
    ref_alloc = RefAlloc(32, 32, 1, rules=rules)
    ref_key = reference_implementation().radix_key
    ref = _lock_over_a_tombstone(RefTree(ref_alloc, 1, 4, rules=rules), ref_alloc, ref_key)
    locked = sglang[3]
    # SGLang skipped the tombstone: it holds no SWA lock, the window is not covered (no uuid)
    assert [(n.swa_tombstone, n.swa_lock_ref) for n in locked.nodes[1:]] == [  # type: ignore[attr-defined]
        (True, 0), (False, 1)]  # fmt: skip
    assert sglang[2] is None
    if rules.unified_tombstone_lock == "skip":
        assert ref == sglang
    else:  # 0.5.23's lock counts the tombstone: another uuid, another lock count
        assert (ref[2], ref[3] == sglang[3]) == (1, False)


def test_node_numbers_and_uuids_restart_per_cache() -> None:
    modules = load_sglang("0.5.16")
    key = implementation("0.5.16").radix_key
    assert key is not None
    seen = []
    for _ in range(2):  # a second cache numbers its nodes and uuids from 1 again
        alloc = SGLangSWAAllocator(modules, 32, 32, 1)
        tree = SGLangUnified16SWARadixCache(modules, alloc, 1, 2)
        tree.insert(key([1, 2, 3, 4], None), alloc.alloc(4))
        match = tree.match_prefix(key([1, 2, 3, 4], None))
        seen.append((match.last_device_node.node_id, tree.inc_lock_ref(match.last_device_node)))
        tree.reset()
        assert [n.node_id for n in tree.snapshot().nodes] == [0]
    assert seen == [(1, 1), (1, 1)]
