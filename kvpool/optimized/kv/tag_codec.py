"""KV tags in FP4 and MXFP8 pools, in torch (twin of :mod:`kvpool.reference.kv.tag_codec`).

Rows are built by the reference's pure functions (the encoding is defined once) and decoded here
in bulk: a row whose marker is missing or whose digits are off the format's grid reads 0.
"""

from __future__ import annotations

import torch

from kvpool.reference.kv.quant import E2M1_MAX, E2M1_VALUES, E4M3_MAX
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


__all__ = ["fp4_read_tags", "fp4_tag_rows", "mxfp8_read_tags", "mxfp8_tag_rows"]
