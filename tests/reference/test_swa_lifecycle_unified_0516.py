"""SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` in the reference SWA lifecycle
(``Rules.swa_tree == "unified"``, set by ``Rules.for_sglang("0.5.16")``): worked examples of
the three ways its ``cache_finished_req`` / ``cache_unfinished_req`` hand-overs differ from
the legacy ``SWARadixCache``'s (kvpool's ``"swa_radix"``), and of the full eviction that
follows the configured policy (specs/sglang.md, "Sliding window (0.5.16's glue)")."""

from __future__ import annotations

import dataclasses

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.invariants import check_all
from kvpool.reference.lifecycle.swa_memory_manager import SWAMemoryManager
from kvpool.reference.lifecycle.swa_radix_lifecycle import (
    SWARadixLifecycle,
    UnifiedSWARadixLifecycle,
    UnifiedSWARadixLifecycleV0516,
)
from kvpool.reference.swa.tree_node import SWATreeNode
from kvpool.rules import Rules

OLD = Rules.for_sglang("0.5.16")
LEGACY = dataclasses.replace(OLD, swa_tree="swa_radix")
"""0.5.16's rules with kvpool's legacy pairing (its ``SWARadixCache`` and hand-overs)."""


def manager(rules: Rules, page_size: int = 1, policy: str = "lru", size: int = 64,
            ratio: float = 0.8, need_sort: bool = False) -> SWAMemoryManager:  # fmt: skip
    return SWAMemoryManager(PoolConfig(size=size, page_size=page_size, disable_radix_cache=False,
                                       sliding_window=2, swa_full_tokens_ratio=ratio,
                                       rules=rules, eviction_policy=policy,
                                       need_sort=need_sort))  # fmt: skip


def tree_type(mm: SWAMemoryManager) -> type[object]:
    """The class of ``mm``'s tree cache."""
    tree: object = mm.tree_cache
    return type(tree)


def nodes(mm: SWAMemoryManager) -> list[tuple[tuple[int, ...], bool]]:
    """The tree's nodes below the root (breadth-first): (key, tombstone)."""
    snap = mm.snapshot()
    check_all(snap)
    assert snap.tree is not None
    return [(n.key, n.swa_tombstone) for n in snap.tree.nodes[1:]]


def hits(node: SWATreeNode) -> list[tuple[tuple[int, ...], int]]:
    """(key, hit count) of ``node``'s descendants, depth-first in key order."""
    out: list[tuple[tuple[int, ...], int]] = []
    for child in sorted(node.children.values(), key=lambda n: list(n.key.token_ids)):
        out.append((tuple(child.key.token_ids), child.hit_count))
        out.extend(hits(child))
    return out


def test_the_0_5_16_preset_pairs_its_unified_tree() -> None:
    assert OLD.swa_tree == "unified"
    # kvpool's default and 0.5.23's preset are unchanged (0.5.23's "scheduler" rule always
    # pairs its own unified tree)
    assert Rules().swa_tree == Rules.for_sglang("0.5.23").swa_tree == "swa_radix"
    with pytest.raises(ConfigError, match="swa_tree"):
        Rules(swa_tree="bogus")
    assert tree_type(manager(OLD)) is UnifiedSWARadixLifecycleV0516
    assert tree_type(manager(LEGACY)) is SWARadixLifecycle
    assert tree_type(manager(Rules.for_sglang("0.5.23"))) is UnifiedSWARadixLifecycle
    # the tree follows 0.5.16's unified knobs
    tree = manager(OLD).tree_cache
    assert isinstance(tree, UnifiedSWARadixLifecycleV0516)
    assert tree.unified.rules.unified_tombstone_lock == "skip"


def test_an_abort_frees_its_row_in_one_free() -> None:
    """Page 2, need_sort: a 6-token prompt and one decode (7 committed tokens, full pages 1 to
    4), then an abort. 0.5.16's unified cache frees ``row[0:7]`` with one ``free``: the
    release pages are the sorted pages (1, 2, 3, 4); the legacy hand-over frees the aligned
    part and the tail apart, and the tail's page goes in front: (4, 1, 2, 3)."""
    expected = {OLD: (1, 2, 3, 4), LEGACY: (4, 1, 2, 3)}
    for rules, pages in expected.items():
        mm = manager(rules, page_size=2, size=32, need_sort=True)
        mm.new_req("a", [1, 2, 3, 4, 5, 6])
        mm.extend(["a"])
        mm.decode(["a"], [7])
        mm.abort("a")
        snap = mm.snapshot()
        check_all(snap)
        assert snap.swa is not None
        assert snap.swa.full.release_pages == pages, rules.swa_tree
        assert snap.swa.swa.release_pages == pages


def test_a_chunk_inserts_with_the_requests_window_cursor() -> None:
    """Page 1, window 2: a session turn of 6 tokens decodes twice (its second decode slides the
    window: cursor 7 - 2 = 5); the next turn's first chunk (two new tokens) is cached with that
    cursor: tokens 1 to 5 go in as a tombstone, the live rest is split at the window (6, 7, 8
    then the capped leaf 9, 10). The legacy hand-over inserts a chunk with cursor 0."""
    mm = manager(OLD)
    mm.open_session("s")
    mm.new_req("t1", [1, 2, 3, 4, 5, 6], session_id="s")
    mm.extend(["t1"])
    mm.decode(["t1"], [7])
    mm.decode(["t1"], [8])
    assert mm.swa_evicted_seqlen("t1") == 5
    mm.finish(["t1"])
    mm.new_req("t2", [9, 10, 11, 12], session_id="s")
    mm.extend(["t2"], [2])
    assert nodes(mm) == [((1, 2, 3, 4, 5), True), ((6, 7, 8), False), ((9, 10), False)]
    mm.extend(["t2"])
    mm.finish(["t2"])
    mm.close_session("s")
    check_all(mm.snapshot())


def test_a_chunk_counts_no_hit_and_a_finish_counts_one() -> None:
    """Page 1, window 2, LFU: a 6-token prompt in chunks of 4 and 2. The chunk's insert
    (``chunked``) counts no hit on its nodes; the finish's insert counts one on every node it
    walks and on its new leaf (0.5.16's ``_inc_hit_count``)."""
    mm = manager(OLD, policy="lfu")
    tree = mm.tree_cache
    assert isinstance(tree, UnifiedSWARadixLifecycleV0516)
    mm.new_req("a", [1, 2, 3, 4, 5, 6])
    mm.extend(["a"], [4])
    assert hits(tree.unified.root_node) == [((1, 2), 0), ((3, 4), 0)]
    mm.extend(["a"])
    mm.finish(["a"])
    assert hits(tree.unified.root_node) == [((1, 2), 1), ((3, 4), 1), ((5, 6), 1)]
    check_all(mm.snapshot())


def test_full_eviction_follows_the_policy() -> None:
    """A 12-token pool, MRU: two 4-token requests finish, then 3 tokens are evicted. The
    unified tree evicts the most recently used leaf first (b's, 4 tokens over two nodes: its
    window cap splits it); the legacy tree evicts least recently used (a's)."""
    expected = {
        OLD: [((1, 2), False), ((3, 4), False)],
        LEGACY: [((5, 6, 7, 8), False)],
    }
    for rules, left in expected.items():
        mm = manager(rules, policy="mru", size=12, ratio=1.0)
        for rid, tokens in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7, 8])):
            mm.new_req(rid, tokens)
            mm.extend([rid])
            mm.finish([rid])
        assert mm.evict(3) == 4
        assert nodes(mm) == left, rules.swa_tree
