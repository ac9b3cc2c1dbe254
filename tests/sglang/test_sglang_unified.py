"""Opt-in (``--run-sglang-wheel``): SGLang 0.5.23's own ``UnifiedRadixCache`` (FULL) over its
own allocator and ``ReqToTokenPool``, over both tree cores, against kvpool's reference
``UnifiedRadixCache`` in lockstep, and against each other:

- the ``unified_radix_cache`` machine, per core (``kvpool verify --sglang 0.5.23 --component
  unified_radix_cache [--tree-core python]``);
- the lifecycle, whose tree is the unified cache by default against 0.5.23 (as the server's);
- SGLang's Python core against its Rust core (``--oracle``), with no reference in between;
- the adapter: both cores give the same snapshot of one scripted history, kvpool's node ids,
  lock receipts, and the loader's choices (0.5.16 has no unified cache; a bad core is refused).
"""

from __future__ import annotations

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.rules import Rules
from kvpool.sglang import implementation, load_sglang
from kvpool.sglang.allocators import SGLangAllocator
from kvpool.sglang.implementation import from_spec
from kvpool.sglang.req_to_token import SGLangReqToTokenPool
from kvpool.sglang.unified_base import UnifiedNodeRef
from kvpool.sglang.unified_radix import SGLangUnifiedRadixCache
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.machines.coverage import CATALOGUE
from kvpool.testing.machines.unified import coarse_tree
from kvpool.testing.runs import execute
from kvpool.testing.swarm import Op

pytestmark = pytest.mark.sglang_wheel

CORES = ("rust", "python")
RUNS = 12


@pytest.mark.parametrize("core", CORES)
def test_unified_machine_against_sglang_passes(core: str) -> None:
    candidate = implementation("0.5.23", tree_core=core)
    result = run_machine("unified_radix_cache", reference_implementation(), candidate, 3600.0,
                         seed=23, max_runs=RUNS)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60
    reached = [t for t in CATALOGUE["unified_radix_cache"] if result.coverage.get(t)]
    assert len(reached) >= len(CATALOGUE["unified_radix_cache"]) - 3, reached


@pytest.mark.parametrize("core", CORES)
def test_lifecycle_on_the_unified_cache_passes(core: str) -> None:
    candidate = implementation("0.5.23", tree_core=core)
    assert candidate.unified_lifecycle and candidate.unified_radix_cache is not None
    result = run_machine("manager", reference_implementation(), candidate, 3600.0, seed=23,
                         max_runs=6)  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.coverage.get("finish:ok", 0) > 0


@pytest.mark.parametrize("spec", ["0.5.23", "0.5.23+python-core", "0.5.23+kvpool-lifecycle"])
def test_a_checkpoint_frees_each_nodes_duplicates(spec: str) -> None:
    """The shrunk trace of a campaign (``--impl sglang:0.5.23+kvpool-lifecycle --seed
    20261203``, run 97; specs/sglang.md, "Differences found against the reference"): r3's
    chunk duplicates two nodes that r2's chunks cached. SGLang's unified tree frees each
    node's duplicates with its own ``free_segment``; the reference freed them in one call."""
    config = PoolConfig(size=20, page_size=2, req_pool_size=3, max_context_len=48,
                        eviction_policy="filo", rules=Rules.for_sglang("0.5.23"))  # fmt: skip
    ops = [Op("new_req", ("r1", [2, 3, 3, 2, 2, 2, 2])),
           Op("new_req", ("r2", [3, 1, 1, 1, 2, 2, 1, 2, 3])),
           Op("new_req", ("r3", [3, 1, 1, 1, 2, 2, 1, 2, 3, 2])),
           Op("extend", (["r3", "r1", "r2"],), (("chunk_sizes", [1, 2, 5]),)),
           Op("extend", (["r2", "r3"],), (("chunk_sizes", [2, 5]),))]  # fmt: skip
    done = execute("manager", reference_implementation(), from_spec(spec), config, ops=ops)
    assert done.failure is None, done.failure and str(done.failure)
    assert done.steps == 5


def test_the_legacy_tree_option_keeps_a_hybrid_models_unified_tree() -> None:
    """``+legacy-tree`` gives the FULL lifecycle 0.5.23's legacy ``RadixCache``; a hybrid model
    keeps the FULL+MAMBA unified tree (0.5.23 removed the legacy Mamba tree), so the lockstep
    compares its snapshot as the unified lifecycle's (``coarse_hybrid``). Before, the first chunk
    failed on the Mamba tree's KV recency list, which the unified FULL component keeps none of
    (``--impl sglang:0.5.23+legacy-tree --seed 20261203``, run 1, 2 steps)."""
    rules = Rules.for_sglang("0.5.23")
    config = PoolConfig(size=16, page_size=1, req_pool_size=6, max_context_len=16,
                        need_sort=True, mamba_slots=4, rules=rules)  # fmt: skip
    ops = [Op("new_req", ("r1", [1, 2, 3, 3, 3, 2, 1, 1])),
           Op("extend", (["r1"],), (("chunk_sizes", [5]),))]  # fmt: skip
    legacy = from_spec("0.5.23+legacy-tree")
    assert not legacy.unified_lifecycle
    done = execute("manager", reference_implementation(), legacy, config, ops=ops)
    assert done.failure is None, done.failure and str(done.failure)
    result = run_machine("manager", reference_implementation(), legacy, 3600.0, seed=20261203,
                         max_runs=6)  # fmt: skip
    assert result.failure is None, result.failure.report


def test_python_core_against_rust_core() -> None:
    python, rust = (implementation("0.5.23", tree_core=core) for core in ("python", "rust"))
    result = run_machine("unified_radix_cache", python, rust, 3600.0, seed=7, max_runs=RUNS,
                         labels=("sglang-python-core", "sglang-rust-core"))  # fmt: skip
    assert result.failure is None, result.failure.report
    assert result.steps == RUNS * 60


def _cache(core: str, page_size: int = 1) -> tuple[SGLangUnifiedRadixCache, SGLangAllocator]:
    modules = load_sglang("0.5.23")
    alloc = SGLangAllocator(modules, 64, page_size, False)
    pool = SGLangReqToTokenPool(modules, 4, 64)
    return SGLangUnifiedRadixCache(modules, pool, alloc, page_size, tree_core=core), alloc


def _history(cache: SGLangUnifiedRadixCache, alloc: SGLangAllocator) -> list[object]:
    ref = reference_implementation()
    assert ref.radix_key is not None
    key = ref.radix_key
    out: list[object] = []
    for tokens in ([1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 7], [1, 2, 3, 4, 5, 6, 7], [1, 8]):
        out.append(cache.insert(key(tokens, None), alloc.alloc(len(tokens)), prev_prefix_len=0))
    match = cache.match_prefix(key([1, 2, 3, 4, 9], None))
    out.append(match.device_indices.tolist())
    out.append(cache.inc_lock_ref(match.last_device_node))
    out.append(cache.evict(3))
    out.append(coarse_tree(cache.snapshot()))
    out.append(cache.dec_lock_ref(match.last_device_node))
    out.append(coarse_tree(cache.snapshot()))
    return out


def test_both_cores_give_the_same_snapshots() -> None:
    python, rust = (_history(*_cache(core)) for core in CORES)
    assert python == rust
    tree = python[-1]
    ids = [n.node_id for n in tree.nodes]  # type: ignore[attr-defined]
    assert ids[0] == 0 and len(set(ids)) == len(ids) and min(ids[1:]) >= 1


@pytest.mark.parametrize("core", CORES)
def test_match_returns_a_node_ref_with_kvpools_id(core: str) -> None:
    cache, alloc = _cache(core)
    ref = reference_implementation()
    assert ref.radix_key is not None
    cache.insert(ref.radix_key([5, 6, 7], None), alloc.alloc(3), prev_prefix_len=0)
    # SGLang's total_size() is (full, aux): the adapter answers full tokens, as kvpool's tree
    assert cache.total_size() == 3 == cache.evictable_size() + cache.protected_size()
    match = cache.match_prefix(ref.radix_key([5, 6], None))  # splits: the upper half is id 2
    assert isinstance(match.last_device_node, UnifiedNodeRef)
    assert match.last_device_node.node_id == 2
    assert cache.inc_lock_ref(match.last_device_node) == -2
    assert cache.dec_lock_ref(match.last_device_node) == 2
    cache.reset()
    assert [n.node_id for n in cache.snapshot().nodes] == [0]


def test_loader_choices() -> None:
    assert implementation("0.5.16").unified_radix_cache is None
    assert not implementation("0.5.16").unified_lifecycle
    legacy = implementation("0.5.23", unified_lifecycle=False)
    assert legacy.unified_radix_cache is not None and not legacy.unified_lifecycle
    with pytest.raises(ConfigError, match="tree_core"):
        _cache("java")
    # what 0.5.23 removed is named, with where its behaviour went
    absent = dict(implementation("0.5.23").absent)
    assert set(absent) == {"mamba_radix_cache", "swa_radix_cache"}
    assert implementation("0.5.23").provides("swa_manager")  # the SWA glue (glue_swa.py)
    assert implementation("0.5.23").provides("hiradix_cache")  # the unified host tier
    assert "full,mamba" in absent["mamba_radix_cache"] and "full,swa" in absent["swa_radix_cache"]
    assert not implementation("0.5.16").absent
