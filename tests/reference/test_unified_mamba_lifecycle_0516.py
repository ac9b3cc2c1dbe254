"""A hybrid model with the radix cache on under SGLang 0.5.16's rules: the lifecycle's tree is
0.5.16's FULL+MAMBA unified tree (``Rules.mamba_tree == "unified"``) with 0.5.16's release
(``release_path == "finished_req"``: :class:`~kvpool.reference.unified.mamba_release.
UnifiedMambaLifecycleCacheV0516`). Worked examples against 0.5.23's release over the same tree:
a finish donating the state, a chunk's copy and second match, an abort freeing the request's
own KV and slot, and admission keeping 0.5.16's headroom of three slots per request (0.5.23
evicts only the shortfall)."""

from __future__ import annotations

import dataclasses

from kvpool.config import PoolConfig
from kvpool.invariants import check_all
from kvpool.invariants.mamba import tree_checkpoints
from kvpool.reference.lifecycle.memory_manager import MemoryManager
from kvpool.reference.unified.mamba_release import UnifiedMambaLifecycleCacheV0516
from kvpool.rules import Rules
from kvpool.snapshot import PoolSnapshot
from kvpool.tags import mamba_state_tag

RULES = Rules.for_sglang("0.5.16")
RULES_0523_RELEASE = dataclasses.replace(RULES, release_path="checkpoint")
"""0.5.16's tree knobs with 0.5.23's release (the pairing the 0.5.23 preset uses)."""


def manager(rules: Rules = RULES, slots: int = 4) -> MemoryManager:
    return MemoryManager(PoolConfig(size=64, req_pool_size=4, max_context_len=32,
                                    mamba_slots=slots, rules=rules))  # fmt: skip


def snap(mm: MemoryManager) -> PoolSnapshot:
    s = mm.snapshot()
    assert check_all(s) > 0
    assert s.mamba is not None and s.mamba.tree is not None and s.mamba.tree.unified
    return s


def cached(mm: MemoryManager) -> dict[int, int]:
    """Cached state slot -> the tag of its node's path."""
    tree = snap(mm).mamba.tree  # type: ignore[union-attr]
    assert tree is not None
    return dict(tree_checkpoints(tree))


def free_slots(mm: MemoryManager) -> tuple[int, ...]:
    s = snap(mm)
    assert s.mamba is not None
    return tuple(s.mamba.pool.mamba_allocator.free_slots)


def finished(mm: MemoryManager, rid: str, tokens: list[int]) -> None:
    mm.new_req(rid, tokens)
    mm.extend([rid])
    mm.finish([rid])


def test_the_0_5_16_preset_pairs_the_unified_tree_with_its_release() -> None:
    assert (RULES.mamba_tree, RULES.release_path) == ("unified", "finished_req")
    assert isinstance(manager().tree_cache, UnifiedMambaLifecycleCacheV0516)
    assert Rules.for_sglang("0.5.23").mamba_tree == "unified"
    assert Rules().mamba_tree == "mamba_radix"


def test_a_finish_donates_the_state_and_an_abort_frees_its_own() -> None:
    mm = manager()
    finished(mm, "a", [1, 2, 3])  # slot 1 becomes the state of [1, 2, 3]
    assert cached(mm) == {1: mamba_state_tag([1, 2, 3])}
    assert free_slots(mm) == (2, 3, 4)
    # b matches [1, 2, 3] (its own copy in slot 2), computes past it, then aborts: its KV past
    # the tree's part goes back with one free, its slot after the unlock
    mm.new_req("b", [1, 2, 3, 4, 5])
    assert mm.match_prefix("b") == 3
    mm.extend(["b"])
    mm.abort("b")
    assert cached(mm) == {1: mamba_state_tag([1, 2, 3])}
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    assert s.mamba.tree.full_protected_size == 0 and s.mamba.tree.mamba_protected_size == 0
    assert sorted(free_slots(mm)) == [2, 3, 4]


def test_a_chunk_copies_the_state_and_matches_again() -> None:
    mm = manager(slots=6)
    mm.new_req("c", [1, 2, 3, 4, 5, 6])
    mm.extend(["c"], [3])  # the chunk [1, 2, 3]: a fresh slot (2) receives a copy of c's (1)
    assert cached(mm) == {2: mamba_state_tag([1, 2, 3])}
    s = snap(mm)
    assert s.mamba is not None and s.mamba.tree is not None
    [node] = [n for n in s.mamba.tree.nodes[1:]]
    # the second match found the chunk's node: c's lock is there, its row names the tree's slots
    assert (node.key, node.full_lock_ref, node.mamba_lock_ref) == ((1, 2, 3), 1, 1)
    req = mm.reqs["c"]
    assert req.cache_protected_len == 3 and req.mamba_pool_idx == 1
    mm.extend(["c"])
    mm.finish(["c"])  # c's own slot becomes the state of the whole sequence
    assert cached(mm) == {2: mamba_state_tag([1, 2, 3]), 1: mamba_state_tag([1, 2, 3, 4, 5, 6])}


def test_admission_keeps_0_5_16_s_headroom() -> None:
    # two cached states, two free slots; a new request needs one slot
    old, new = manager(), manager(RULES_0523_RELEASE)
    for mm in (old, new):
        finished(mm, "a", [1, 2])
        finished(mm, "b", [5, 6])
        assert free_slots(mm) == (3, 4)
        mm.new_req("d", [8, 8])
        mm.extend(["d"])
    # 0.5.16's alloc_req_slots wants three free per request: one state goes (the least recently
    # used, a's); 0.5.23's ensure_mamba_capacity evicts only a shortfall (none)
    assert cached(old) == {2: mamba_state_tag([5, 6])}
    assert cached(new) == {1: mamba_state_tag([1, 2]), 2: mamba_state_tag([5, 6])}
