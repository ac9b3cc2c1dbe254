"""``SWAKVPool`` of both twins on one scenario: full and SWA layers in separate buffers, SWA
writes and reads translated through the allocator's shared mapping, tokens whose SWA slot was
released reading tag 0 on SWA layers, moves translated on both pools, typed errors."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvpool.errors import ConfigError, IndexOutOfRangeError
from kvpool.optimized.swa import allocator as opt_alloc
from kvpool.optimized.swa import kv_pool as opt_pool
from kvpool.reference.swa import allocator as ref_alloc
from kvpool.reference.swa import kv_pool as ref_pool


def scenario(alloc_mod: Any, pool_mod: Any, index: Any) -> dict[str, Any]:
    alloc = alloc_mod.SWATokenToKVPoolAllocator(16, 8, 1)
    pool = pool_mod.SWAKVPool(16, 8, 1, "float32", 1, 2, [1, 3], [0, 2])
    pool.register_mapping(alloc.full_to_swa_index_mapping)
    x = alloc.alloc(4)
    pool.write_tags(x, index([11, 12, 13, 14]))
    out: dict[str, Any] = {"full": pool.read_tags(x), "swa": pool.read_swa_tags(x)}
    alloc.free_swa(x[:2])  # tokens 0 and 1 left the window
    out["swa_after_slide"] = pool.read_swa_tags(x)
    y = alloc.alloc(2)
    pool.move_kv_cache(y, x[2:])
    out["moved"] = (pool.read_tags(y), pool.read_swa_tags(y))
    k = torch.full((2, 1, 2), 7.0) if index is not list else [[[7.0, 0.0]]] * 2
    pool.set_kv_buffer(3, y, k, k)  # an SWA layer: written at y's SWA slots
    swa_rows = [int(alloc.translate_loc_from_full_to_swa(y)[i]) for i in range(2)]
    out["swa_layer_3"] = [float(pool.get_key_buffer(3)[s][0][0]) for s in swa_rows]
    out["full_layer_2"] = [float(pool.get_key_buffer(2)[int(s)][0][0]) for s in y]
    with pytest.raises(IndexOutOfRangeError):
        pool.get_key_buffer(9)
    return out


def test_both_twins_agree_on_the_scenario() -> None:
    ref = scenario(ref_alloc, ref_pool, list)
    opt = scenario(opt_alloc, opt_pool, lambda v: torch.tensor(v))
    assert ref == opt
    assert ref["full"] == [11, 12, 13, 14] and ref["swa"] == [11, 12, 13, 14]
    assert ref["swa_after_slide"] == [0, 0, 13, 14]
    assert ref["moved"] == ([13, 14], [13, 14])
    assert ref["swa_layer_3"] == [7.0, 7.0] and ref["full_layer_2"] == [13.0, 14.0]


def test_layer_lists_must_be_disjoint() -> None:
    for mod in (ref_pool, opt_pool):
        with pytest.raises(ConfigError):
            mod.SWAKVPool(16, 8, 1, "float32", 1, 2, [0, 1], [1, 2])
