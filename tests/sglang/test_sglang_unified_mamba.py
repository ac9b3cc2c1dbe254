"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's hybrid (Mamba) memory, in lockstep with
kvpool's reference:

- its own ``HybridReqToTokenPool`` / ``MambaPool`` / ``MambaSlotAllocator`` on the hybrid
  machine (``kvpool verify --sglang 0.5.23 --component hybrid_req_to_token_pool``), loaded with
  the CPU stand-ins of ``async_h2d`` and ``current_platform`` and SGLang's own
  ``get_mamba_tracking_slots``;
- its ``UnifiedRadixCache(tree_components=(FULL, MAMBA))`` over both tree cores on the
  ``unified_mamba_radix_cache`` machine, against kvpool's ``UnifiedMambaRadixCache``;
- its Python core against its Rust core (no reference in between);
- the adapter: both cores give the same snapshot of one scripted history (0.5.23's differences
  from 0.5.16 in it), and the runtime settings the MAMBA component reads.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.unified_mamba_radix import CHUNK_SIZE, SGLangUnifiedMambaRadixCache
from kvpool.snapshot import MambaTreeSnapshot
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.hybrid import MachineMambaReq
from kvpool.testing.machines.unified_mamba import coarse_mamba_tree

pytestmark = pytest.mark.sglang_wheel

CORES = ("rust", "python")
RUNS = 8
MACHINE = "unified_mamba_radix_cache"


def test_hybrid_pool_campaign_against_sglang_0_5_23_passes() -> None:
    candidate = implementation("0.5.23")
    assert candidate.provides("hybrid_req_to_token_pool")
    assert candidate.mamba_radix_cache is None  # 0.5.23 has no mamba_radix_cache.py
    result = run_machine("hybrid_req_to_token_pool", reference_implementation(), candidate,
                         3600.0, seed=23, max_runs=10)  # fmt: skip
    assert result.failure is None, result.failure.report
    reached = [t for t in CATALOGUE["hybrid_req_to_token_pool"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["hybrid_req_to_token_pool"]) // 2, reached


@pytest.mark.parametrize("core", CORES)
def test_unified_mamba_machine_against_sglang_passes(core: str) -> None:
    candidate = implementation("0.5.23", tree_core=core)
    assert candidate.provides(MACHINE)
    result = run_machine(MACHINE, reference_implementation(), candidate, 3600.0, seed=23,
                         max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE[MACHINE] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE[MACHINE]) // 2, reached


def test_python_core_against_rust_core() -> None:
    python, rust = (implementation("0.5.23", tree_core=core) for core in ("python", "rust"))
    result = run_machine(MACHINE, python, rust, 3600.0, seed=7, max_runs=RUNS,
                         labels=("sglang-python-core", "sglang-rust-core"))  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60


def _build(core: str) -> tuple[SGLangUnifiedMambaRadixCache, Any, Any, Any]:
    impl = implementation("0.5.23", tree_core=core)
    assert impl.hybrid_req_to_token_pool and impl.allocator and impl.radix_key
    config = PoolConfig(size=32, req_pool_size=4, max_context_len=16, mamba_slots=4,
                        rules=impl.rules_or_default())  # fmt: skip
    pool, kv = impl.hybrid_req_to_token_pool(config), impl.allocator(config)
    tree = SGLangUnifiedMambaRadixCache(impl_modules(), pool, kv, 1, tree_core=core)
    return tree, pool, kv, impl.radix_key


def impl_modules() -> Any:
    return load_sglang("0.5.23")


def _history(core: str) -> list[object]:
    tree, pool, kv, key = _build(core)
    out: list[object] = []
    for tokens in ([1, 2], [1, 2, 3, 4], [1, 2, 3, 4, 5], [7]):
        slot = pool.mamba_allocator.alloc(1)
        out.append(tree.insert(key(tokens, None), kv.alloc(len(tokens)), slot[0]))
    out.append(tree.evict(0, 1))  # [1 2]'s state: an inner tombstone
    out.append(tree.evict(1, 0))  # the leaf [5] and its state; [3 4] keeps its KV and state
    req = MachineMambaReq()
    match = tree.match_prefix(key([1, 2, 3, 4, 9], None), req, True)
    out.append((match.device_indices, match.last_device_node.node_id, match.cow_staged,
                req.mamba_pool_idx, req.mamba_cow_src_index))  # fmt: skip
    tree.inc_lock_ref(match.last_device_node)
    tomb = tree.node_by_id(1)  # the tombstone [1 2]
    tree.inc_lock_ref(tomb)
    out.append(coarse_mamba_tree(tree.snapshot()))
    tree.dec_lock_ref(tomb)
    tree.dec_lock_ref(match.last_device_node)
    out.append(tree.evict(0, 3))
    out.append(coarse_mamba_tree(tree.snapshot()))
    out.append((kv.snapshot(), pool.mamba_allocator.snapshot()))
    return out


def test_both_cores_give_the_same_snapshots() -> None:
    rust, python = _history("rust"), _history("python")
    assert rust == python
    locked = rust[7]
    assert isinstance(locked, MambaTreeSnapshot)
    rows = {n.key: (n.mamba_value, n.full_lock_ref, n.mamba_lock_ref) for n in locked.nodes[1:]}
    assert rows[(1, 2)] == (None, 2, 1)  # a locked tombstone: the Mamba lock counts it
    assert rows[(3, 4)] == (2, 1, 1)
    assert rust[8] == (3, 2)  # [7], then [3 4] whole: two states, no third to take
    final = rust[9]
    assert isinstance(final, MambaTreeSnapshot)
    assert [(n.key, n.mamba_value) for n in final.nodes[1:]] == [((1, 2), None)]  # kept KV


def test_runtime_settings_and_cores() -> None:
    modules = impl_modules()
    mamba = modules.module("sglang.srt.mem_cache.unified_cache.components.mamba")
    tree, *_ = _build("python")
    component = tree.impl._components_tuple[-1]
    assert mamba.__dict__["mamba_cache_chunk_size"]() == CHUNK_SIZE
    assert (component.mamba_cache_chunk_size, component.mamba_checkpoint_grid) == (64, 64)
    assert component.mamba_max_states_per_path == -1
    pool = modules.module("sglang.srt.mem_cache.memory_pool")
    assert pool.get_mamba_tracking_slots(extra_buffer=True, overlap=True) == 2  # SGLang's own
    with pytest.raises(ConfigError):
        SGLangUnifiedMambaRadixCache(modules, None, None, 1, tree_core="cpp")
