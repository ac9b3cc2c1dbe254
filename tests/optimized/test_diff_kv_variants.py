"""The KV storage variants, twin against reference: the same stored bytes, the same dequantised
values and tags after any sequence of writes, moves and tag writes."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvpool.optimized.kv.fp4 as opt_fp4
import kvpool.optimized.kv.mla_fp4 as opt_mla
import kvpool.optimized.kv.mxfp8 as opt_mx
import kvpool.optimized.kv.noop as opt_noop
import kvpool.optimized.kv.page_major as opt_pm
import kvpool.reference.kv.fp4 as ref_fp4
import kvpool.reference.kv.mla_fp4 as ref_mla
import kvpool.reference.kv.mxfp8 as ref_mx
import kvpool.reference.kv.noop as ref_noop
import kvpool.reference.kv.page_major as ref_pm
from kvpool.errors import KVStorageError
from kvpool.reference.kv.quant import e4m3_code, f32

SIZE, PAGE = 12, 4


def pairs() -> dict[str, tuple[Any, Any]]:
    return {
        "fp4": (ref_fp4.MHATokenToKVPoolFP4(SIZE, PAGE, "float32", 2, 8, 2, start_layer=1),
                opt_fp4.MHATokenToKVPoolFP4(SIZE, PAGE, "float32", 2, 8, 2, start_layer=1)),
        "mxfp8": (ref_mx.MHATokenToKVPoolMXFP8(SIZE, PAGE, "float32", 2, 32, 2, v_head_dim=64),
                  opt_mx.MHATokenToKVPoolMXFP8(SIZE, PAGE, "float32", 2, 32, 2, v_head_dim=64)),
        "mla_fp4": (ref_mla.MLATokenToKVPoolFP4(SIZE, PAGE, 24, 8, 2),
                    opt_mla.MLATokenToKVPoolFP4(SIZE, PAGE, 24, 8, 2)),
        "page_major": (ref_pm.PageMajorMHATokenToKVPool(SIZE, PAGE, "float32", 2, 3, 2, 0, 5),
                       opt_pm.PageMajorMHATokenToKVPool(SIZE, PAGE, "float32", 2, 3, 2, 0, 5)),
    }  # fmt: skip


def stored(kv: Any, layer: int) -> list[Any]:
    """Everything a variant stores for ``layer``, as nested lists of ints/floats."""
    if hasattr(kv, "raw_bytes"):
        return [list(kv.raw_bytes())]
    raw = list(kv.get_raw_kv_buffer(layer))
    if hasattr(kv, "get_kv_scale_buffer"):
        raw += list(kv.get_kv_scale_buffer(layer))
    return [x.view(torch.uint8).tolist() if isinstance(x, torch.Tensor) else x for x in raw]


def dequantised(kv: Any, layer: int) -> list[Any]:
    k, v = kv.get_kv_buffer(layer)
    if isinstance(k, torch.Tensor):
        rows = kv.num_rows
        return [
            k.reshape(rows, kv.head_num, -1).tolist(),
            v.reshape(rows, kv.head_num, -1).tolist(),
        ]
    return [[k[t] for t in range(len(k))], [v[t] for t in range(len(v))]]


def random_rows(rng: random.Random, n: int, heads: int, dim: int) -> list[list[list[float]]]:
    scale = rng.choice([1e-3, 1.0, 50.0])
    return [[[f32(rng.gauss(0, scale)) for _ in range(dim)] for _ in range(heads)]
            for _ in range(n)]  # fmt: skip


def run_ops(ref: Any, opt: Any, seed: int, steps: int = 12) -> None:
    rng = random.Random(seed)
    k_dim = getattr(ref, "kv_dim", getattr(ref, "head_dim", 0))
    v_dim = getattr(ref, "v_head_dim", k_dim)
    heads = ref.head_num
    for _ in range(steps):
        op = rng.choice(["set", "set", "move", "tags"])
        if op == "set":
            n = rng.randint(1, 4)
            loc = rng.sample(range(ref.num_rows), n)
            layer = rng.randint(ref.start_layer, ref.end_layer)
            k, v = random_rows(rng, n, heads, k_dim), random_rows(rng, n, heads, v_dim)
            scale = rng.choice([None, 0.5, 3.0])
            ref.set_kv_buffer(layer, loc, k, v, k_scale=scale)
            opt.set_kv_buffer(layer, torch.tensor(loc), torch.tensor(k), torch.tensor(v),
                              k_scale=scale)  # fmt: skip
        elif op == "move":
            n = rng.randint(1, 3)
            tgt, src = rng.sample(range(ref.num_rows), n), rng.sample(range(ref.num_rows), n)
            ref.move_kv_cache(tgt, src)
            opt.move_kv_cache(torch.tensor(tgt), torch.tensor(src))
        else:
            loc = rng.sample(range(1, ref.num_rows), 2)
            tags = [rng.randint(1, 16_777_213) for _ in loc]
            ref.write_tags(loc, tags)
            opt.write_tags(torch.tensor(loc), tags)
    for layer in range(ref.start_layer, ref.end_layer + 1):
        assert stored(ref, layer) == stored(opt, layer)
        assert dequantised(ref, layer) == dequantised(opt, layer)
    slots = list(range(ref.num_rows))
    assert ref.read_tags(slots) == opt.read_tags(torch.tensor(slots))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(pairs()))
@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_twins_store_the_same_bytes(name: str, seed: int) -> None:
    ref, opt = pairs()[name]
    run_ops(ref, opt, seed)


def test_noop_twins_agree() -> None:
    ref = ref_noop.NoOpMHATokenToKVPool(SIZE, PAGE, "float32", 2, 3, 2)
    opt = opt_noop.NoOpMHATokenToKVPool(SIZE, PAGE, "float32", 2, 3, 2)
    for kv in (ref, opt):
        kv.write_tags([1, 2], [11, 12])
        kv.move_kv_cache([3, 1], [1, 2])
        with pytest.raises(KVStorageError):
            kv.set_kv_buffer(0, [1], [[[0.0] * 3] * 2], [[[0.0] * 3] * 2])
    assert ref.read_tags([1, 2, 3, 4]) == opt.read_tags([1, 2, 3, 4]) == [12, 12, 11, 0]
    assert tuple(opt.get_key_buffer(1).shape) == (PAGE, 2, 3) == (len(ref.get_key_buffer(1)), 2, 3)


def test_e4m3_reference_rounding_equals_torch() -> None:
    rng = random.Random(3)
    values = [f32(rng.uniform(-448, 448) * 2.0 ** rng.randint(-16, 0)) for _ in range(20_000)]
    values += [f32((c + 0.5) * 2.0**-9) for c in range(16)]  # subnormal ties
    torch_codes = torch.tensor(values).to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    assert torch_codes == [e4m3_code(v) for v in values]


def test_page_major_twin_views_share_the_raw_buffer() -> None:
    kv = opt_pm.PageMajorMHATokenToKVPool(4, 2, "float32", 1, 2, 2, v_head_dim=3)
    k = kv.get_key_buffer(1)
    assert tuple(k.shape) == (3, 2, 1, 2) and k.stride() == (20, 2, 2, 1)
    kv.set_kv_buffer(1, torch.tensor([5]), torch.tensor([[[1.0, 2.0]]]),
                     torch.tensor([[[3.0, 4.0, 5.0]]]))  # fmt: skip
    assert k[2, 1].tolist() == [[1.0, 2.0]]  # token 5 = page 2, slot 1, seen through the view
    assert k.untyped_storage().data_ptr() == kv._raw.untyped_storage().data_ptr()
