"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.16's FULL+MAMBA ``UnifiedRadixCache`` (the tree
its registry builds for a hybrid Mamba model with the radix cache on) over its own
``HybridReqToTokenPool`` and token allocator, against kvpool's reference
``UnifiedMambaRadixCache`` under ``Rules.for_sglang("0.5.16")`` in lockstep:

- the ``unified_mamba_radix_cache`` machine
  (``kvpool verify --sglang 0.5.16 --component unified_mamba_radix_cache``);
- each 0.5.16 knob the tree follows (``unified_tombstone_lock``, ``unified_split_recency``) set
  back to 0.5.23's value: the machine finds the difference (a planted bug, caught);
- a scripted history with both (a lock on a tombstone leaf, a state stored there and evicted
  under the KV lock, a split), as SGLang and the reference tell it;
- the adapter: the server setting the MAMBA component reads, kvpool's node numbers.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from kvpool.sglang.implementation import implementation
from kvpool.sglang.loader import load_sglang
from kvpool.sglang.unified16_mamba_radix import SGLangUnified16MambaRadixCache
from kvpool.sglang.unified_mamba_radix import CHUNK_SIZE
from kvpool.testing.bundle import Implementation
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.unified_mamba import coarse_mamba_tree

pytestmark = pytest.mark.sglang_wheel

RUNS = 10
MACHINE = "unified_mamba_radix_cache"
OLD = Rules.for_sglang("0.5.16")
NEW = Rules.for_sglang("0.5.23")


def test_unified_mamba_machine_against_0516_passes() -> None:
    candidate = implementation("0.5.16")
    assert candidate.provides(MACHINE)
    result = run_machine(MACHINE, reference_implementation(), candidate, 3600.0, seed=16,
                         max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE[MACHINE] if result.coverage.get(t)]
    assert "lock_node:tombstone" in reached and "insert:revived-kv-locked" in reached, reached
    assert len(reached) >= len(CATALOGUE[MACHINE]) - 6, reached


@pytest.mark.parametrize("knob", ["unified_tombstone_lock", "unified_split_recency"])
def test_each_0516_knob_set_back_is_caught(knob: str) -> None:
    candidate = implementation("0.5.16")
    assert candidate.rules is not None
    lax = dataclasses.replace(candidate.rules, **{knob: getattr(NEW, knob)})
    result = run_machine(MACHINE, reference_implementation(),
                         dataclasses.replace(candidate, rules=lax), 3600.0, seed=1,
                         max_runs=200)  # fmt: skip
    assert result.failure is not None
    # the trees diverge; states evicted apart are caught by the model's checkpoint tags first
    assert result.failure.detector in ("lockstep-diff", "INV-MAMBA-CHECKPOINT"), (
        result.failure.report
    )
    assert result.failure.report.count("  step ") <= 8, result.failure.report


def _build(impl: Implementation, rules: Rules) -> tuple[Any, Any, Any]:
    """``impl``'s tree over its own pool (4 states) and 32 token slots, under ``rules``."""
    assert impl.hybrid_req_to_token_pool and impl.allocator and impl.unified_mamba_radix_cache
    config = PoolConfig(size=32, req_pool_size=4, max_context_len=16, mamba_slots=4,
                        rules=rules)  # fmt: skip
    pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
    return impl.unified_mamba_radix_cache(config, pool, kv), pool, kv


def _node(tree: Any, node_id: int) -> Any:
    finder = getattr(tree, "node_by_id", None)
    if finder is not None:
        return finder(node_id)
    stack = [tree.root_node]
    while stack:
        node = stack.pop()
        if node.node_id == node_id:
            return node
        stack.extend(node.children.values())
    raise AssertionError(node_id)


def _history(impl: Implementation, rules: Rules) -> list[object]:
    """[1 2] under [3 4]; [1 2]'s state evicted, then the leaf [3 4]: a tombstone leaf, locked;
    a state stored on it; a state eviction; the unlock; [5 6 7] and a match cutting it."""
    tree, pool, kv = _build(impl, rules)
    key = impl.radix_key
    assert key is not None

    def insert(tokens: list[int]) -> object:
        slot = pool.mamba_allocator.alloc(1)
        return tree.insert(key(tokens, None), kv.alloc(len(tokens)), int(slot[0]))

    out: list[object] = [insert([1, 2]), insert([1, 2, 3, 4]), tree.evict(0, 1), tree.evict(2, 0)]
    tomb = _node(tree, 1)
    tree.inc_lock_ref(tomb)
    out += [insert([1, 2]), coarse_mamba_tree(tree.snapshot()), tree.evict(0, 1)]
    out.append(coarse_mamba_tree(tree.snapshot()))
    tree.dec_lock_ref(tomb)
    out += [insert([5, 6, 7]), insert([8])]
    match = tree.match_prefix(key([5, 6, 9], None))
    out += [match.device_indices, match.last_device_node.node_id, tree.evict(0, 1)]
    out += [coarse_mamba_tree(tree.snapshot()), kv.snapshot(), pool.mamba_allocator.snapshot()]
    return out


@pytest.mark.parametrize("rules", [OLD, NEW])
def test_a_scripted_history(rules: Rules) -> None:
    sglang = _history(implementation("0.5.16"), OLD)
    ref = _history(reference_implementation(), rules)
    evicted = sglang[6]
    assert evicted == (0, 1)  # the state stored on the KV-locked tombstone leaf: evictable
    locked = sglang[7]
    rows = [(n.key, n.mamba_value, n.full_lock_ref, n.mamba_lock_ref)
            for n in locked.nodes[1:]]  # type: ignore[attr-defined]  # fmt: skip
    assert rows == [((1, 2), None, 1, 0)]  # a tombstone again, its KV still locked
    if rules is OLD:
        assert ref == sglang
    else:  # 0.5.23's lock counts the tombstone: the state stored there is protected
        assert ref[6] == (0, 0)


def test_server_setting_and_node_numbers() -> None:
    modules = load_sglang("0.5.16")
    impl = implementation("0.5.16")
    assert impl.hybrid_req_to_token_pool and impl.allocator and impl.radix_key
    component = modules.module("sglang.srt.mem_cache.unified_cache_components.mamba_component")
    config = PoolConfig(size=160, req_pool_size=4, max_context_len=128, mamba_slots=4,
                        rules=OLD)  # fmt: skip
    key, prompt = impl.radix_key, list(range(100, 100 + CHUNK_SIZE))
    seen = []
    for _ in range(2):  # a second cache numbers its nodes from 1 again
        pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
        tree = SGLangUnified16MambaRadixCache(modules, pool, kv)
        assert component.get_server_args().mamba_cache_chunk_size == CHUNK_SIZE
        for tokens in (prompt, [*prompt, 1, 2]):
            slot = int(pool.mamba_allocator.alloc(1)[0])
            tree.insert(key(tokens, None), kv.alloc(len(tokens)), slot)
        assert tree.evict(0, 1) == (0, 1)  # the prompt's state: an inner tombstone
        # a match that ends below its deepest state (the root) reads the chunk size for the
        # branching length: the matched tokens aligned down to it
        match = tree.match_prefix(key([*prompt, 3], None))
        seen.append((match.last_device_node.node_id, match.result.mamba_branching_seqlen,
                     [n.node_id for n in tree.snapshot().nodes]))  # fmt: skip
        tree.reset()
        assert [n.node_id for n in tree.snapshot().nodes] == [0]
    assert seen == [(0, CHUNK_SIZE, [0, 1, 2])] * 2
