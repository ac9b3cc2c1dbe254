"""KV tags that survive block-scaled quantisation (FP4 and MXFP8 pools).

A plain float32 pool stores a tag (``< 2**24``, :mod:`kvpool.tags`) as one channel. A 4-bit or
8-bit format cannot hold 24 bits in one value, so a quantised pool spreads the tag over several
channels of the **first scale block**, each holding a digit the format represents exactly:

- channel 0 holds a **marker**, the format's largest value (6 for e2m1, 448 for e4m3). It makes
  the block's amax equal to the format's maximum, so the block scale is exactly ``2**0`` and
  every digit is stored unscaled;
- channels ``1..n`` hold the tag's digits, least significant first: FP4 8 digits of 3 bits as
  ``E2M1_VALUES[d]`` (the positive e2m1 grid), MXFP8 6 digits of 4 bits as the integers 0..15
  (exact in e4m3);
- every other channel is 0.

Reading decodes the dequantised values back; a row whose marker is missing (a slot never
written, or one corrupted by a wrong scale, nibble order or stride) reads tag 0, which no
token's tag equals. FP4 blocks run over the token's flattened heads (one row of
``head_num * head_dim`` values); MXFP8 blocks over one head, so every head carries the tag.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from kvpool.reference.kv.quant import E2M1_MAX, E2M1_VALUES, E4M3_MAX

FP4_DIGIT_BITS: Final[int] = 3
FP4_DIGITS: Final[int] = 8
MXFP8_DIGIT_BITS: Final[int] = 4
MXFP8_DIGITS: Final[int] = 6


def _digits(tag: int, bits: int, count: int) -> list[int]:
    mask = (1 << bits) - 1
    return [(int(tag) >> (bits * i)) & mask for i in range(count)]


def _number(digits: Sequence[int], bits: int) -> int:
    return sum(d << (bits * i) for i, d in enumerate(digits))


def fp4_tag_row(tag: int, width: int) -> list[float]:
    """The flattened row (``width`` values, ``width >= 16``) that stores ``tag`` in FP4."""
    digits = [E2M1_VALUES[d] for d in _digits(tag, FP4_DIGIT_BITS, FP4_DIGITS)]
    return [E2M1_MAX, *digits] + [0.0] * (width - 1 - FP4_DIGITS)


def fp4_read_tag(row: Sequence[float]) -> int:
    """The tag a dequantised flattened row stores (0: no marker or a value off the grid)."""
    if row[0] != E2M1_MAX:
        return 0
    values = row[1 : 1 + FP4_DIGITS]
    if any(v not in E2M1_VALUES for v in values):
        return 0
    return _number([E2M1_VALUES.index(v) for v in values], FP4_DIGIT_BITS)


def mxfp8_tag_head(tag: int, head_dim: int) -> list[float]:
    """One head's channels (``head_dim >= 32``) that store ``tag`` in MXFP8."""
    digits = [float(d) for d in _digits(tag, MXFP8_DIGIT_BITS, MXFP8_DIGITS)]
    return [E4M3_MAX, *digits] + [0.0] * (head_dim - 1 - MXFP8_DIGITS)


def mxfp8_read_tag(head: Sequence[float]) -> int:
    """The tag a dequantised head stores (0: no marker or a digit that is not 0..15)."""
    if head[0] != E4M3_MAX:
        return 0
    values = head[1 : 1 + MXFP8_DIGITS]
    if any(v != int(v) or not 0 <= v < 1 << MXFP8_DIGIT_BITS for v in values):
        return 0
    return _number([int(v) for v in values], MXFP8_DIGIT_BITS)


__all__ = ["fp4_read_tag", "fp4_tag_row", "mxfp8_read_tag", "mxfp8_tag_head"]
