"""Unit tests of the reference KV buffers (MHA and MLA)."""

from __future__ import annotations

import copy

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.reference.kv.mha import MHATokenToKVPool
from kvpool.reference.kv.mla import MLATokenToKVPool
from kvpool.reference.kv.storage import kv_cache_from_config


def mha(**kw: int) -> MHATokenToKVPool:
    return MHATokenToKVPool(8, 2, "float32", head_num=2, head_dim=3, layer_num=2, **kw)


def test_mha_shapes_and_layer_range() -> None:
    kv = mha(start_layer=4, v_head_dim=1)
    assert (kv.start_layer, kv.end_layer) == (4, 5)
    k, v = kv.get_kv_buffer(5)
    assert len(k) == 10 == len(v)  # size + page_size rows
    assert len(k[0]) == 2 and len(k[0][0]) == 3 and len(v[0][0]) == 1
    for bad in (3, 6):
        with pytest.raises(IndexOutOfRangeError):
            kv.get_key_buffer(bad)


def test_set_kv_buffer_scales_without_mutating_inputs() -> None:
    kv = mha()
    cache_k = [[[2.0, 4.0, 6.0], [8.0, 10.0, 12.0]]]
    cache_v = [[[1.0, 1.0, 1.0], [3.0, 3.0, 3.0]]]
    saved = copy.deepcopy((cache_k, cache_v))
    kv.set_kv_buffer(1, [7], cache_k, cache_v, k_scale=2.0, v_scale=0.5)
    assert (cache_k, cache_v) == saved
    assert kv.get_key_buffer(1)[7] == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]
    assert kv.get_value_buffer(1)[7] == [[2.0, 2.0, 2.0], [6.0, 6.0, 6.0]]
    assert kv.get_key_buffer(0)[7] == [[0.0] * 3] * 2  # other layer untouched


def test_set_kv_buffer_validates_before_writing() -> None:
    kv = mha()
    good = [[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]]
    with pytest.raises(InvalidArgumentError):
        kv.set_kv_buffer(0, [1, 2], good, good)
    with pytest.raises(IndexOutOfRangeError):
        kv.set_kv_buffer(0, [10], good, good)
    assert kv.read_tags([1, 2]) == [0, 0]


def test_tags_and_move_kv_cache_copy_every_layer() -> None:
    kv = mha()
    kv.write_tags([3, 4], [11, 22])
    assert kv.read_tags([3, 4, 5]) == [11, 22, 0]
    assert kv.get_value_buffer(1)[4][1][0] == 22.0
    kv.move_kv_cache([4, 5], [3, 4])  # overlapping: sources are read first
    assert kv.read_tags([3, 4, 5]) == [11, 11, 22]
    assert kv.get_key_buffer(1)[5][0][0] == 22.0
    with pytest.raises(InvalidArgumentError):
        kv.move_kv_cache([1], [2, 3])


def test_mla_value_view_and_ignored_v() -> None:
    kv = MLATokenToKVPool(4, 1, kv_lora_rank=2, qk_rope_head_dim=1, layer_num=1)
    kv.set_kv_buffer(0, [2], [[[1.0, 2.0, 3.0]]], cache_v=None)
    assert kv.get_key_buffer(0)[2] == [[1.0, 2.0, 3.0]]
    assert kv.get_value_buffer(0)[2] == [[1.0, 2.0]]
    kv.write_tags([1], [5])
    kv.move_kv_cache([3], [1])
    assert kv.read_tags([1, 2, 3]) == [5, 1, 5]


def test_fp8_is_recorded_and_exact_and_bad_config_refused() -> None:
    kv = MHATokenToKVPool(4, 1, "fp8_e4m3", 1, 1, 1)
    assert kv.store_dtype == "uint8"
    kv.set_kv_buffer(0, [1], [[[0.1]]], [[[0.2]]])
    assert kv.get_key_buffer(0)[1] == [[0.1]]
    with pytest.raises(ConfigError):
        MHATokenToKVPool(4, 1, "int4", 1, 1, 1)
    with pytest.raises(ConfigError):
        MHATokenToKVPool(4, 1, "float32", 0, 1, 1)


def test_layer_transfer_counter_is_waited_on() -> None:
    kv = mha(start_layer=1)
    waited: list[int] = []

    class Counter:
        def wait_until(self, layer_id: int) -> None:
            waited.append(layer_id)

    kv.register_layer_transfer_counter(Counter())
    kv.get_key_buffer(1)
    kv.get_kv_buffer(2)
    assert waited == [0, 1]  # local layer indices, as SGLang


def test_from_config() -> None:
    mla = kv_cache_from_config(PoolConfig(size=8, kv_layout="mla", num_layers=3, start_layer=1))
    assert isinstance(mla, MLATokenToKVPool) and mla.end_layer == 3
    assert isinstance(kv_cache_from_config(PoolConfig(size=8)), MHATokenToKVPool)
