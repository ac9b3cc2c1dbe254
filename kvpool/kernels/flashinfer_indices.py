"""create_flashinfer_kv_indices: FlashInfer's CSR list of KV slots for a batch.

Contract (specs/sglang_behaviour.md, section 6):
for request ``b`` with row ``r_b``, length ``len_b`` (tokens) and
start ``s_b = kv_start_idx[b]`` (0 when ``kv_start_idx`` is None)::

    kv_indices[kv_indptr[b] : kv_indptr[b] + len_b] = req_to_token[r_b, s_b : s_b + len_b]

    kv_indptr   0        len_0          len_0 + len_1
    kv_indices  | row r_0 slice | row r_1 slice | ... | untouched tail of the buffer |

``kv_indptr`` has ``bs + 1`` entries (callers build ``[0, cumsum(lens)]``); ``kv_indices`` is an
int32 buffer at least ``kv_indptr[bs]`` long; entries past the batch's total are untouched.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvpool.kernels.dispatch import block_for, nonempty, run_backend
from kvpool.kernels.host import batch_rows, copy_back, optional_list
from kvpool.kernels.launch import exclusive_cumsum, launch, tl


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
    launch(
        kernel,
        req_pool_indices.numel(),
        1,
        req_to_token,
        req_to_token.stride(0),
        req_pool_indices,
        page_kernel_lens,
        kv_indptr,
        kv_indptr if kv_start_idx is None else kv_start_idx,  # never read without HAS_START
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
    ``kv_indptr[b]``. Units: rows, tokens (``page_kernel_lens``, ``kv_start_idx``), slots."""
    run_backend(
        backend,
        (req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices),
        kernel=_flashinfer_kv_indices_kernel,
        launch=flashinfer_kv_indices_kernel_launch,
        torch_impl=flashinfer_kv_indices_torch,
        python_impl=flashinfer_kv_indices_python,
    )
