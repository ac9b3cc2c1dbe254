"""Reference KV storage variants: FP4, MXFP8, MLA FP4, page-major and no-op pools."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvpool.errors import ConfigError, IndexOutOfRangeError, InvalidArgumentError, KVStorageError
from kvpool.reference.kv.fp4 import MHATokenToKVPoolFP4
from kvpool.reference.kv.mla_fp4 import MLATokenToKVPoolFP4
from kvpool.reference.kv.mxfp8 import MHATokenToKVPoolMXFP8
from kvpool.reference.kv.noop import NoOpMHATokenToKVPool
from kvpool.reference.kv.page_major import PageMajorMHATokenToKVPool
from kvpool.reference.kv.quant import (
    E2M1_VALUES,
    e4m3_code,
    e4m3_value,
    f32,
    fp4_block_exponent,
    fp4_dequantize_row,
    fp4_quantize_row,
    mxfp8_dequantize_head,
    mxfp8_quantize_head,
)
from kvpool.tags import TAG_MODULUS, kv_tags
from tests.reference.test_no_torch import loaded_after_import

FINITE = st.floats(-1e6, 1e6, allow_nan=False, width=32)


def rows(rng: random.Random, n: int, heads: int, dim: int) -> list[list[list[float]]]:
    return [[[f32(rng.gauss(0, 3)) for _ in range(dim)] for _ in range(heads)] for _ in range(n)]


def variants() -> list[Any]:
    return [
        MHATokenToKVPoolFP4(12, 4, "float32", 2, 8, 2, start_layer=1),
        MHATokenToKVPoolMXFP8(12, 4, "float32", 1, 32, 2, v_head_dim=64),
        MLATokenToKVPoolFP4(12, 4, 24, 8, 2),
        PageMajorMHATokenToKVPool(12, 4, "float32", 2, 3, 2, v_head_dim=5),
        NoOpMHATokenToKVPool(12, 4, "float32", 2, 3, 2),
    ]


@pytest.mark.parametrize(
    "module",
    [
        "kvpool.reference.kv.fp4",
        "kvpool.reference.kv.mxfp8",
        "kvpool.reference.kv.mla_fp4",
        "kvpool.reference.kv.page_major",
        "kvpool.reference.kv.noop",
        "kvpool.reference.kv.layer_transfer",
    ],
)
def test_variant_modules_do_not_import_torch(module: str) -> None:
    assert loaded_after_import(module) == ""


def test_fp4_packs_even_value_low_nibble_and_scales_by_power_of_two() -> None:
    row = [6.0, -0.5] + [0.0] * 14 + [12.0, 1.0] + [0.0] * 14
    packed, scales = fp4_quantize_row(row)
    assert scales == [127, 128]  # amax 6 -> 2**0; amax 12 -> 2**1
    assert packed[0] == 0x7 | (0x9 << 4)  # 6.0 low nibble (code 7), -0.5 high (sign | 1)
    assert packed[8] == 0x7 | (0x1 << 4)  # 12 / 2 = 6 (code 7); 1 / 2 = 0.5 (code 1)
    assert fp4_dequantize_row(packed, scales) == row


def test_fp4_all_zero_block_takes_the_floor_scale() -> None:
    packed, scales = fp4_quantize_row([0.0] * 16)
    assert scales == [127 - 33] and packed == [0] * 8  # ceil(log2(1e-10)) = -33


@given(st.lists(FINITE, min_size=16, max_size=16))
def test_fp4_round_trip_error_within_the_block_grid(block: list[float]) -> None:
    e = fp4_block_exponent(block)
    decoded = fp4_dequantize_row(*fp4_quantize_row(block))
    for x, y in zip(block, decoded, strict=True):
        assert y / 2.0**e in E2M1_VALUES or -y / 2.0**e in E2M1_VALUES
        assert abs(x - y) <= 2.0**e  # at most half the widest gap (4 -> 6) of the grid


def test_e4m3_codes_round_trip_every_finite_byte() -> None:
    for code in range(256):
        if code & 0x7F == 0x7F:
            continue  # NaN
        assert e4m3_code(e4m3_value(code)) == code


@given(st.lists(FINITE, min_size=32, max_size=32))
def test_mxfp8_round_trip_relative_error(head: list[float]) -> None:
    codes, scales = mxfp8_quantize_head(head)
    decoded = mxfp8_dequantize_head(codes, scales)
    step = 2.0 ** (scales[0] - 127)  # one e4m3 unit at the block scale
    for x, y in zip(head, decoded, strict=True):
        assert abs(x - y) <= abs(x) * 2.0**-4 + step * 2.0**-9


@pytest.mark.parametrize("index", range(5))
def test_tags_survive_every_variant(index: int) -> None:
    kv = variants()[index]
    tags = [TAG_MODULUS, 1, *kv_tags([3, 1, 4], "ns")]
    kv.write_tags([1, 2, 3, 4, 5], tags)
    assert kv.read_tags([1, 2, 3, 4, 5, 6]) == [*tags, 0]
    kv.move_kv_cache([6, 1], [1, 2])  # overlapping: sources read first
    assert kv.read_tags([6, 1]) == [TAG_MODULUS, 1]


@pytest.mark.parametrize("index", range(4))
def test_bad_writes_change_nothing(index: int) -> None:
    kv = variants()[index]
    heads, dim = kv.head_num, (kv.kv_dim if hasattr(kv, "kv_dim") else kv.head_dim)
    vdim = getattr(kv, "v_head_dim", dim)
    rng = random.Random(index)
    good_k, good_v = rows(rng, 1, heads, dim), rows(rng, 1, heads, vdim)
    layer = kv.start_layer
    kv.set_kv_buffer(layer, [2], good_k, good_v)
    before = kv.get_key_buffer(layer)[2]
    with pytest.raises(InvalidArgumentError):
        kv.set_kv_buffer(layer, [3, 2], good_k, [good_v[0]] * 2)  # one K row for two slots
    with pytest.raises(IndexOutOfRangeError):
        kv.set_kv_buffer(layer, [2, 16], [good_k[0]] * 2, [good_v[0]] * 2)
    with pytest.raises(IndexOutOfRangeError):
        kv.set_kv_buffer(layer + 2, [2], good_k, good_v)
    if index < 3:  # the quantised formats have no NaN or infinity
        with pytest.raises(InvalidArgumentError):
            kv.set_kv_buffer(layer, [2], [[[float("nan")] * dim] * heads], good_v)
        with pytest.raises(InvalidArgumentError):  # overflows float32
            kv.set_kv_buffer(layer, [2], [[[1e39] * dim] * heads], good_v)
    assert kv.get_key_buffer(layer)[2] == before


def test_quantised_pools_dequantise_what_they_store() -> None:
    rng = random.Random(7)
    kv = MHATokenToKVPoolFP4(8, 2, "float32", 2, 8, 1)
    k, v = rows(rng, 2, 2, 8), rows(rng, 2, 2, 8)
    kv.set_kv_buffer(0, [3, 4], k, v, k_scale=2.0)
    kb, _, ksf, _ = kv.get_raw_kv_buffer(0)
    flat = [b for head in kb[3] for b in head]
    assert kv.get_key_buffer(0)[3] == [
        fp4_dequantize_row(flat, ksf[3])[h * 8 : (h + 1) * 8] for h in range(2)
    ]
    expected = fp4_quantize_row([f32(f32(x) / 2.0) for h in k[1] for x in h])
    assert [b for head in kb[4] for b in head] == expected[0] and ksf[4] == expected[1]
    mla = MLATokenToKVPoolFP4(8, 2, 12, 4, 1)
    mla.set_kv_buffer(0, [1], [[[float(i) for i in range(16)]]])
    assert mla.get_value_buffer(0)[1] == [mla.get_key_buffer(0)[1][0][:12]]


@pytest.mark.parametrize(
    "build",
    [
        lambda: MHATokenToKVPoolFP4(8, 1, "float32", 1, 7, 1),  # odd head_dim
        lambda: MHATokenToKVPoolFP4(8, 1, "float32", 1, 8, 1),  # 8 values: not a whole block
        lambda: MHATokenToKVPoolFP4(8, 1, "float32", 2, 8, 1, v_head_dim=16),
        lambda: MHATokenToKVPoolMXFP8(8, 1, "float32", 1, 48, 1),
        lambda: MLATokenToKVPoolFP4(8, 1, 10, 4, 1),
        lambda: PageMajorMHATokenToKVPool(10, 4, "float32", 1, 2, 1),  # size not whole pages
        lambda: PageMajorMHATokenToKVPool(8, 4, "bfloat16", 1, 2, 1),
    ],
)
def test_unsupported_geometries_are_config_errors(build: Any) -> None:
    with pytest.raises(ConfigError):
        build()


def test_page_major_views_are_strided_windows_of_one_buffer() -> None:
    kv = PageMajorMHATokenToKVPool(4, 2, "float32", 1, 2, 2, v_head_dim=3)
    # page items = page_size * layers * (K + V) = 2 * 2 * (2 + 3) = 20; 3 pages
    assert len(kv._raw) == 60 and kv.get_key_buffer(1).stride == (20, 2, 2, 1)
    kv.set_kv_buffer(1, [5], [[[1.0, 2.0]]], [[[3.0, 4.0, 5.0]]])
    # token 5: page 2, slot 1; layer 1's K block starts 2 * (2 + 3) * 1 = 10 items into the page
    base = 2 * 20 + 10
    assert kv._raw[base + 2 : base + 4] == [1.0, 2.0]  # slot 1 of the K block
    assert kv._raw[base + 4 + 3 : base + 4 + 6] == [3.0, 4.0, 5.0]  # V block after ps * K
    assert kv.get_value_buffer(1)[5] == [[3.0, 4.0, 5.0]]
    assert sum(1 for x in kv._raw if x) == 5


def test_noop_pool_refuses_writes_and_keeps_placeholders() -> None:
    kv = NoOpMHATokenToKVPool(64, 4, "float32", 2, 3, 2)
    with pytest.raises(KVStorageError):
        kv.set_kv_buffer(0, [1], [[[0.0] * 3] * 2], [[[0.0] * 3] * 2])
    assert len(kv.get_key_buffer(1)) == 4 and kv.get_kv_size_bytes() == (0, 0)
    with pytest.raises(IndexOutOfRangeError):
        kv.write_tags([68], [1])
    assert kv.tag_record == {}
