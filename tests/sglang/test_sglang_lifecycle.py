"""Opt-in (``--run-sglang-wheel``): SGLang's ``RadixCache`` (with its allocator and
``ReqToTokenPool``) inside kvpool's request lifecycle, against kvpool's reference in lockstep
(``kvpool verify --sglang ... --component manager``), plus the adapter's key conversion.

- 0.5.16: a short lifecycle campaign and fixed traces (chunked prefill, release with and
  without insert, retraction, sessions) agree with the reference step by step;
- 0.5.23: the same, under its preset's release rules (``Rules.release_path="checkpoint"``,
  ``Rules.hit_count="inserted_len"``); each 0.5.23 release-path change (hits past
  ``cache_inserted_len``, the second match at release, the leaf split at the prompt, row
  segments freed in row order) has a minimal trace on which SGLang and the reference agree
  step by step and which asserts the effect;
- a kvpool finding, fixed: EAGLE v1's draft borrow leaked the pages an eviction freed between
  ``backup_state`` and ``restore_state``, which SGLang's eviction bound
  (``Rules.eviction_demand="bound"``) made happen (regression test in
  tests/reference/test_spec_decode.py).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import pytest
import torch

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.radix_key import RadixKey as TwinKey
from kvpool.reference.radix_key import RadixKey as RefKey
from kvpool.rules import Rules
from kvpool.sglang import SGLangModules, SGLangRadixCache, implementation, load_sglang
from kvpool.sglang.radix import to_sglang_key
from kvpool.testing.campaign import run_machine
from kvpool.testing.implementations import reference_implementation
from kvpool.testing.lockstep_driver import Lockstep
from kvpool.testing.machines.lifecycle import manager_factory
from kvpool.testing.swarm import Op

pytestmark = pytest.mark.sglang_wheel


@pytest.fixture(scope="module", params=("0.5.16", "0.5.23"))
def sgl(request: pytest.FixtureRequest) -> SGLangModules:
    return load_sglang(str(request.param))


def _ops(calls: Sequence[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> list[Op]:
    return [Op(name, args, tuple(kwargs.items())) for name, args, kwargs in calls]


def _pair(version: str, **config: Any) -> Lockstep:
    # the legacy RadixCache inside kvpool's own lifecycle (the unified cache and SGLang's glue
    # have their own suites: test_sglang_unified.py, test_sglang_glue.py)
    impl = implementation(version, unified_lifecycle=False, glue=False)
    cfg = PoolConfig(rules=Rules.for_sglang(version), **config)
    return Lockstep(
        manager_factory(reference_implementation()),
        manager_factory(impl),
        cfg,
        ("reference", impl.label),
    )


def _run(pair: Lockstep, ops: Sequence[Op]) -> None:
    for op in ops:
        pair.run(op)


# ---------------------------------------------------------------------------- keys
def test_keys_of_every_kind_reach_one_tree(sgl: SGLangModules) -> None:
    """kvpool's optimized key (array or list form), the reference's, SGLang's own and any
    object with ``token_ids``/``extra_key`` all become SGLang keys of ``array('q')``, so they
    match each other's inserts."""
    import numpy as np

    cls = sgl.attr("sglang.srt.mem_cache.radix_cache", "RadixKey")

    class Plain:
        token_ids = (1, 2, 3, 4, 5)
        extra_key = "ns"

    keys = [
        TwinKey(np.array([1, 2, 3, 4, 5], dtype=np.int32), "ns"),
        TwinKey([1, 2, 3, 4, 5], "ns"),
        RefKey([1, 2, 3, 4, 5], "ns"),
        cls(array("q", [1, 2, 3, 4, 5]), "ns"),
        Plain(),
    ]
    for key in keys:
        out = to_sglang_key(sgl, key)
        assert isinstance(out, cls) and out.extra_key == "ns"
        assert isinstance(out.token_ids, array) and out.token_ids.typecode == "q"
        assert list(out.token_ids) == [1, 2, 3, 4, 5]
    assert to_sglang_key(sgl, keys[3]) is keys[3]

    impl = implementation(sgl.version)
    config = PoolConfig(size=32, page_size=1, rules=Rules.for_sglang(sgl.version))
    pool = impl.req_to_token_pool(config)  # type: ignore[misc]
    alloc = impl.allocator(config)  # type: ignore[misc]
    tree = impl.radix_cache(config, pool, alloc)  # type: ignore[misc]
    assert isinstance(tree, SGLangRadixCache)
    slots = alloc.alloc(5)
    assert tree.insert(keys[0], slots) == 0
    for key in keys[1:]:
        assert tree.insert(key, slots) == 5  # the same tokens, whatever the key type
        assert tree.match_prefix(key).device_indices.tolist() == slots.tolist()
    assert tree.match_prefix(RefKey([1, 2, 3, 4, 5], None)).device_indices.tolist() == []


def test_walks_inside_request_methods_read_their_own_ticks(sgl: SGLangModules) -> None:
    """A chunk boundary inserts then matches again: two walks, two ticks, as the reference."""
    impl = implementation(sgl.version)
    config = PoolConfig(size=64, page_size=4, rules=Rules.for_sglang(sgl.version))
    mm = MemoryManager(
        config,
        token_to_kv_pool_allocator=impl.allocator,
        req_to_token_pool=impl.req_to_token_pool,
        tree_cache=impl.radix_cache,
    )
    twin = MemoryManager(config)
    for m in (mm, twin):
        m.new_req("r1", list(range(1, 14)))
        m.extend(["r1"], [9])  # match (tick 1), then cache_unfinished_req
    req = mm.reqs["r1"]
    assert req.cache_protected_len == 8 and req.is_chunked
    assert isinstance(req.prefix_indices, torch.Tensor) and len(req.prefix_indices) == 9
    assert req.prefix_indices.dtype == torch.int64
    assert req.last_node is not None and req.last_node.node_id == 1
    node = mm.snapshot().tree.nodes[1]
    assert node.last_access_time == 3.0  # inserted at tick 2, matched again at tick 3
    assert mm.tree_cache.snapshot().protected_size == 8
    assert mm.snapshot() == twin.snapshot()


# ---------------------------------------------------------------------------- campaigns
@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
def test_lifecycle_campaign(version: str) -> None:
    result = run_machine(
        "manager",
        reference_implementation(),
        implementation(version),
        seconds=120.0,
        seed=0,
        max_runs=25,
        labels=("reference", f"sglang-{version}"),
    )
    assert result.failure is None, result.failure.report if result.failure else ""
    assert result.configurations == 25 and result.steps > 1000
    for tag in ("extend:chunked", "finish:ok", "retract:ok", "session:restore"):
        assert result.coverage.get(tag, 0) > 0, tag


CHUNKED_RELEASE = [
    ("new_req", ("r1", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), {"extra_key": "a"}),
    ("new_req", ("r2", [1, 2, 3, 4, 5, 6, 7, 8, 9, 12]), {"extra_key": "a"}),
    ("extend", (["r1"],), {"chunk_sizes": [6]}),
    ("extend", (["r1"],), {"chunk_sizes": [None]}),
    ("decode", (["r1"], [7]), {}),
    ("extend", (["r2"],), {"chunk_sizes": [None]}),
    ("finish", (["r1"],), {"is_insert": True}),
    ("retract", ("r2",), {}),
    ("extend", (["r2"],), {"chunk_sizes": [5]}),
    ("decode", ([],), {"token_ids": []}),
    ("extend", (["r2"],), {}),
    ("finish", (["r2"],), {"is_insert": False}),
    ("evict", (8,), {}),
]

SESSION_TURNS = [
    ("open_session", ("s1",), {}),
    ("new_req", ("r1", [3, 1, 4, 1, 5, 9, 2]), {"session_id": "s1"}),
    ("extend", (["r1"],), {"chunk_sizes": [4]}),
    ("extend", (["r1"],), {}),
    ("decode", (["r1"], [6]), {}),
    ("finish", (["r1"],), {}),
    ("new_req", ("r2", [5, 3]), {"session_id": "s1"}),
    ("match_prefix", ("r2",), {}),
    ("abort", ("r2",), {}),
    ("new_req", ("r3", [5, 3, 5]), {"session_id": "s1"}),
    ("extend", (["r3"],), {}),
    ("finish", (["r3"],), {}),
    ("close_session", ("s1",), {}),
]


@pytest.mark.parametrize("version", ["0.5.16", "0.5.23"])
@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("calls", [CHUNKED_RELEASE, SESSION_TURNS], ids=["chunked", "session"])
def test_fixed_traces(calls: Any, page_size: int, version: str) -> None:
    pair = _pair(version, size=64, page_size=page_size, req_pool_size=4, max_context_len=32)
    _run(pair, _ops([c for c in calls if c[0] != "decode" or c[1][0]]))
    assert pair.snap_a == pair.snap_b


# ---------------------------------------------------------------------------- 0.5.23
def _agree(calls: Any, **config: Any) -> Any:
    """Run ``calls`` on SGLang 0.5.23 and the reference in lockstep (every step's snapshots
    equal); returns the reference's last snapshot."""
    pair = _pair("0.5.23", **config)
    _run(pair, _ops(calls))
    assert pair.snap_a == pair.snap_b
    return pair.snap_a


def _tree(snap: Any) -> dict[tuple[int, ...], Any]:
    return {n.key: n for n in snap.tree.nodes}


def test_0_5_23_checkpoint_reads_the_clock_again_at_release() -> None:
    """0.5.23's release inserts and then matches again (``checkpoint``): the leaf is stamped by
    the second walk (``Rules.release_path="checkpoint"``)."""
    calls = [
        ("new_req", ("r1", [1]), {"extra_key": "a"}),
        ("extend", (["r1"],), {"chunk_sizes": [1]}),
        ("finish", (["r1"],), {"is_insert": True}),
    ]
    snap = _agree(calls, size=20, page_size=1, req_pool_size=3, max_context_len=48)
    assert _tree(snap)[(1,)].last_access_time == 2.0


def test_0_5_23_splits_the_finished_leaf_at_the_prompt() -> None:
    """0.5.23 inserts the prompt again at release, splitting the leaf at the prompt boundary
    (the prompt part with priority + 1)."""
    calls = [
        ("new_req", ("r1", [1]), {"extra_key": "a"}),
        ("extend", (["r1"],), {"chunk_sizes": [1]}),
        ("decode", (["r1"], [2]), {}),
        ("finish", (["r1"],), {"is_insert": True}),
    ]
    nodes = _tree(_agree(calls, size=20, page_size=1, req_pool_size=3, max_context_len=48))
    assert set(nodes) == {(), (1,), (2,)}
    assert nodes[(1,)].priority == 1 and nodes[(2,)].priority == 0


def test_0_5_23_counts_hits_past_inserted_len() -> None:
    """0.5.23 counts a hit only past the request's ``cache_inserted_len``: a chunk boundary
    counts one (``Rules.hit_count="inserted_len"``; 0.5.16 counts none for a chunked insert)."""
    calls = [
        ("new_req", ("r1", [3, 1, 1, 1, 2, 2, 2, 3, 3, 3]), {"extra_key": "a"}),
        ("extend", (["r1"],), {"chunk_sizes": [9]}),
    ]
    snap = _agree(calls, size=64, page_size=4, req_pool_size=4, max_context_len=32)
    assert _tree(snap)[(3, 1, 1, 1, 2, 2, 2, 3)].hit_count == 1


def test_0_5_23_frees_row_segments_in_row_order() -> None:
    """0.5.23 frees a released row's pages with ``free_segment`` (in row order; 0.5.16's
    ``free`` sorts them), so they enter the free list in row order."""
    calls = [
        ("new_req", ("a", [7, 7, 7, 7]), {}),
        ("new_req", ("b", [7, 7, 7, 7]), {}),
        ("new_req", ("c", [7, 7, 7, 7]), {}),
        ("extend", (["a", "b", "c"],), {}),  # pages 1, 2, 3
        ("finish", (["a"],), {"is_insert": False}),
        ("finish", (["c"],), {"is_insert": False}),  # free list 3, 1, 4, ...
        ("new_req", ("d", [1, 2, 3, 4, 5, 6, 7, 8]), {}),
        ("extend", (["d"],), {}),  # row: page 3 then page 1
        ("finish", (["d"],), {"is_insert": False}),
    ]
    snap = _agree(calls, size=64, page_size=4, req_pool_size=4, max_context_len=32)
    assert snap.allocator.free_pages[:3] == (3, 1, 4)
