"""KV tags in FP4 and MXFP8 pools, in torch (twin of :mod:`kvpool.reference.kv.tag_codec`).

Rows are built by the reference's pure functions (the encoding is defined once) and decoded here
in bulk: a row whose marker is missing or whose digits are off the format's grid reads 0.
"""

from __future__ import annotations

import functools

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.kv.quant import fp4_quantize, mxfp8_quantize
from kvpool.reference.kv.quant import E2M1_MAX, E2M1_VALUES, E4M3_MAX, FP4_BLOCK, MXFP8_BLOCK
from kvpool.reference.kv.tag_codec import (
    FP4_DIGIT_BITS,
    FP4_DIGITS,
    MXFP8_DIGIT_BITS,
    MXFP8_DIGITS,
    fp4_tag_row,
    mxfp8_tag_head,
)


def fp4_tag_rows(tags: list[int], heads: int, dim: int, device: torch.device) -> torch.Tensor:
    """``(len(tags), heads, dim)`` float32 rows storing ``tags`` in FP4 form."""
    rows = [fp4_tag_row(t, heads * dim) for t in tags]
    return torch.tensor(rows, dtype=torch.float32, device=device).reshape(len(tags), heads, dim)


def mxfp8_tag_rows(tags: list[int], heads: int, dim: int, device: torch.device) -> torch.Tensor:
    """``(len(tags), heads, dim)`` float32 rows storing ``tags`` in every head (MXFP8 form)."""
    rows = [[mxfp8_tag_head(t, dim)] * heads for t in tags]
    return torch.tensor(rows, dtype=torch.float32, device=device).reshape(len(tags), heads, dim)


def _block0_codes(
    tags: list[int],
    bits: int,
    count: int,
    width: int,
    table: dict[float, int],
    marker: float,
    by_digit: npt.NDArray[np.uint8],
) -> npt.NDArray[np.uint8]:
    """The quantised codes ``(n, width)`` of the tags' block 0 (the reference codec's row:
    ``marker``, then ``count`` digits of ``bits`` bits, least significant first, then zeros),
    looked up per value (``table``: value -> code, ``by_digit[d]``: the code of digit ``d``)."""
    values = np.asarray(tags, dtype=np.int64)
    digits = (values[:, None] >> (bits * np.arange(count))) & ((1 << bits) - 1)
    codes = np.full((values.size, width), table[0.0], dtype=np.uint8)
    codes[:, 0] = table[marker]
    codes[:, 1 : 1 + count] = by_digit[digits]
    return codes


def _tiled(block: npt.NDArray[np.uint8], shape: tuple[int, ...]) -> npt.NDArray[np.uint8]:
    """``np.tile(block, shape)`` for a 1-D ``block``: ``shape[-1]`` copies of it along the
    last axis (one broadcast store; ``np.tile``'s Python-level cost dominates at these sizes)."""
    out = np.empty((*shape, block.size), dtype=np.uint8)
    out[...] = block
    return out.reshape(*shape[:-1], shape[-1] * block.size)


@functools.cache
def _fp4_by_digit() -> npt.NDArray[np.uint8]:
    """The 4-bit code of each FP4 tag digit (``fp4_tag_row``'s digit ``d`` is
    ``E2M1_VALUES[d]``), in a block 0 (see :func:`_fp4_tag_block`)."""
    table = _fp4_tag_block()[0]
    return np.asarray([table[v] for v in E2M1_VALUES], dtype=np.uint8)


@functools.cache
def _mxfp8_by_digit() -> npt.NDArray[np.uint8]:
    """The e4m3 byte of each MXFP8 tag digit (``mxfp8_tag_head``'s), in a block 0."""
    table = _mxfp8_tag_block()[0]
    return np.asarray([table[float(d)] for d in range(1 << MXFP8_DIGIT_BITS)], dtype=np.uint8)


@functools.cache
def _fp4_tag_block() -> tuple[dict[float, int], int, npt.NDArray[np.uint8], int]:
    """What :func:`fp4_quantize` makes of a tag row's blocks, asked of it once: the 4-bit code
    of each e2m1 value in a block whose amax is the marker (every tag row's block 0, so every
    such block has the same scale), that scale byte, and the packed bytes and scale byte of an
    all-zero block (every other block)."""
    template = [E2M1_MAX, *E2M1_VALUES] + [0.0] * (FP4_BLOCK - 1 - len(E2M1_VALUES))
    packed, scale = fp4_quantize(torch.tensor(template).reshape(1, 1, FP4_BLOCK))
    pairs = packed.reshape(-1).tolist()
    codes = [c for byte in pairs for c in (byte & 0x0F, byte >> 4)]
    table = {v: codes[1 + i] for i, v in enumerate(E2M1_VALUES)}
    zero_packed, zero_scale = fp4_quantize(torch.zeros((1, 1, FP4_BLOCK)))
    return table, int(scale.item()), zero_packed.reshape(-1).numpy(), int(zero_scale.item())


def fp4_tag_bytes(
    tags: list[int], heads: int, dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``fp4_quantize(fp4_tag_rows(tags, heads, dim, device))``: packed ``(n, heads, dim // 2)``
    and scale ``(n, heads * dim // 16)`` bytes, assembled from the quantiser's own codes. Each
    16-value block is quantised on its own; a tag row's block 0 has the marker as its amax
    (the reference codec's design: scale ``2**0``), so each of its values maps to one code;
    every other block is zero (see :func:`_fp4_tag_block`)."""
    n = len(tags)
    if not n or dim % FP4_BLOCK:  # a block across heads: quantise the whole rows
        return fp4_quantize(fp4_tag_rows(tags, heads, dim, device))
    table, scale, zero_packed, zero_scale = _fp4_tag_block()
    half = FP4_BLOCK // 2
    blocks = heads * dim // FP4_BLOCK
    packed = _tiled(zero_packed, (n, blocks))
    by_digit = _fp4_by_digit()
    codes = _block0_codes(tags, FP4_DIGIT_BITS, FP4_DIGITS, FP4_BLOCK, table, E2M1_MAX, by_digit)
    packed[:, :half] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    scales = np.full((n, blocks), zero_scale, dtype=np.uint8)
    scales[:, 0] = scale
    return (
        torch.from_numpy(packed).reshape(n, heads, dim // 2).to(device),
        torch.from_numpy(scales).to(device),
    )


@functools.cache
def _mxfp8_tag_block() -> tuple[dict[float, int], int, npt.NDArray[np.uint8], int]:
    """As :func:`_fp4_tag_block` for :func:`mxfp8_quantize`: the e4m3 byte of each digit value
    (0..15) and of the marker in a block whose amax is the marker, that block's scale byte, an
    all-zero block's bytes and scale byte."""
    grid = [float(d) for d in range(1 << MXFP8_DIGIT_BITS)]
    template = [E4M3_MAX, *grid] + [0.0] * (MXFP8_BLOCK - 1 - len(grid))
    codes, scale = mxfp8_quantize(torch.tensor(template).reshape(1, 1, MXFP8_BLOCK))
    got = codes.reshape(-1).tolist()
    table = {E4M3_MAX: got[0], **{v: got[1 + i] for i, v in enumerate(grid)}}
    zero_codes, zero_scale = mxfp8_quantize(torch.zeros((1, 1, MXFP8_BLOCK)))
    return table, int(scale.item()), zero_codes.reshape(-1).numpy(), int(zero_scale.item())


def mxfp8_tag_bytes(
    tags: list[int], heads: int, dim: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mxfp8_quantize(mxfp8_tag_rows(tags, heads, dim, device))``: e4m3 ``(n, heads, dim)``
    and scale ``(n, heads, dim // 32)`` bytes, assembled as :func:`fp4_tag_bytes` (every head
    holds the tag in its block 0, marker first; the other blocks are zeros)."""
    n = len(tags)
    if not n or dim % MXFP8_BLOCK:
        return mxfp8_quantize(mxfp8_tag_rows(tags, heads, dim, device))
    table, scale, zero_codes, zero_scale = _mxfp8_tag_block()
    blocks = dim // MXFP8_BLOCK
    codes = _tiled(zero_codes, (n, heads, blocks))
    by_digit = _mxfp8_by_digit()
    first = _block0_codes(
        tags, MXFP8_DIGIT_BITS, MXFP8_DIGITS, MXFP8_BLOCK, table, E4M3_MAX, by_digit
    )
    codes[:, :, :MXFP8_BLOCK] = first[:, None, :]
    scales = np.full((n, heads, blocks), zero_scale, dtype=np.uint8)
    scales[:, :, 0] = scale
    return torch.from_numpy(codes).to(device), torch.from_numpy(scales).to(device)


def _decode(values: torch.Tensor, table: torch.Tensor, bits: int) -> tuple[torch.Tensor, ...]:
    idx = torch.searchsorted(table, values.contiguous()).clamp(max=table.numel() - 1)
    on_grid = (table[idx] == values).all(dim=-1)
    weights = torch.tensor([1 << (bits * i) for i in range(values.shape[-1])], device=idx.device)
    return (idx * weights).sum(dim=-1), on_grid


def fp4_read_tags(flat: torch.Tensor) -> list[int]:
    """Tags of dequantised flattened rows ``(n, width)``."""
    table = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=flat.device)
    tags, on_grid = _decode(flat[:, 1 : 1 + FP4_DIGITS], table, FP4_DIGIT_BITS)
    ok = on_grid & (flat[:, 0] == E2M1_MAX)
    return [int(t) for t in torch.where(ok, tags, 0).tolist()]


def mxfp8_read_tags(heads: torch.Tensor) -> list[int]:
    """Tags of dequantised heads ``(n, head_dim)``."""
    table = torch.arange(1 << MXFP8_DIGIT_BITS, dtype=torch.float32, device=heads.device)
    tags, on_grid = _decode(heads[:, 1 : 1 + MXFP8_DIGITS], table, MXFP8_DIGIT_BITS)
    ok = on_grid & (heads[:, 0] == E4M3_MAX)
    return [int(t) for t in torch.where(ok, tags, 0).tolist()]


# Host decoding (snapshots): the same tags as dequantising with :mod:`kvpool.optimized.kv.quant`
# and decoding above, from the bytes of the first scale block only (the marker and the digits live
# there, under one scale). Every float is made as torch makes it (its exp2 of each scale byte,
# its e4m3 bytes as float32, one float32 multiply), once, into tables indexed by (byte position,
# scale byte, byte): each entry is that byte's digits already shifted into place, or a large
# negative sentinel when the byte cannot belong to a tag (a missing marker, a digit off the
# grid). A row's tag is then the sum of its bytes' entries, 0 when negative.
_SCALE_BIAS = 127
_SENTINEL = -(1 << 28)
"""Below any sum of valid entries (< 2**24) even with every other byte valid; int32-safe."""
_EXP2 = torch.exp2(torch.arange(256, dtype=torch.float32) - _SCALE_BIAS).numpy()
_E4M3 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32).numpy()
_E2M1 = np.asarray(E2M1_VALUES, dtype=np.float32)


def _grid_digits(
    values: npt.NDArray[np.float32], grid: npt.NDArray[np.float32]
) -> npt.NDArray[np.int64]:
    """Each value's index in ``grid`` (as :func:`_decode`), -1 where it is off the grid."""
    idx = np.minimum(np.searchsorted(grid, values), grid.size - 1)
    return np.where(grid[idx] == values, idx, -1)


def _fp4_table() -> npt.NDArray[np.int32]:
    """(5, 256 scales, 256 bytes): the packed bytes 0..4 of a flattened FP4 row carry the marker
    (byte 0 low nibble) then digits 0..7 (byte 4 high nibble unused)."""
    codes = np.arange(16)
    magnitude = _E2M1[codes & 7]
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as in torch, unmarked
        values = np.where((codes & 8) != 0, -magnitude, magnitude)[None, :] * _EXP2[:, None]
    digit = _grid_digits(values, _E2M1)  # (scale, nibble)
    marked = values == np.float32(E2M1_MAX)
    low, high = digit[:, np.arange(256) & 15], digit[:, np.arange(256) >> 4]
    bits = FP4_DIGIT_BITS
    table = np.full((5, 256, 256), _SENTINEL, dtype=np.int64)
    table[0] = np.where(marked[:, np.arange(256) & 15] & (high >= 0), high, _SENTINEL)
    for k in (1, 2, 3):
        pair = (low << (bits * (2 * k - 1))) | (high << (bits * 2 * k))
        table[k] = np.where((low >= 0) & (high >= 0), pair, _SENTINEL)
    table[4] = np.where(low >= 0, low << (bits * (FP4_DIGITS - 1)), _SENTINEL)
    return table.astype(np.int32)


def _mxfp8_table() -> npt.NDArray[np.int32]:
    """(7, 256 scales, 256 bytes): e4m3 bytes 0..6 of a head are the marker then digits 0..5."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as in torch, unmarked
        values = _E4M3[None, :] * _EXP2[:, None]  # (scale, byte)
    grid = np.arange(1 << MXFP8_DIGIT_BITS, dtype=np.float32)
    digit = _grid_digits(values, grid)
    table = np.full((1 + MXFP8_DIGITS, 256, 256), _SENTINEL, dtype=np.int64)
    table[0] = np.where(values == np.float32(E4M3_MAX), 0, _SENTINEL)
    for k in range(1, 1 + MXFP8_DIGITS):
        table[k] = np.where(digit >= 0, digit << (MXFP8_DIGIT_BITS * (k - 1)), _SENTINEL)
    return table.astype(np.int32)


_FP4_TABLE = _fp4_table()
_MXFP8_TABLE = _mxfp8_table()
_POSITIONS = {t.shape[0]: np.arange(t.shape[0])[None, :] for t in (_FP4_TABLE, _MXFP8_TABLE)}
"""``arange(positions)[None, :]`` of each table (made once: the decode's byte positions)."""


def _table_tags(table: npt.NDArray[np.int32], data: npt.NDArray[np.uint8],
                scale0: npt.NDArray[np.uint8]) -> list[int]:  # fmt: skip
    positions = _POSITIONS.get(table.shape[0])
    if positions is None:
        positions = np.arange(table.shape[0])[None, :]
    sums = np.add.reduce(table[positions, scale0[:, None], data[:, : table.shape[0]]], axis=1)
    tags: list[int] = np.maximum(sums, 0).tolist()
    return tags


def fp4_host_tags(packed: npt.NDArray[np.uint8], scale0: npt.NDArray[np.uint8]) -> list[int]:
    """:func:`fp4_read_tags` of the dequantised rows whose flattened packed bytes start with
    ``packed`` (``(n, >= 5)`` uint8: channels 0..9) and whose first block scale is ``scale0``."""
    return _table_tags(_FP4_TABLE, packed, scale0)


def mxfp8_host_tags(codes: npt.NDArray[np.uint8], scale0: npt.NDArray[np.uint8]) -> list[int]:
    """:func:`mxfp8_read_tags` of the dequantised heads whose e4m3 bytes start with ``codes``
    (``(n, >= 7)`` uint8: channels 0..6) and whose first block scale is ``scale0``."""
    return _table_tags(_MXFP8_TABLE, codes, scale0)


__all__ = [
    "fp4_host_tags",
    "fp4_read_tags",
    "fp4_tag_bytes",
    "fp4_tag_rows",
    "mxfp8_host_tags",
    "mxfp8_read_tags",
    "mxfp8_tag_bytes",
    "mxfp8_tag_rows",
]
