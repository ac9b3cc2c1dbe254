"""Block-scaled low-precision KV formats in pure Python: SGLang's FP4 (e2m1, 16-value blocks) and
MXFP8 (e4m3, 32-value blocks), bit for bit.

**FP4** (SGLang's ``FP4MXBlock16KVQuantizeUtil``): a token's row of ``W`` values (all heads,
flattened; ``W % 16 == 0``) is cut into blocks of 16. Each block stores one scale byte
``s = e + 127`` where ``e = ceil(log2(max(amax / 6, 1e-10)))`` (amax: the block's largest magnitude,
all arithmetic in float32), and 16 e2m1 codes of ``x / 2**e``: bit 3 is the sign (set when the
scaled value is negative), bits 0..2 the index of the magnitude in ``E2M1_VALUES``
(``0, 0.5, 1, 1.5, 2, 3, 4, 6``), chosen as the number of bounds ``0.25, 0.75, 1.25, 1.75, 2.5, 3.5,
5`` that the magnitude reaches (ties round up; above 6 saturates at 6). Two codes share a byte:
value ``2i`` in the low nibble, ``2i + 1`` in the high nibble. Decoding is
``E2M1_VALUES[code] * 2**(s - 127)``; error per value at most half a step of its block's grid
(``2**e * 0.25`` below 2 times the block scale, ``2**e * 1`` above 4, clamped at ``6 * 2**e``).

**MXFP8** (SGLang's ``to_mxfp8`` / ``from_mxfp8``): per head, blocks of 32 channels; scale byte
``s = clamp(ceil(log2(max(amax, 1e-30) / 448)) + 127, 0, 254)`` (UE8M0: a power of two), values
``clamp(x / 2**(s - 127), -448, 448)`` rounded to float8 e4m3fn (round to nearest, ties to even;
3 mantissa bits, bias 7, subnormal step ``2**-9``). Decoding is ``e4m3(code) * 2**(s - 127)``;
relative error at most ``2**-4`` for values in the normal range of the block.

``ceil(log2(y))`` is computed exactly (from the float's exponent and mantissa), where SGLang takes
a float32 ``log2``; the two agree except for ``y`` within a float32 rounding of a power of two
above it (specs/kv_variants.md).
"""

from __future__ import annotations

import bisect
import math
import struct
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

from kvpool.errors import InvalidArgumentError

FP4_BLOCK: Final[int] = 16
"""Values per FP4 scale (SGLang's ``scale_block_size``)."""
E2M1_MAX: Final[float] = 6.0
E2M1_VALUES: Final[tuple[float, ...]] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Magnitude of each 3-bit e2m1 code (bit 3 is the sign)."""
E2M1_BOUNDS: Final[tuple[float, ...]] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
MXFP8_BLOCK: Final[int] = 32
"""Channels per MXFP8 scale (SGLang's ``MXFP8_SCALE_BLOCK_SIZE``)."""
E4M3_MAX: Final[float] = 448.0
SCALE_BIAS: Final[int] = 127


def f32(x: float) -> float:
    """``x`` rounded to the nearest float32 (ties to even), as a Python float; beyond float32's
    range, infinity of its sign (as a cast to float32 gives)."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", x))[0])
    except OverflowError:
        return math.copysign(math.inf, x)


def f32_all(values: Sequence[float]) -> list[float]:
    """``[f32(v) for v in values]``, in one pack and unpack (a quantised row is hundreds of
    values and the lockstep harness quantises on most steps); values beyond float32's range
    fall back to :func:`f32` one by one."""
    n = len(values)
    try:
        return list(struct.unpack(f"<{n}f", struct.pack(f"<{n}f", *values)))
    except OverflowError:
        return [f32(v) for v in values]


def div32(x: float, scale: float | None) -> float:
    """``x / scale`` in float32 arithmetic (both operands rounded to float32 first); ``x`` as
    float32 when ``scale`` is None."""
    return f32(x) if scale is None else f32(f32(x) / f32(float(scale)))


def div32_all(values: Sequence[float], scale: float | None) -> list[float]:
    """``[div32(v, scale) for v in values]`` through :func:`f32_all`."""
    rounded = f32_all(values)
    if scale is None:
        return rounded
    divisor = f32(float(scale))
    return f32_all([v / divisor for v in rounded])


def ceil_log2(y: float) -> int:
    """Exact ``ceil(log2(y))`` for a positive finite ``y``."""
    mantissa, exponent = math.frexp(y)  # y = mantissa * 2**exponent, 0.5 <= mantissa < 1
    return exponent - 1 if mantissa == 0.5 else exponent


def check_finite(values: Sequence[float]) -> None:
    """InvalidArgumentError if any value is NaN or infinite (the formats have no such codes)."""
    if not all(math.isfinite(v) for v in values):
        raise InvalidArgumentError("KV values must be finite to be quantised")


# ------------------------------------------------------------------------------------- FP4
def fp4_block_exponent(block: Sequence[float]) -> int:
    """The power-of-two exponent ``e`` of one 16-value block (scale byte ``e + 127``)."""
    amax = max(map(abs, f32_all(block)))
    return ceil_log2(max(f32(amax / E2M1_MAX), f32(1e-10)))


def fp4_code(scaled: float) -> int:
    """The 4-bit e2m1 code of an already scaled value."""
    # the bounds ascend: the count of bounds <= |scaled| is bisect_right's insertion point
    magnitude = bisect.bisect_right(E2M1_BOUNDS, abs(scaled))
    return (8 if scaled < 0 else 0) | magnitude


def _exact_key(values: Sequence[float]) -> bytes:
    """The values' float64 bits: a memo key that tells ``-0.0`` from ``0.0`` (equal, and of
    equal hash, as floats, but the sign bit is stored)."""
    return struct.pack(f"<{len(values)}d", *values)


def fp4_quantize_row(row: Sequence[float]) -> tuple[list[int], list[int]]:
    """One token's flattened row (``len(row) % 16 == 0``) -> (``len/2`` packed bytes,
    ``len/16`` scale bytes)."""
    if len(row) % FP4_BLOCK:
        raise InvalidArgumentError(f"FP4 rows need a multiple of {FP4_BLOCK} values")
    packed, scales = _fp4_quantize(_exact_key(row))
    return list(packed), list(scales)


@lru_cache(maxsize=1024)
def _fp4_quantize(key: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`fp4_quantize_row` of the row whose float64 bits are ``key``. Memoised (a pure
    function): a pool stores a tag row in K and V of every layer, the same row each time."""
    row = struct.unpack(f"<{len(key) // 8}d", key)
    codes: list[int] = []
    scales: list[int] = []
    values = f32_all(row)
    for start in range(0, len(values), FP4_BLOCK):
        block = values[start : start + FP4_BLOCK]
        if not any(block):  # all +-0 (most of a tag row): the scale of amax 0, every code 0
            scales.append(_FP4_ZERO_SCALE)
            codes.extend(_FP4_ZERO_CODES)
            continue
        e = fp4_block_exponent(block)
        scales.append(e + SCALE_BIAS)
        codes.extend(fp4_code(v / 2.0**e) for v in block)
    packed = tuple(codes[i] | (codes[i + 1] << 4) for i in range(0, len(codes), 2))
    return packed, tuple(scales)


def fp4_value(code: int) -> float:
    """The e2m1 value of a 4-bit code (code 8 decodes to -0.0, as SGLang's table)."""
    magnitude = E2M1_VALUES[code & 7]
    return -magnitude if code & 8 else magnitude


_FP4_BYTE_VALUES: Final[tuple[tuple[float, float], ...]] = tuple(
    (fp4_value(b & 0x0F), fp4_value(b >> 4)) for b in range(256)
)
"""Each packed byte's two values (low nibble first), unscaled."""
_FP4_ZERO_SCALE: Final[int] = fp4_block_exponent([0.0] * FP4_BLOCK) + SCALE_BIAS
"""The scale byte of a block of zeros (amax 0: the 1e-10 floor's exponent)."""
_FP4_ZERO_CODES: Final[tuple[int, ...]] = (0,) * FP4_BLOCK


def fp4_dequantize_row(packed: Sequence[int], scales: Sequence[int]) -> list[float]:
    """Inverse of :func:`fp4_quantize_row`: ``2 * len(packed)`` floats."""
    out: list[float] = []
    per = FP4_BLOCK // 2  # bytes per scale
    for b in range((len(packed) + per - 1) // per):
        scale = 2.0 ** (scales[b] - SCALE_BIAS)
        for byte in packed[b * per : (b + 1) * per]:
            low, high = _FP4_BYTE_VALUES[byte]
            out.append(low * scale)
            out.append(high * scale)
    return out


# ------------------------------------------------------------------------------------ e4m3
def e4m3_code(x: float) -> int:
    """float8 e4m3fn byte of ``x`` (``|x| <= 448``), round to nearest, ties to even."""
    sign = 0x80 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == 0.0:
        return sign
    exponent = math.frexp(a)[1] - 1  # a = 1.m * 2**exponent
    quantum = 2.0**-9 if exponent < -6 else 2.0 ** (exponent - 3)
    q = round(a / quantum) * quantum  # Python rounds half to even; a / quantum is exact
    if q == 0.0:
        return sign
    if q < 2.0**-6:
        return sign | int(q / 2.0**-9)
    e = math.frexp(q)[1] - 1
    mantissa = int(q / 2.0**e * 8) - 8
    return sign | ((e + 7) << 3) | mantissa


def e4m3_value(code: int) -> float:
    """The value of a float8 e4m3fn byte (0x7F / 0xFF, NaN, never produced here)."""
    exponent, mantissa = (code >> 3) & 0x0F, code & 0x07
    magnitude = mantissa * 2.0**-9 if exponent == 0 else (8 + mantissa) * 2.0 ** (exponent - 10)
    return -magnitude if code & 0x80 else magnitude


def mxfp8_quantize_head(values: Sequence[float]) -> tuple[list[int], list[int]]:
    """One head's channels (``len % 32 == 0``) -> (e4m3 bytes, one UE8M0 scale byte per 32)."""
    if len(values) % MXFP8_BLOCK:
        raise InvalidArgumentError(f"MXFP8 heads need a multiple of {MXFP8_BLOCK} channels")
    codes, scales = _mxfp8_quantize(_exact_key(values))
    return list(codes), list(scales)


@lru_cache(maxsize=1024)
def _mxfp8_quantize(key: bytes) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """:func:`mxfp8_quantize_head` of the head whose float64 bits are ``key``. Memoised (a pure
    function): a tag is stored in every head of K and V of every layer."""
    values = struct.unpack(f"<{len(key) // 8}d", key)
    codes: list[int] = []
    scales: list[int] = []
    for start in range(0, len(values), MXFP8_BLOCK):
        block = f32_all(values[start : start + MXFP8_BLOCK])
        amax = max(max(map(abs, block)), f32(1e-30))
        s = min(max(ceil_log2(f32(amax / E4M3_MAX)) + SCALE_BIAS, 0), 254)
        scales.append(s)
        descale = 2.0 ** (s - SCALE_BIAS)
        scaled = f32_all([v / descale for v in block])
        codes.extend(e4m3_code(min(max(v, -E4M3_MAX), E4M3_MAX)) for v in scaled)
    return tuple(codes), tuple(scales)


def mxfp8_dequantize_head(codes: Sequence[int], scales: Sequence[int]) -> list[float]:
    """Inverse of :func:`mxfp8_quantize_head`."""
    return [
        e4m3_value(c) * 2.0 ** (scales[i // MXFP8_BLOCK] - SCALE_BIAS) for i, c in enumerate(codes)
    ]


__all__ = [
    "E2M1_BOUNDS",
    "E2M1_MAX",
    "E2M1_VALUES",
    "E4M3_MAX",
    "FP4_BLOCK",
    "MXFP8_BLOCK",
    "SCALE_BIAS",
    "ceil_log2",
    "check_finite",
    "div32",
    "div32_all",
    "e4m3_code",
    "e4m3_value",
    "f32",
    "f32_all",
    "fp4_block_exponent",
    "fp4_code",
    "fp4_dequantize_row",
    "fp4_quantize_row",
    "mxfp8_dequantize_head",
    "mxfp8_quantize_head",
]
