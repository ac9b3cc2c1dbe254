"""create_flashinfer_kv_indices: FlashInfer's CSR list of KV slots for a batch.

Contract (specs/sglang_behaviour.md, section 6):
for request ``b`` with row ``r_b``, length ``len_b`` (tokens) and
start ``s_b = kv_start_idx[b]`` (0 when ``kv_start_idx`` is None)::

    kv_indices[kv_indptr[b] : kv_indptr[b] + len_b] = req_to_token[r_b, s_b : s_b + len_b]

    kv_indptr   0        len_0          len_0 + len_1
    kv_indices  | row r_0 slice | row r_1 slice | ... | untouched tail of the buffer |

``kv_indptr`` has ``bs + 1`` entries (callers build ``[0, cumsum(lens)]``; more are ignored);
``kv_indices`` is an int32 buffer at least ``kv_indptr[bs]`` long; entries past the batch's
total are untouched. The wrapper refuses bad metadata before any backend runs; values are the
caller's to check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

import kvpool.kernels.checks as checks
from kvpool.kernels.dispatch import block_for, nonempty, run_backend
from kvpool.kernels.host import batch_rows, copy_back, optional_list
from kvpool.kernels.launch import dense, exclusive_cumsum, launch, tl


def _flashinfer_kv_indices_kernel(  # type: ignore[no-untyped-def]
    req_to_token_ptr,
    row_stride,
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_indptr_ptr,
    kv_start_idx_ptr,
    kv_indices_ptr,
    HAS_START: tl.constexpr,
    BLOCK: tl.constexpr,
):
    # One program per request, copying its slice of the row BLOCK tokens at a time.
    pid = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + pid).to(tl.int64)
    length = tl.load(page_kernel_lens_ptr + pid).to(tl.int64)
    dst = tl.load(kv_indptr_ptr + pid).to(tl.int64)
    start = 0
    if HAS_START:
        start = tl.load(kv_start_idx_ptr + pid).to(tl.int64)
    src = req_to_token_ptr + row * row_stride + start
    offs = tl.arange(0, BLOCK)
    for first in range(0, length, BLOCK):
        k = first + offs
        mask = k < length
        slot = tl.load(src + k, mask=mask)
        tl.store(kv_indices_ptr + dst + k, slot.to(tl.int32), mask=mask)


def flashinfer_kv_indices_kernel_launch(
    kernel: object,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Launch ``kernel``: grid = batch size."""
    req_to_token = dense(req_to_token)
    launch(
        kernel,
        req_pool_indices.numel(),
        1,
        req_to_token,
        req_to_token.stride(0),
        dense(req_pool_indices),
        dense(page_kernel_lens),
        dense(kv_indptr),
        kv_indptr if kv_start_idx is None else dense(kv_start_idx),  # unread without HAS_START
        nonempty(kv_indices),
        HAS_START=kv_start_idx is not None,
        BLOCK=block_for(1),
    )


def flashinfer_kv_indices_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    num_tokens: int | None = None,
) -> None:
    """Vectorised fallback: one gather and one scatter over all ``sum(len)`` tokens. Pass the
    host total ``num_tokens`` to avoid reading it from the device."""
    device = req_to_token.device
    lens = page_kernel_lens.to(device=device, dtype=torch.int64)
    total = int(lens.sum()) if num_tokens is None else num_tokens
    if total == 0:
        return
    bs = lens.numel()
    req = torch.repeat_interleave(torch.arange(bs, device=device), lens, output_size=total)
    k = torch.arange(total, device=device) - exclusive_cumsum(lens)[req]
    start = torch.zeros_like(lens) if kv_start_idx is None else kv_start_idx.to(device).long()
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    slots = req_to_token[rows[req], start[req] + k]
    dst = kv_indptr.to(device=device, dtype=torch.int64)[req] + k
    kv_indices[dst] = slots.to(kv_indices.dtype)


def flashinfer_kv_indices_ref(
    table: Mapping[int, Sequence[int]] | Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    page_kernel_lens: Sequence[int],
    kv_indptr: Sequence[int],
    kv_start_idx: Sequence[int] | None,
    kv_indices: list[int],
) -> None:
    """Pure reference over lists: writes into ``kv_indices`` in place."""
    for b, (row, length) in enumerate(zip(req_pool_indices, page_kernel_lens, strict=True)):
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        dst = kv_indptr[b]
        kv_indices[dst : dst + length] = table[row][start : start + length]


def flashinfer_kv_indices_python(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """Run :func:`flashinfer_kv_indices_ref` over lists (the batch's rows only), write back."""
    rows = req_pool_indices.tolist()
    out: list[int] = kv_indices.tolist()
    flashinfer_kv_indices_ref(
        batch_rows(req_to_token, rows),
        rows,
        page_kernel_lens.tolist(),
        kv_indptr.tolist(),
        optional_list(kv_start_idx),
        out,
    )
    copy_back(kv_indices, out)


def check_flashinfer_kv_indices_args(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
) -> None:
    """:func:`create_flashinfer_kv_indices`'s metadata contract (:mod:`kvpool.kernels.checks`):
    a 2-D int32/int64 table (with rows when the batch is not empty); 1-D int32/int64
    ``req_pool_indices``, ``page_kernel_lens`` and ``kv_start_idx`` (when given) of one length
    ``bs``; 1-D int32/int64 ``kv_indptr`` of ``bs + 1`` entries or more; 1-D int32/int64
    ``kv_indices``; one device."""
    op = "create_flashinfer_kv_indices"
    checks.table(op, "req_to_token", req_to_token)
    bs = checks.vector(op, "req_pool_indices", req_pool_indices).numel()
    checks.vector(op, "page_kernel_lens", page_kernel_lens)
    checks.vector(op, "kv_indptr", kv_indptr)
    checks.vector(op, "kv_indices", kv_indices, output=True)
    checks.batch_lengths(op, "req_pool_indices", bs, page_kernel_lens=page_kernel_lens)
    if kv_start_idx is not None:
        checks.vector(op, "kv_start_idx", kv_start_idx)
        checks.batch_lengths(op, "req_pool_indices", bs, kv_start_idx=kv_start_idx)
    if kv_indptr.shape[0] < bs + 1:
        checks.length(op, "kv_indptr", kv_indptr, bs + 1, "at least bs + 1: [0, cumsum(lens)]")
    checks.table_rows(op, "req_to_token", req_to_token, bs)
    checks.same_device(
        op,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        page_kernel_lens=page_kernel_lens,
        kv_indptr=kv_indptr,
        kv_start_idx=kv_start_idx,
        kv_indices=kv_indices,
    )


def create_flashinfer_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Fill ``kv_indices`` (int32 slots) with each request's slice of its table row, at
    ``kv_indptr[b]``. Units: rows, tokens (``page_kernel_lens``, ``kv_start_idx``), slots.

    Checked before any backend runs, from metadata only (:func:`check_flashinfer_kv_indices_args`):
    dimensions, int32/int64 dtypes, a contiguous output, one length ``bs`` for the per-request
    arrays, ``bs + 1`` entries or more in ``kv_indptr``, a table with rows for a non-empty batch
    (InvalidArgumentError); one device, not ``meta`` (KernelError). Nothing is written when refused.
    Values are not read: rows in range, ``s_b + len_b`` within the row, ``kv_indptr`` the running
    sum of the lengths and ``kv_indices`` at least ``kv_indptr[bs]`` long are the caller's to check.
    """
    check_flashinfer_kv_indices_args(
        req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices
    )
    run_backend(
        backend,
        (req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices),
        kernel=_flashinfer_kv_indices_kernel,
        launch=flashinfer_kv_indices_kernel_launch,
        torch_impl=flashinfer_kv_indices_torch,
        python_impl=flashinfer_kv_indices_python,
    )
