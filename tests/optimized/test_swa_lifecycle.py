"""A request on a hybrid sliding-window model, on both twins in lockstep: prefill in both pools,
decode steps that release the SWA slots of the pages that left the window
(``free_swa_out_of_window_slots``), then the finish through ``SWAChunkCache`` (which frees each
pool exactly what it still holds) or through ``SWARadixCache.insert`` (the slid prefix becomes
a tombstone) with eviction by full and SWA deficits (``evict_for_swa_alloc``). Every step checks
the SWA invariants with the exact SWA holdings, and both twins' states must be equal."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from kvpool import optimized as opt_pkg
from kvpool import reference as ref_pkg
from kvpool.constants import ceil_align
from kvpool.invariants import check_swa_allocator
from kvpool.optimized import radix_key as opt_key
from kvpool.optimized import req as opt_req
from kvpool.optimized.pools import req_to_token_pool as opt_table
from kvpool.optimized.swa import allocator as opt_alloc
from kvpool.optimized.swa import chunk_cache as opt_chunk
from kvpool.optimized.swa import lifecycle as opt_life
from kvpool.optimized.swa import radix_cache as opt_tree
from kvpool.reference import radix_key as ref_key
from kvpool.reference import req as ref_req
from kvpool.reference.pools import req_to_token_pool as ref_table
from kvpool.reference.swa import allocator as ref_alloc
from kvpool.reference.swa import chunk_cache as ref_chunk
from kvpool.reference.swa import lifecycle as ref_life
from kvpool.reference.swa import radix_cache as ref_tree

TWINS: dict[str, tuple[ModuleType, ...]] = {
    "reference": (ref_pkg, ref_alloc, ref_table, ref_chunk, ref_life, ref_tree, ref_key, ref_req),
    "optimized": (opt_pkg, opt_alloc, opt_table, opt_chunk, opt_life, opt_tree, opt_key, opt_req),
}


def run(twin: str, ps: int, window: int, finish: str) -> list[Any]:
    _, alloc_mod, table_mod, chunk_mod, life, tree_mod, key_mod, req_mod = TWINS[twin]
    opt = twin == "optimized"
    idx = (lambda v: torch.tensor(v, dtype=torch.int64)) if opt else list
    alloc = alloc_mod.SWATokenToKVPoolAllocator(64, 32, ps)
    table = table_mod.ReqToTokenPool(4, 64)
    req = req_mod.Req("r", list(range(1, 8)))
    table.alloc([req])
    row_id = req.req_pool_idx
    trace: list[Any] = []

    def grow(n_old: int, n_new: int) -> None:
        if ps == 1:
            slots = alloc.alloc(n_new - n_old)
        elif n_old == 0:
            slots = alloc.alloc_extend(idx([0]), [0], idx([n_new]), [n_new], idx([-1]), n_new)
        else:
            last = table.read(row_id, n_old - 1, n_old)
            slots = alloc.alloc_decode(idx([n_new]), [n_new], idx(list(last)))
        assert slots is not None
        table.write((row_id, slice(n_old, n_new)), slots)

    def check(evicted: int, n: int, tree: Any = None) -> None:
        snap = alloc.snapshot()
        row = [int(s) for s in table.read(row_id, 0, n)] if n else []
        held = {s // ps for s in row}
        swa_tokens = ceil_align(n, ps) - evicted
        if tree is not None:
            t = tree.snapshot()
            held |= {s // ps for node in t.nodes for s in node.value}
            swa_tokens = t.swa_evictable_size + t.swa_protected_size
        check_swa_allocator(snap, held, swa_tokens, tree.snapshot() if tree else None)
        trace.append(("step", evicted, snap))

    grow(0, 7)
    evicted, n = 0, 7
    check(evicted, n)
    chunk = finish == "chunk"
    for _ in range(12):  # decode 12 tokens
        row = table.read(row_id, 0, n)
        evicted = life.free_swa_out_of_window_slots(
            idx(list(row)) if opt else row, evicted, n, 0, window, ps, alloc, chunk
        )
        grow(n, n + 1)
        n += 1
        check(evicted, n)
    req.output_ids = list(range(8, n + 1))  # the decoded tokens: committed <= the request's
    req.kv_committed_len = n
    req.cache_protected_len = 0
    if chunk:
        cache = chunk_mod.SWAChunkCache(table, alloc, ps, window)
        cache.cache_finished_req(req)
        assert cache.evict(5) == 0
        trace.append(alloc.snapshot())
        assert alloc.full_available_size() == 64 and alloc.swa_available_size() == 32
        return trace
    tree = tree_mod.SWARadixCache(alloc, ps, window)
    tokens = list(range(1, n + 1))
    row = table.read(row_id, 0, n)
    aligned = n // ps * ps
    tree.insert(key_mod.RadixKey(tokens[:aligned]), row[:aligned], 0, evicted)
    alloc.free(row[aligned:n])
    check(evicted, 0, tree)
    trace.append(life.evict_for_swa_alloc(tree, alloc, 40))
    check(evicted, 0, tree)
    trace.append(life.evict_for_swa_alloc(tree, alloc, 64))
    trace.append(alloc.snapshot())
    assert alloc.full_available_size() == 64 and alloc.swa_available_size() == 32
    return trace


@pytest.mark.parametrize("ps", [1, 4])
@pytest.mark.parametrize("window", [1, 3, 4, 9])
@pytest.mark.parametrize("finish", ["chunk", "radix"])
def test_window_release_and_finish_match_and_keep_the_invariants(
    ps: int, window: int, finish: str
) -> None:
    ref, opt = run("reference", ps, window, finish), run("optimized", ps, window, finish)
    assert ref == opt
    evicted = [t[1] for t in ref if isinstance(t, tuple) and t[0] == "step"]
    assert evicted[-1] > 0  # the window slid: SWA slots went back during decode
