"""Opt-in (``--run-sglang-wheel``): kvpool's FP4 and MXFP8 KV formats against SGLang 0.5.16's own
quantise / dequantise functions, and its page-major pool against SGLang's view builder
(``layout/page_major.py``), on CPU.

SGLang's files are read from its wheel (``$KVPOOL_SGLANG_CACHE`` or a ``pip download``) and
executed in a private namespace: ``kvfp4_tensor.py`` with its ``@torch.compile`` decorators
dropped (the same Python, run eagerly), ``mxfp8_quant.py`` with its Triton quantise kernel run
through Triton's interpreter. Nothing from the wheel is stored here.

The interpreter's own float32 -> e4m3 cast does not carry a rounding into the next binade
(124.7 becomes 64, where the GPU's round-to-nearest cast gives 128), so the kernel is launched
with a float32 output: it stores SGLang's scaled and clamped values unrounded, and torch's cast
(round to nearest even, as the hardware) makes the bytes.
"""

from __future__ import annotations

import ast
import random
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import kvpool.optimized.kv_fp4 as opt_fp4
import kvpool.optimized.kv_page_major as opt_pm
from kvpool.optimized.kv_quant import fp4_dequantize, fp4_quantize, mxfp8_quantize
from kvpool.reference.kv_quant import f32, fp4_quantize_row
from kvpool.reference.kv_tag_codec import fp4_tag_row, mxfp8_tag_head
from kvpool.sglang.source import resolve_source
from kvpool.testing.kernel_harness.interpreter import interpreted

pytestmark = pytest.mark.sglang_wheel
VERSION = "0.5.16"


def _exec(relpath: str, drop: str) -> dict[str, Any]:
    """Execute SGLang file ``relpath`` with decorators whose source is ``drop`` removed."""
    source = resolve_source(VERSION)
    text = source.read(relpath)
    assert text is not None, f"{relpath} not in SGLang {VERSION}"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = [d for d in node.decorator_list if ast.unparse(d) != drop]
    namespace: dict[str, Any] = {"__name__": "sglang_private"}
    exec(compile(tree, source.filename(relpath), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def fp4_util() -> Any:
    return _exec("sglang/srt/layers/quantization/kvfp4_tensor.py", "torch.compile")[
        "FP4MXBlock16KVQuantizeUtil"
    ]


@pytest.fixture(scope="module")
def mxfp8() -> dict[str, Any]:
    namespace = _exec("sglang/srt/layers/quantization/mxfp8_quant.py", "triton.jit")
    namespace["_mxfp8_quant_kernel"] = interpreted(namespace["_mxfp8_quant_kernel"])
    assert namespace["triton"] is triton and namespace["tl"] is tl
    return namespace


def samples(seed: int, n: int, heads: int, dim: int) -> torch.Tensor:
    rng = random.Random(seed)
    scale = rng.choice([1e-4, 0.1, 1.0, 30.0, 5e3])
    data = [[[f32(rng.gauss(0, scale)) for _ in range(dim)] for _ in range(heads)]
            for _ in range(n)]  # fmt: skip
    return torch.tensor(data, dtype=torch.float32)


@pytest.mark.parametrize("seed", range(25))
def test_fp4_bytes_and_values_equal_sglang(fp4_util: Any, seed: int) -> None:
    x = samples(seed, 6, 2, 16)
    packed, scales = fp4_util.batched_quantize(x.clone())
    ours_packed, ours_scales = fp4_quantize(x)
    assert torch.equal(packed, ours_packed) and torch.equal(scales, ours_scales)
    theirs = fp4_util.batched_dequantize(packed, scales, dtype=torch.float32)
    assert torch.equal(theirs, fp4_dequantize(ours_packed, ours_scales))
    ref_packed, ref_scales = zip(
        *(fp4_quantize_row(row) for row in x.reshape(6, -1).tolist()), strict=True
    )
    assert [list(p) for p in ref_packed] == packed.reshape(6, -1).tolist()
    assert [list(s) for s in ref_scales] == scales.tolist()


def test_fp4_pool_stores_what_sglang_quantises(fp4_util: Any) -> None:
    kv = opt_fp4.MHATokenToKVPoolFP4(8, 2, "float32", 2, 16, 1)
    x = samples(99, 3, 2, 16)
    kv.set_kv_buffer(0, torch.tensor([1, 4, 7]), x, x)
    packed, scales = fp4_util.batched_quantize(x.clone())
    k, _, k_sf, _ = kv.get_raw_kv_buffer(0)
    assert torch.equal(k[[1, 4, 7]], packed) and torch.equal(k_sf[[1, 4, 7]], scales)


def test_tag_rows_survive_sglang_fp4(fp4_util: Any) -> None:
    for tag in (1, 5, 16_777_213, 0xABCDE):
        row = torch.tensor([fp4_tag_row(tag, 32)], dtype=torch.float32).reshape(1, 2, 16)
        back = fp4_util.batched_dequantize(*fp4_util.batched_quantize(row.clone()))
        assert torch.equal(back.float(), row)  # exact, even in SGLang's bf16 output


def to_mxfp8_float_output(mxfp8: dict[str, Any], x: torch.Tensor) -> Any:
    """SGLang's ``to_mxfp8`` launch with a float32 value output, cast to e4m3 by torch."""
    x2d = x.reshape(-1, x.shape[-1])
    m, k = x2d.shape
    xq = torch.empty_like(x2d)
    scales = torch.empty((m, k // 32), dtype=torch.uint8)
    mxfp8["_mxfp8_quant_kernel"][(triton.cdiv(m, 64), k // 32)](
        x2d, xq, scales, m, k, *x2d.stride(), *xq.stride(), *scales.stride(), BLOCK_M=64
    )
    data = xq.to(torch.float8_e4m3fn).view(x.shape)
    return mxfp8["MXFP8Tensor"](data=data, scale=scales.view(*x.shape[:-1], k // 32))


@pytest.mark.parametrize("seed", range(10))
def test_mxfp8_bytes_equal_sglang(mxfp8: dict[str, Any], seed: int) -> None:
    x = samples(seed, 4, 2, 64)
    theirs = to_mxfp8_float_output(mxfp8, x)
    codes, scales = mxfp8_quantize(x)
    assert torch.equal(theirs.data.view(torch.uint8), codes)
    assert torch.equal(theirs.scale.view(torch.uint8), scales)
    back = mxfp8["from_mxfp8"](theirs, out_dtype=torch.float32)
    ours = codes.view(torch.float8_e4m3fn).float().reshape(4, 2, 2, 32)
    ours = ours * torch.exp2(scales.float() - 127).unsqueeze(-1)
    assert torch.equal(back, ours.reshape(4, 2, 64))


def test_tag_heads_survive_sglang_mxfp8(mxfp8: dict[str, Any]) -> None:
    heads = torch.tensor([[mxfp8_tag_head(t, 32)] for t in (1, 77, 16_777_213)])
    back = mxfp8["from_mxfp8"](to_mxfp8_float_output(mxfp8, heads), out_dtype=torch.float32)
    assert torch.equal(back, heads)


def test_page_major_views_match_sglang_layout() -> None:
    namespace = _exec("sglang/srt/mem_cache/layout/page_major.py", "")
    ps, layers, heads, dim, v_dim, size = 4, 3, 2, 3, 5, 12
    pages = (size + ps) // ps
    entry = namespace["mha_entry_bytes"](
        layer_num=layers, head_num=heads, head_dim=dim, v_head_dim=v_dim, itemsize=4
    )
    raw = torch.zeros(pages * ps * entry, dtype=torch.uint8)
    k_views, v_views = namespace["build_page_major_mha_views"](
        raw, layer_num=layers, head_num=heads, head_dim=dim, v_head_dim=v_dim,
        store_dtype=torch.float32, page_size=ps, num_pages=pages,
    )  # fmt: skip
    ours = opt_pm.PageMajorMHATokenToKVPool(size, ps, "float32", heads, dim, layers, 0, v_dim)
    rng = random.Random(5)
    for _ in range(10):
        layer, token = rng.randrange(layers), rng.randrange(size + ps)
        k, v = (
            samples(rng.randrange(99), 1, heads, dim),
            samples(rng.randrange(99), 1, heads, v_dim),
        )
        k_views[layer][token // ps, token % ps] = k[0]
        v_views[layer][token // ps, token % ps] = v[0]
        ours.set_kv_buffer(layer, torch.tensor([token]), k, v)
    assert bytes(raw.numpy().tobytes()) == ours.raw_bytes()
    for theirs, mine in zip((*k_views, *v_views), (*ours.k_buffer, *ours.v_buffer), strict=True):
        assert theirs.stride() == mine.stride() and theirs.shape == mine.shape
