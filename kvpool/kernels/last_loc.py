"""get_last_loc: the slot of each request's last prefix token, or -1 for an empty prefix.

Contract: ``out[b] = req_to_token[req_pool_indices[b], P_b - 1]`` when ``P_b > 0``, else
``NO_LAST_LOC`` (-1); int64, one entry per request. It feeds ``alloc_extend``'s ``last_loc``::

    row r_b:  | s0 | s1 | ... | s_{P-1} | ...      ->  out[b] = s_{P-1}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

import kvpool.kernels.checks as checks
from kvpool.constants import NO_LAST_LOC
from kvpool.kernels.dispatch import get_kernel, is_kernel_backend, resolve_backend, write_back
from kvpool.kernels.host import batch_rows
from kvpool.kernels.launch import dense, launch, tl

_REQUESTS_PER_PROGRAM = 128


def _get_last_loc_kernel(  # type: ignore[no-untyped-def]
    req_to_token_ptr,
    row_stride,
    req_pool_indices_ptr,
    prefix_lens_ptr,
    out_ptr,
    bs,
    NO_LAST: tl.constexpr,
    BLOCK: tl.constexpr,  # requests per program
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < bs
    p = tl.load(prefix_lens_ptr + offs, mask=mask, other=0).to(tl.int64)
    row = tl.load(req_pool_indices_ptr + offs, mask=mask, other=0).to(tl.int64)
    has_prefix = p > 0
    slot = tl.load(req_to_token_ptr + row * row_stride + p - 1, mask=mask & has_prefix, other=0)
    tl.store(out_ptr + offs, tl.where(has_prefix, slot.to(tl.int64), NO_LAST), mask=mask)


def get_last_loc_kernel_launch(
    kernel: object,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    out: torch.Tensor,
) -> None:
    """Launch ``kernel`` into int64 ``out``: one program per ``BLOCK`` requests."""
    bs = req_pool_indices.numel()
    req_to_token = dense(req_to_token)
    launch(
        kernel,
        bs,
        _REQUESTS_PER_PROGRAM,
        req_to_token,
        req_to_token.stride(0),
        dense(req_pool_indices),
        dense(prefix_lens),
        out,
        bs,
        NO_LAST=NO_LAST_LOC,
        BLOCK=_REQUESTS_PER_PROGRAM,
    )


def get_last_loc_torch(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> torch.Tensor:
    """Vectorised fallback: one gather, then -1 where the prefix is empty."""
    device = req_to_token.device
    p = prefix_lens.to(device=device, dtype=torch.int64)
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    slots = req_to_token[rows, (p - 1).clamp(min=0)].to(torch.int64)
    return torch.where(p > 0, slots, torch.full_like(slots, NO_LAST_LOC))


def get_last_loc_host(
    req_to_token: torch.Tensor, rows: Sequence[int], prefix_lens: Sequence[int]
) -> torch.Tensor | None:
    """:func:`get_last_loc` for a caller that holds the rows and lengths on the host and a CPU
    table (a checked-mode twin: host work is no device read there): the same int64 ``(bs,)``
    values read through a NumPy view of the table. None when it cannot (a table off the CPU
    or not 2-D, a cell outside it): the caller then runs the kernel."""
    if req_to_token.device.type != "cpu" or req_to_token.dim() != 2:
        return None
    table = req_to_token.numpy()
    height, width = table.shape
    out = []
    for r, p in zip(rows, prefix_lens, strict=True):
        if not (-height <= r < height and 0 <= p <= width):
            return None
        out.append(table[r, p - 1] if p > 0 else NO_LAST_LOC)
    return torch.from_numpy(np.array(out, dtype=np.int64))


def get_last_loc_ref(
    table: Mapping[int, Sequence[int]] | Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    prefix_lens: Sequence[int],
) -> list[int]:
    """Pure reference over lists (``table[row]`` is that row's list of slots)."""
    return [
        table[r][p - 1] if p > 0 else NO_LAST_LOC
        for r, p in zip(req_pool_indices, prefix_lens, strict=True)
    ]


def check_get_last_loc_args(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> None:
    """:func:`get_last_loc`'s metadata contract (:mod:`kvpool.kernels.checks`): a 2-D
    int32/int64 table (with rows when the batch is not empty), 1-D int32/int64
    ``req_pool_indices`` and ``prefix_lens`` of one length, one device."""
    op = "get_last_loc"
    checks.table(op, "req_to_token", req_to_token)
    bs = checks.vector(op, "req_pool_indices", req_pool_indices).numel()
    checks.vector(op, "prefix_lens", prefix_lens)
    checks.batch_lengths(op, "req_pool_indices", bs, prefix_lens=prefix_lens)
    checks.table_rows(op, "req_to_token", req_to_token, bs)
    checks.same_device(
        op, req_to_token=req_to_token, req_pool_indices=req_pool_indices, prefix_lens=prefix_lens
    )


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    backend: str | None = None,
) -> torch.Tensor:
    """Return int64 ``(bs,)`` on ``req_to_token``'s device: the slot of token ``P_b - 1`` of each
    request's row, or ``NO_LAST_LOC`` (-1) where ``P_b == 0``. Units: rows, tokens, slots.

    Checked before any backend runs, from metadata only (:func:`check_get_last_loc_args`):
    dimensions, int32/int64 dtypes, one length, a table with rows for a non-empty batch
    (InvalidArgumentError); one device, not ``meta`` (KernelError). Values are not read: rows in
    range and ``0 <= P_b <= max_context_len`` are the caller's to check.
    """
    check_get_last_loc_args(req_to_token, req_pool_indices, prefix_lens)
    name = resolve_backend(backend, req_to_token, req_pool_indices, prefix_lens)
    if name == "torch":
        return get_last_loc_torch(req_to_token, req_pool_indices, prefix_lens)
    out = torch.empty(req_pool_indices.numel(), dtype=torch.int64, device=req_to_token.device)
    if is_kernel_backend(name):
        kernel = get_kernel(_get_last_loc_kernel, name)
        get_last_loc_kernel_launch(kernel, req_to_token, req_pool_indices, prefix_lens, out)
    else:
        rows = req_pool_indices.tolist()
        table = batch_rows(req_to_token, rows)
        write_back(out, get_last_loc_ref(table, rows, prefix_lens.tolist()))
    return out
