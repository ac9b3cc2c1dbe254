"""The optimized KV buffers against the reference ones, plus what only tensors can show (fp8
stored as bytes, views, inputs never mutated)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError
from kvpool.optimized.kv import mha as opt_mha
from kvpool.optimized.kv import mla as opt_mla
from kvpool.optimized.kv import storage as opt_storage
from kvpool.optimized.options import TwinOptions
from kvpool.reference.kv import mha as ref_mha
from kvpool.reference.kv import mla as ref_mla
from kvpool.tags import TAG_MODULUS

CHECKED = TwinOptions.make(checked=True)


def as_tensor(rows: Any) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


@pytest.mark.slow
@given(
    data=st.data(),
    mla=st.booleans(),
    ps=st.sampled_from((1, 4)),
    start_layer=st.integers(0, 2),
    layers=st.integers(1, 3),
)
def test_buffers_match_the_reference(
    data: st.DataObject, mla: bool, ps: int, start_layer: int, layers: int
) -> None:
    """Random writes (small integers, power-of-two scales: exact in float32), moves and tag
    writes give the same buffers and tags on both sides."""
    size = 4 * ps
    r: Any
    t: Any
    if mla:
        r = ref_mla.MLATokenToKVPool(size, ps, 2, 1, layers, start_layer)
        t = opt_mla.MLATokenToKVPool(size, ps, 2, 1, layers, start_layer, options=CHECKED)
        k_shape, v_shape = (1, 3), (1, 2)
    else:
        r = ref_mha.MHATokenToKVPool(size, ps, "float32", 2, 2, layers, start_layer, 3)
        t = opt_mha.MHATokenToKVPool(
            size, ps, torch.float32, 2, 2, layers, start_layer, 3, options=CHECKED
        )
        k_shape, v_shape = (2, 2), (2, 3)
    rows = size + ps
    slot = st.integers(0, rows - 1)
    value = st.integers(-8, 8).map(float)
    for _ in range(data.draw(st.integers(1, 6))):
        layer = data.draw(st.integers(start_layer, start_layer + layers - 1))
        kind = data.draw(st.sampled_from(("set", "move", "tags")))
        if kind == "set":
            loc = data.draw(st.lists(slot, min_size=1, max_size=3, unique=True))
            k = [
                [[data.draw(value) for _ in range(k_shape[1])] for _ in range(k_shape[0])]
                for _ in loc
            ]
            v = [
                [[data.draw(value) for _ in range(v_shape[1])] for _ in range(v_shape[0])]
                for _ in loc
            ]
            scale = data.draw(st.sampled_from((None, 0.5, 2.0)))
            kt, vt = as_tensor(k), as_tensor(v)
            r.set_kv_buffer(layer, loc, k, v, scale, scale)
            t.set_kv_buffer(layer, torch.tensor(loc), kt, vt, scale, scale)
            assert kt.tolist() == k and vt.tolist() == v  # inputs untouched
        elif kind == "move":
            src = data.draw(st.lists(slot, min_size=1, max_size=3, unique=True))
            tgt = data.draw(st.lists(slot, min_size=len(src), max_size=len(src), unique=True))
            r.move_kv_cache(tgt, src)
            t.move_kv_cache(torch.tensor(tgt), torch.tensor(src))
        else:
            loc = data.draw(st.lists(slot, min_size=1, max_size=3, unique=True))
            tags = data.draw(
                st.lists(st.integers(1, TAG_MODULUS), min_size=len(loc), max_size=len(loc))
            )
            r.write_tags(loc, tags)
            t.write_tags(torch.tensor(loc), tags)
            assert t.read_tags(loc) == tags
        assert t.read_tags(list(range(rows))) == r.read_tags(list(range(rows)))
        for lid in range(start_layer, start_layer + layers):
            rk, rv = r.get_kv_buffer(lid)
            tk, tv = t.get_kv_buffer(lid)
            assert tk.tolist() == rk and tv.tolist() == rv
            assert t.get_key_buffer(lid).tolist() == r.get_key_buffer(lid)
            assert t.get_value_buffer(lid).tolist() == r.get_value_buffer(lid)


def test_shapes_rows_and_layers() -> None:
    kv = opt_mha.MHATokenToKVPool(16, 4, "float16", 2, 8, 3, start_layer=5, v_head_dim=4)
    assert kv.num_rows == 20 and (kv.start_layer, kv.end_layer) == (5, 7)
    assert kv.get_key_buffer(5).shape == (20, 2, 8) and kv.get_value_buffer(7).shape == (20, 2, 4)
    assert kv.get_key_buffer(6).dtype == torch.float16
    kv.write_tags([1, 2, 3], [7, 8, 9])
    before = [b.clone() for b in (*kv.k_buffer, *kv.v_buffer)]
    with pytest.raises(IndexOutOfRangeError):
        kv.get_key_buffer(4)
    with pytest.raises(IndexOutOfRangeError):
        kv.set_kv_buffer(8, [1], torch.ones(1, 2, 8), torch.ones(1, 2, 4))
    with pytest.raises(InvalidArgumentError):
        kv.set_kv_buffer(5, [1], torch.ones(1, 2, 4), torch.ones(1, 2, 4))
    with pytest.raises(InvalidArgumentError):
        kv.move_kv_cache([1, 2], [3])
    # A refused write or move changed no buffer of any layer.
    after = [*kv.k_buffer, *kv.v_buffer]
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))
    assert kv.read_tags([1, 2, 3]) == [7, 8, 9]
    with pytest.raises(ConfigError):
        opt_mha.MHATokenToKVPool(16, 4, "int8", 2, 8, 3)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, "fp8_e4m3"])
def test_fp8_is_stored_as_bytes_and_viewed_back(dtype: Any) -> None:
    kv = opt_mha.MHATokenToKVPool(8, 4, dtype, 1, 4, 1)
    assert kv.k_buffer[0].dtype == torch.uint8 and kv.store_dtype == torch.uint8
    k = torch.tensor([[[1.0, -2.0, 0.5, 4.0]]])
    before = k.clone()
    kv.set_kv_buffer(0, torch.tensor([3]), k, k * 2, k_scale=2.0, v_scale=0.5)
    assert torch.equal(k, before)  # never mutated, even with a scale
    key = kv.get_key_buffer(0)
    assert key.dtype == kv.dtype
    assert key[3].float().tolist() == [[0.5, -1.0, 0.25, 2.0]]
    assert kv.get_value_buffer(0)[3].float().tolist() == [[4.0, -8.0, 2.0, 16.0]]
    kv.move_kv_cache([5], [3])
    assert kv.get_key_buffer(0)[5].float().tolist() == [[0.5, -1.0, 0.25, 2.0]]


def test_mla_value_is_a_view_and_cache_v_is_ignored() -> None:
    kv = opt_mla.MLATokenToKVPool(8, 4, kv_lora_rank=3, qk_rope_head_dim=2, layer_num=2)
    k = torch.arange(5, dtype=torch.float32).reshape(1, 1, 5)
    kv.set_kv_buffer(1, [2], k, cache_v=None)
    value = kv.get_value_buffer(1)
    assert value.shape == (12, 1, 3) and value[2].tolist() == [[0.0, 1.0, 2.0]]
    kv.get_key_buffer(1)[2, 0, 0] = 9.0  # a view: the value sees writes to the key buffer
    assert value[2, 0, 0].item() == 9.0


def test_layer_transfer_hook_runs_before_reads() -> None:
    waited: list[int] = []

    class Counter:
        def wait_until(self, layer_id: int) -> None:
            waited.append(layer_id)

    kv = opt_mha.MHATokenToKVPool(8, 4, torch.float32, 1, 2, 2, start_layer=3)
    kv.register_layer_transfer_counter(Counter())
    kv.get_key_buffer(3)
    kv.get_value_buffer(4)
    kv.get_kv_buffer(4)
    assert waited == [0, 1, 1]  # local layer indices, as SGLang


def test_tags_exact_in_float32_from_config() -> None:
    for layout in ("mha", "mla"):
        kv = opt_storage.kv_cache_from_config(PoolConfig(size=8, page_size=2, kv_layout=layout))
        top = [TAG_MODULUS, TAG_MODULUS - 1, 1]
        kv.write_tags(torch.tensor([1, 2, 9]), top)
        assert kv.read_tags([1, 2, 9, 3]) == [*top, 0]
