"""Block-scaled KV formats in torch (twin of :mod:`kvpool.reference.kv.quant`; same bytes).

FP4 (SGLang's FP4MXBlock16): ``fp4_quantize(x)`` maps ``(n, heads, dim)`` float32 to packed
``(n, heads, dim // 2)`` uint8 and ``(n, heads * dim // 16)`` scale bytes; ``fp4_dequantize``
inverts it. MXFP8: ``mxfp8_quantize(x)`` maps ``(n, heads, dim)`` to e4m3 bytes of the same
shape and ``(n, heads, dim // 32)`` UE8M0 scale bytes. The block exponent
``ceil(log2(y))`` is taken exactly from ``torch.frexp`` (as the reference), not from a float
``log2``. All host-sync free.
"""

from __future__ import annotations

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.reference.kv.quant import (
    E2M1_BOUNDS,
    E2M1_MAX,
    E2M1_VALUES,
    E4M3_MAX,
    FP4_BLOCK,
    MXFP8_BLOCK,
    SCALE_BIAS,
)


def ceil_log2(y: torch.Tensor) -> torch.Tensor:
    """Exact ``ceil(log2(y))`` of positive finite float32 ``y`` (int32)."""
    mantissa, exponent = torch.frexp(y)
    return torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.int32)


def check_finite(x: torch.Tensor) -> None:
    """InvalidArgumentError if ``x`` holds NaN or infinity (one host read)."""
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise InvalidArgumentError("KV values must be finite to be quantised")


def as_float32(data: torch.Tensor, scale: float | None) -> torch.Tensor:
    """``data`` as a NEW float32 tensor divided by ``scale`` (float32 arithmetic)."""
    x = data.to(torch.float32)
    if scale is not None:
        x = x / torch.tensor(float(scale), dtype=torch.float32, device=x.device)
    return x.clone() if x.data_ptr() == data.data_ptr() else x


def fp4_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(n, heads, dim)`` -> (packed ``(n, heads, dim // 2)``, scales
    ``(n, heads * dim // 16)``), both uint8."""
    n, heads, dim = x.shape
    blocks = x.reshape(n, heads * dim // FP4_BLOCK, FP4_BLOCK)
    amax = blocks.abs().amax(dim=-1)
    y = torch.clamp(amax / E2M1_MAX, min=torch.tensor(1e-10, dtype=torch.float32).item())
    exponent = ceil_log2(y)
    scaled = blocks / torch.exp2(exponent.to(torch.float32)).unsqueeze(-1)
    bounds = torch.tensor(E2M1_BOUNDS, dtype=torch.float32, device=x.device)
    magnitude = (scaled.abs().unsqueeze(-1) >= bounds).sum(dim=-1).to(torch.uint8)
    codes = (magnitude | ((scaled < 0).to(torch.uint8) << 3)).reshape(n, heads, dim)
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return packed, (exponent + SCALE_BIAS).to(torch.uint8)


def fp4_dequantize(packed: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`fp4_quantize`: float32 ``(n, heads, 2 * packed.shape[-1])``."""
    n, heads, half = packed.shape
    codes = torch.stack((packed & 0x0F, packed >> 4), dim=-1).reshape(n, heads * half * 2)
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=packed.device)
    values = table[(codes & 7).long()]
    values = torch.where((codes & 8) != 0, -values, values)
    exponent = scales.to(torch.float32) - SCALE_BIAS
    out = values.reshape(n, -1, FP4_BLOCK) * torch.exp2(exponent).unsqueeze(-1)
    return out.reshape(n, heads, half * 2)


def mxfp8_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``(n, heads, dim)`` -> (e4m3 bytes ``(n, heads, dim)``, UE8M0 scale bytes
    ``(n, heads, dim // 32)``), both uint8."""
    n, heads, dim = x.shape
    blocks = x.reshape(n, heads, dim // MXFP8_BLOCK, MXFP8_BLOCK)
    amax = torch.clamp(blocks.abs().amax(dim=-1), min=torch.tensor(1e-30).item())
    biased = torch.clamp(ceil_log2(amax / E4M3_MAX) + SCALE_BIAS, 0, 254)
    descale = torch.exp2((biased - SCALE_BIAS).to(torch.float32)).unsqueeze(-1)
    q = torch.clamp(blocks / descale, -E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return q.view(torch.uint8).reshape(n, heads, dim), biased.to(torch.uint8)


def mxfp8_dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`mxfp8_quantize`: float32 of ``codes``' shape."""
    n, heads, dim = codes.shape
    values = codes.view(torch.float8_e4m3fn).to(torch.float32)
    descale = torch.exp2(scales.to(torch.float32) - SCALE_BIAS).unsqueeze(-1)
    blocks = values.reshape(n, heads, dim // MXFP8_BLOCK, MXFP8_BLOCK) * descale
    return blocks.reshape(n, heads, dim)


__all__ = [
    "as_float32",
    "ceil_log2",
    "check_finite",
    "fp4_dequantize",
    "fp4_quantize",
    "mxfp8_dequantize",
    "mxfp8_quantize",
]
