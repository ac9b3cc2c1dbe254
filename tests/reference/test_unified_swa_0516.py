"""Worked examples of SGLang 0.5.16's unified FULL+SWA tree in kvpool's ``UnifiedSWARadixCache``
(both twins): the three ``Rules`` knobs of its differences from 0.5.23's (split recency, window
locks skipping tombstones, plain frees), each shown against 0.5.23's value; the presets."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.errors import ConfigError
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator as OptAlloc
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache as OptTree
from kvpool.reference import radix_key as ref_key
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator as RefAlloc
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache as RefTree
from kvpool.rules import Rules

OLD = Rules.for_sglang("0.5.16")
NEW = Rules.for_sglang("0.5.23")
TWINS = ["reference", "optimized"]


def _tree(twin: str, rules: Rules, ps: int = 1, window: int = 2) -> tuple[Any, Any, Any]:
    """A tree over 32 full and 32 SWA tokens under ``rules``, its allocator, its key type."""
    if twin == "reference":
        alloc: Any = RefAlloc(32, 32, ps, rules=rules)
        return RefTree(alloc, ps, window, rules=rules), alloc, ref_key.RadixKey
    alloc = OptAlloc(32, 32, ps, rules=rules)
    return OptTree(alloc, ps, window, rules=rules), alloc, opt_key.RadixKey


def _keys(nodes: list[Any]) -> list[tuple[int, ...]]:
    return [tuple(n.key.token_ids) for n in nodes]


def test_the_presets() -> None:
    knobs = ("unified_free", "unified_split_recency", "unified_tombstone_lock")
    values = [tuple(getattr(r, k) for k in knobs) for r in (Rules(), NEW, OLD)]
    assert values == [("segment", "beside", "count")] * 2 + [("free", "front", "skip")]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_a_split_moves_both_halves_to_the_front_under_0516(twin: str, rules: Rules) -> None:
    tree, alloc, key = _tree(twin, rules, window=2)
    tree.insert(key([1, 2, 3, 4]), alloc.alloc(4))
    tree.insert(key([5, 6, 7, 8]), alloc.alloc(4))
    # each leaf capped at the 2-token window, its older part above it
    assert _keys(tree.swa_lru) == [(7, 8), (5, 6), (3, 4), (1, 2)]
    # the match cuts (5, 6) after one token; the window refresh then moves the upper half (5,)
    tree.match_prefix(key([5, 9]))
    expected = {
        # the upper half right behind the cut node (6,), which keeps its place
        "beside": [(5,), (7, 8), (6,), (3, 4), (1, 2)],
        # both to the front, the cut node first
        "front": [(5,), (6,), (7, 8), (3, 4), (1, 2)],
    }
    assert _keys(tree.swa_lru) == expected[rules.unified_split_recency]
    # SWA eviction from the least recent end: (1, 2) tombstoned (internal), the leaf (3, 4)
    # deleted whole, then (6,) tombstoned (0.5.23) or the leaf (7, 8) deleted (0.5.16)
    got = tree.evict(0, 5)
    assert got == {"beside": (2, 5), "front": (4, 6)}[rules.unified_split_recency]
    assert _keys(tree.swa_lru) == expected[rules.unified_split_recency][:2]


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_a_window_lock_skips_a_tombstone_under_0516(twin: str, rules: Rules) -> None:
    tree, alloc, key = _tree(twin, rules, window=4)
    slots = alloc.alloc(5)
    alloc.free_swa(slots[:2])
    tree.insert(key([1, 2, 3, 4, 5]), slots, 0, swa_evicted_seqlen=2)
    (upper,) = tree.root_node.children.values()
    (leaf,) = upper.children.values()
    uuid = tree.inc_lock_ref(leaf)
    locks = [(n.swa_tombstone, n.swa_lock_ref) for n in tree.snapshot().nodes[1:]]
    if rules.unified_tombstone_lock == "count":
        # the tombstone's two tokens complete the window: it is locked, and carries the uuid
        assert (locks, uuid) == ([(True, 1), (False, 1)], 1)
    else:
        # the tombstone is skipped and not counted: the window is not covered (no uuid)
        assert (locks, uuid) == ([(True, 0), (False, 1)], None)
    tree.dec_swa_lock_only(leaf, uuid)
    assert [n.swa_lock_ref for n in tree.snapshot().nodes[1:]] == [0, 0]
    tree.dec_lock_ref(leaf, uuid, skip_swa=True)
    snap = tree.snapshot()
    assert (snap.protected_size, snap.swa_protected_size, snap.swa_evictable_size) == (0, 0, 3)


@pytest.mark.parametrize("twin", TWINS)
def test_an_unlock_passes_over_counts_at_zero_under_0516(twin: str) -> None:
    tree, alloc, key = _tree(twin, OLD, window=2)
    tree.insert(key([1, 2, 3, 4]), alloc.alloc(4))  # (1, 2) above the capped leaf (3, 4)
    match = tree.match_prefix(key([1, 2, 3, 4]))
    uuid = tree.inc_lock_ref(match.last_device_node)
    assert [n.swa_lock_ref for n in tree.snapshot().nodes[1:]] == [0, 1] and uuid == 1
    # the window part released early, then the unlock forgets skip_swa: 0.5.16 walks on to
    # the root over counts at 0 (0.5.23 refuses: LockError)
    tree.dec_swa_lock_only(match.last_device_node, uuid)
    tree.dec_lock_ref(match.last_device_node, uuid)
    snap = tree.snapshot()
    assert [n.swa_lock_ref for n in snap.nodes[1:]] == [0, 0]
    assert (snap.protected_size, snap.swa_evictable_size, snap.swa_protected_size) == (0, 4, 0)


class _Calls:
    """The SWA allocator calls a tree makes (method name, slots)."""

    def __init__(self, alloc: Any) -> None:
        self.seen: list[tuple[str, list[int]]] = []
        for name in ("free", "free_full", "free_swa", "free_segment", "free_full_segment",
                     "free_swa_segment"):  # fmt: skip
            setattr(alloc, name, self._wrap(name, getattr(alloc, name)))

    def _wrap(self, name: str, method: Any) -> Any:
        def call(slots: Any, *args: Any) -> Any:
            self.seen.append((name, [int(s) for s in slots]))
            return method(slots, *args)

        return call


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("rules", [NEW, OLD])
def test_the_tree_frees_with_plain_frees_under_0516(twin: str, rules: Rules) -> None:
    tree, alloc, key = _tree(twin, rules, window=2)
    first = alloc.alloc(4)
    tree.insert(key([1, 2, 3, 4]), first)
    second = alloc.alloc(4)
    alloc.free_swa(second[:2])  # the request's first two tokens left the window
    calls = _Calls(alloc)
    tree.insert(key([1, 2, 3, 4]), second, 0, swa_evicted_seqlen=2)  # all duplicates
    tree.evict(4)
    dup = [int(s) for s in second]
    old = [int(s) for s in first]
    if rules.unified_free == "segment":
        # per node walked, split at the window cursor; evicted leaves by segment
        assert calls.seen == [("free_full_segment", dup[:2]), ("free_segment", dup[2:]),
                              ("free_segment", old[2:]), ("free_segment", old[:2])]  # fmt: skip
    else:
        assert calls.seen == [("free", dup[:2]), ("free", dup[2:]),
                              ("free", old[2:]), ("free", old[:2])]  # fmt: skip
    assert (alloc.full_available_size(), alloc.swa_available_size()) == (32, 32)


@pytest.mark.parametrize("twin", TWINS)
def test_an_evicted_tombstone_leaf_is_freed_full_side_only_under_0516(twin: str) -> None:
    tree, alloc, key = _tree(twin, OLD, window=2)
    slots = alloc.alloc(4)
    alloc.free_swa(slots)
    tree.insert(key([1, 2, 3, 4]), slots, 0, swa_evicted_seqlen=4)  # a tombstone leaf
    calls = _Calls(alloc)
    assert tree.evict(1) == (4, 0)
    assert calls.seen == [("free_full", [int(s) for s in slots])]
    tree.insert(key([5, 6]), alloc.alloc(2))
    assert tree.evict(0, 1) == (2, 2)  # an unlocked SWA leaf is deleted whole: one free
    assert [c[0] for c in calls.seen] == ["free_full", "free"]


@pytest.mark.parametrize("knob", ["unified_free", "unified_split_recency",
                                  "unified_tombstone_lock"])  # fmt: skip
def test_rules_refuse_unknown_knob_values(knob: str) -> None:
    with pytest.raises(ConfigError, match=knob):
        Rules(**{knob: "bogus"})  # type: ignore[arg-type]
