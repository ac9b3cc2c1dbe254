"""Every KV pool of both twins (the MHA and MLA pools and each storage variant) is a
:class:`kvpool.protocols.KVPoolProtocol`: the module-level annotations are checked by mypy, the
tests check the same surface at run time through the protocol only."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from kvpool.config import KV_STORAGES, PoolConfig
from kvpool.optimized.kv.fp4 import MHATokenToKVPoolFP4 as TwinFP4
from kvpool.optimized.kv.kv_cache import TensorLike
from kvpool.optimized.kv.mha import MHATokenToKVPool as TwinMHA
from kvpool.optimized.kv.mla import MLATokenToKVPool as TwinMLA
from kvpool.optimized.kv.mla_fp4 import MLATokenToKVPoolFP4 as TwinMLAFP4
from kvpool.optimized.kv.mxfp8 import MHATokenToKVPoolMXFP8 as TwinMXFP8
from kvpool.optimized.kv.noop import NoOpMHATokenToKVPool as TwinNoOp
from kvpool.optimized.kv.page_major import PageMajorMHATokenToKVPool as TwinPageMajor
from kvpool.optimized.kv.storage import kv_cache_from_config as twin_from_config
from kvpool.protocols.kv import KVPoolProtocol
from kvpool.reference.kv.fp4 import MHATokenToKVPoolFP4 as RefFP4
from kvpool.reference.kv.mha import MHATokenToKVPool as RefMHA
from kvpool.reference.kv.mla import MLATokenToKVPool as RefMLA
from kvpool.reference.kv.mla_fp4 import MLATokenToKVPoolFP4 as RefMLAFP4
from kvpool.reference.kv.mxfp8 import MHATokenToKVPoolMXFP8 as RefMXFP8
from kvpool.reference.kv.noop import NoOpMHATokenToKVPool as RefNoOp
from kvpool.reference.kv.page_major import PageMajorMHATokenToKVPool as RefPageMajor
from kvpool.reference.kv.storage import kv_cache_from_config as ref_from_config

# Static conformance (mypy): sizes in tokens, 2 layers, dims that every variant accepts.
REF_POOLS: tuple[KVPoolProtocol[Sequence[int]], ...] = (
    RefMHA(8, 4, "float32", 1, 32, 2),
    RefMLA(8, 4, 16, 0, 2),
    RefFP4(8, 4, "float32", 1, 16, 2),
    RefMLAFP4(8, 4, 16, 0, 2),
    RefMXFP8(8, 4, "float32", 1, 32, 2),
    RefPageMajor(8, 4, "float32", 1, 32, 2),
    RefNoOp(8, 4, "float32", 1, 32, 2),
)
TWIN_POOLS: tuple[KVPoolProtocol[TensorLike], ...] = (
    TwinMHA(8, 4, torch.float32, 1, 32, 2),
    TwinMLA(8, 4, 16, 0, 2),
    TwinFP4(8, 4, torch.float32, 1, 16, 2),
    TwinMLAFP4(8, 4, 16, 0, 2),
    TwinMXFP8(8, 4, torch.float32, 1, 32, 2),
    TwinPageMajor(8, 4, torch.float32, 1, 32, 2),
    TwinNoOp(8, 4, torch.float32, 1, 32, 2),
)


class _Counter:
    """A layer-transfer counter that records the local layers waited for."""

    def __init__(self) -> None:
        self.waited: list[int] = []

    def wait_until(self, threshold: int) -> None:
        self.waited.append(threshold)


def _round_trip(pool: KVPoolProtocol[list[int]]) -> None:
    """Tags written through the protocol read back; the geometry is consistent; registering a
    counter is accepted."""
    assert pool.num_rows == pool.size + pool.page_size
    assert pool.end_layer == pool.start_layer + pool.layer_num - 1
    assert pool.head_num >= 1
    slots, tags = [5, 6, 9], [11, 12, 13]
    pool.write_tags(slots, tags)
    assert pool.read_tags(slots) == tags
    assert pool.read_tags([7]) == [0]
    pool.register_layer_transfer_counter(_Counter())


# Every (storage, layout) pair PoolConfig accepts: MLA exists as plain and FP4 only.
PAIRS = [(s, "mha") for s in KV_STORAGES] + [("plain", "mla"), ("fp4", "mla")]


@pytest.mark.parametrize(("storage", "layout"), PAIRS)
def test_every_configured_pool_is_a_kv_pool(storage: str, layout: str) -> None:
    config = PoolConfig(
        size=8, page_size=4, num_layers=2, head_num=1, head_dim=32, kv_layout=layout,
        kv_lora_rank=16, qk_rope_head_dim=0, kv_storage=storage,
    )  # fmt: skip
    _round_trip(ref_from_config(config))
    _round_trip(twin_from_config(config))


def test_the_static_pools_are_kv_pools() -> None:
    for ref_pool, twin_pool in zip(REF_POOLS, TWIN_POOLS, strict=True):
        assert (ref_pool.size, ref_pool.page_size) == (twin_pool.size, twin_pool.page_size)
        assert ref_pool.layer_num == twin_pool.layer_num == 2
