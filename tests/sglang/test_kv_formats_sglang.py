"""Opt-in (``--run-sglang-wheel``): kvpool's FP4 and MXFP8 KV formats against SGLang's own
quantise / dequantise functions, and its page-major pool against SGLang's view builder
(``layout/page_major.py``), on CPU, for each release in :data:`VERSIONS`.

SGLang's files are read from its wheel (``$KVPOOL_SGLANG_CACHE`` or a ``pip download``) and
executed in a private namespace, their ``sglang`` imports redirected to kvpool's private loader
(:func:`kvpool.sglang.load_sglang`: 0.5.23's ``kvfp4_tensor.py`` imports
``sglang.srt.runtime_context``, served there, and unused by the MX block-16 path):
``kvfp4_tensor.py`` with its ``@torch.compile`` decorators dropped (the same Python, run
eagerly), ``mxfp8_quant.py`` with its Triton quantise kernel run through Triton's interpreter.
Nothing from the wheel is stored here.

Where 0.5.23 keeps them (:data:`FILES`): ``kvfp4_tensor.py`` is where it was;
``mxfp8_quant.py`` moved to ``sglang/kernels/ops/quantization/`` and kept only ``MXFP8Tensor``,
``_mxfp8_quant_kernel`` and ``to_mxfp8`` (the same lines as 0.5.16's); ``from_mxfp8`` is gone
(0.5.23's MXFP8 KV pool is read only by FA4's CUDA kernel), so its dequantisation is checked
against 0.5.23's remaining MXFP8 dequantiser of the same format,
``dequant_mxfp8_2d_to_bf16`` (``srt/layers/quantization/mxfp8_block_convert.py``: e4m3 times
``2**(scale - 127)``, in bfloat16, which holds these values exactly). 0.5.23 has no page-major
view builder (see :func:`test_page_major_views_match_sglang_layout`).

The interpreter's own float32 -> e4m3 cast does not carry a rounding into the next binade
(124.7 becomes 64, where the GPU's round-to-nearest cast gives 128), so the kernel is launched
with a float32 output: it stores SGLang's scaled and clamped values unrounded, and torch's cast
(round to nearest even, as the hardware) makes the bytes.
"""

from __future__ import annotations

import ast
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import kvpool.optimized.kv.fp4 as opt_fp4
import kvpool.optimized.kv.page_major as opt_pm
from kvpool.optimized.kv.quant import fp4_dequantize, fp4_quantize, mxfp8_quantize
from kvpool.reference.kv.quant import f32, fp4_quantize_row
from kvpool.reference.kv.tag_codec import fp4_tag_row, mxfp8_tag_head
from kvpool.sglang import load_sglang
from kvpool.sglang.rewrite import rewrite_imports
from kvpool.sglang.source import resolve_source
from kvpool.testing.kernel_harness.interpreted import interpreted

pytestmark = pytest.mark.sglang_wheel
VERSIONS = ("0.5.16", "0.5.23")
_FP4 = "sglang/srt/layers/quantization/kvfp4_tensor.py"
FILES: dict[str, dict[str, str]] = {
    "0.5.16": {
        "fp4": _FP4,
        "mxfp8": "sglang/srt/layers/quantization/mxfp8_quant.py",
        "mxfp8_dequant": "sglang/srt/layers/quantization/mxfp8_quant.py",
    },
    "0.5.23": {
        "fp4": _FP4,
        "mxfp8": "sglang/kernels/ops/quantization/mxfp8_quant.py",
        "mxfp8_dequant": "sglang/srt/layers/quantization/mxfp8_block_convert.py",
    },
}
"""Release -> where it keeps the FP4 util, the MXFP8 quantiser and its MXFP8 dequantiser."""
PAGE_MAJOR = "sglang/srt/mem_cache/layout/page_major.py"


def _exec(version: str, relpath: str, drop: str) -> dict[str, Any]:
    """Execute SGLang ``version``'s file ``relpath`` with decorators whose source is ``drop``
    removed and its ``sglang`` imports served by kvpool's private loader."""
    source = resolve_source(version)
    text = source.read(relpath)
    assert text is not None, f"{relpath} not in SGLang {version}"
    tree = ast.parse(text)
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            node.decorator_list = [d for d in node.decorator_list if ast.unparse(d) != drop]
    prefix = load_sglang(version).importer.prefix
    namespace: dict[str, Any] = {"__name__": "sglang_private"}
    exec(compile(rewrite_imports(tree, prefix), source.filename(relpath), "exec"), namespace)
    return namespace


@pytest.fixture(scope="module", params=VERSIONS)
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def fp4_util(version: str) -> Any:
    return _exec(version, FILES[version]["fp4"], "torch.compile")["FP4MXBlock16KVQuantizeUtil"]


@pytest.fixture(scope="module")
def mxfp8(version: str) -> dict[str, Any]:
    namespace = _exec(version, FILES[version]["mxfp8"], "triton.jit")
    namespace["_mxfp8_quant_kernel"] = interpreted(namespace["_mxfp8_quant_kernel"])
    assert namespace["triton"] is triton and namespace["tl"] is tl
    namespace["dequantize"] = _dequantizer(version, namespace)
    return namespace


def _dequantizer(version: str, quant: dict[str, Any]) -> Callable[[Any], torch.Tensor]:
    """The release's MXFP8 dequantiser as ``MXFP8Tensor -> float32 tensor``: 0.5.16's
    ``from_mxfp8``; 0.5.23's ``dequant_mxfp8_2d_to_bf16`` on the 2-D view (bfloat16 out)."""
    if "from_mxfp8" in quant:
        from_mxfp8 = quant["from_mxfp8"]
        return lambda t: from_mxfp8(t, out_dtype=torch.float32)
    assert version != "0.5.16"
    deq = _exec(version, FILES[version]["mxfp8_dequant"], "")["dequant_mxfp8_2d_to_bf16"]

    def dequantize(t: Any) -> torch.Tensor:
        k = t.data.shape[-1]
        out = deq(t.data.reshape(-1, k), t.scale.reshape(-1, k // 32))
        assert out.dtype == torch.bfloat16
        return out.float().reshape(t.data.shape)  # type: ignore[no-any-return]

    return dequantize


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
    back = mxfp8["dequantize"](theirs)
    ours = codes.view(torch.float8_e4m3fn).float().reshape(4, 2, 2, 32)
    ours = ours * torch.exp2(scales.float() - 127).unsqueeze(-1)
    assert torch.equal(back, ours.reshape(4, 2, 64))


def test_tag_heads_survive_sglang_mxfp8(mxfp8: dict[str, Any]) -> None:
    heads = torch.tensor([[mxfp8_tag_head(t, 32)] for t in (1, 77, 16_777_213)])
    back = mxfp8["dequantize"](to_mxfp8_float_output(mxfp8, heads))
    assert torch.equal(back, heads)


def test_page_major_views_match_sglang_layout(version: str) -> None:
    if version != "0.5.16":
        assert resolve_source(version).read(PAGE_MAJOR) is None, "page_major.py is back: test it"
        pytest.skip(
            f"SGLang {version} removed {PAGE_MAJOR} (mha_entry_bytes, "
            "build_page_major_mha_views): its PageMajorMHATokenToKVPool._create_buffers raises "
            "NotImplementedError and ServerArgs refuses --enable-page-major-kv-layout without "
            "--enable-unified-memory, whose envelope views (layout/token_major.py) are another "
            "layout, one kvpool does not model (specs/sglang.md)"
        )
    namespace = _exec(version, PAGE_MAJOR, "")
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
