"""create_flashmla_kv_indices: FlashMLA's dense 2-D block table (page ids) for a batch.

Contract (specs/sglang_behaviour.md, section 6):
for request ``b`` with row ``r_b``, length ``len_b`` (tokens)
and start ``s_b = kv_start_idx[b]`` (0 when None), for each page ``j < ceil(len_b / ps)``::

    kv_indices[b, j] = req_to_token[r_b, s_b + j * ps] // ps

    row r_b of req_to_token:  | 36 37 38 39 | 12 13 14 . |      (ps = 4, len_b = 7)
    kv_indices[b]:            |  9  3  <untouched> ...   |

Only the first slot of each page is read: the pages of a request are contiguous and aligned.
``kv_indices`` is int32 ``(bs, max_pages)``; entries past a request's pages are untouched.
Any power-of-two page size, 1 included (then the table is the row itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kvpool.constants import ceil_div
from kvpool.kernels.dispatch import check_page_size, nonempty, run_backend
from kvpool.kernels.host import batch_rows, copy_back, optional_list
from kvpool.kernels.launch import launch, tl

_PAGES_PER_ITERATION = 64


def _flashmla_kv_indices_kernel(  # type: ignore[no-untyped-def]
    req_to_token_ptr,
    row_stride,
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_start_idx_ptr,
    kv_indices_ptr,
    kv_indices_stride,
    HAS_START: tl.constexpr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,  # pages per loop iteration
):
    # One program per request, BLOCK pages per iteration; reads one slot per page.
    pid = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + pid).to(tl.int64)
    length = tl.load(page_kernel_lens_ptr + pid).to(tl.int64)
    start = 0
    if HAS_START:
        start = tl.load(kv_start_idx_ptr + pid).to(tl.int64)
    num_pages = (length + PAGE_SIZE - 1) // PAGE_SIZE
    src = req_to_token_ptr + row * row_stride + start
    dst = kv_indices_ptr + pid.to(tl.int64) * kv_indices_stride
    offs = tl.arange(0, BLOCK)
    for first in range(0, num_pages, BLOCK):
        j = first + offs
        mask = j < num_pages
        slot = tl.load(src + j * PAGE_SIZE, mask=mask, other=0)
        tl.store(dst + j, (slot // PAGE_SIZE).to(tl.int32), mask=mask)


def flashmla_kv_indices_kernel_launch(
    kernel: object,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
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
        page_kernel_lens if kv_start_idx is None else kv_start_idx,  # unread without HAS_START
        nonempty(kv_indices),
        kv_indices.stride(0),
        HAS_START=kv_start_idx is not None,
        PAGE_SIZE=page_size,
        BLOCK=_PAGES_PER_ITERATION,
    )


def flashmla_kv_indices_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Vectorised fallback over the dense ``(bs, max_pages)`` block: gather the first slot of
    every page, keep the old entry where the request has no such page. No host sync."""
    bs = req_pool_indices.numel()
    max_pages = kv_indices.shape[1]
    if bs == 0 or max_pages == 0:
        return
    block = kv_indices[:bs]
    device = req_to_token.device
    lens = page_kernel_lens.to(device=device, dtype=torch.int64)
    start = torch.zeros_like(lens) if kv_start_idx is None else kv_start_idx.to(device).long()
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    j = torch.arange(max_pages, device=device)
    has_page = j[None, :] < ((lens + page_size - 1) // page_size)[:, None]
    cols = (start[:, None] + j[None, :] * page_size).clamp(max=req_to_token.shape[1] - 1)
    pages = req_to_token[rows[:, None], cols] // page_size
    block.copy_(torch.where(has_page, pages.to(block.dtype), block))


def flashmla_kv_indices_ref(
    table: Mapping[int, Sequence[int]] | Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    page_kernel_lens: Sequence[int],
    kv_start_idx: Sequence[int] | None,
    kv_indices: list[list[int]],
    page_size: int,
) -> None:
    """Pure reference over lists: writes into ``kv_indices`` (one list per request) in place."""
    for b, (row, length) in enumerate(zip(req_pool_indices, page_kernel_lens, strict=True)):
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        for j in range(ceil_div(length, page_size)):
            kv_indices[b][j] = table[row][start + j * page_size] // page_size


def flashmla_kv_indices_python(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Run :func:`flashmla_kv_indices_ref` over lists (the batch's rows only), write back."""
    rows = req_pool_indices.tolist()
    out: list[list[int]] = kv_indices.tolist()
    flashmla_kv_indices_ref(
        batch_rows(req_to_token, rows),
        rows,
        page_kernel_lens.tolist(),
        optional_list(kv_start_idx),
        out,
        page_size,
    )
    copy_back(kv_indices, out)


def create_flashmla_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
) -> None:
    """Fill row ``b`` of the int32 block table ``kv_indices`` with request ``b``'s page ids.
    Units: rows, tokens (``page_kernel_lens``, ``kv_start_idx``), page ids (output)."""
    check_page_size(page_size)
    run_backend(
        backend,
        (req_to_token, req_pool_indices, page_kernel_lens, kv_start_idx, kv_indices, page_size),
        kernel=_flashmla_kv_indices_kernel,
        launch=flashmla_kv_indices_kernel_launch,
        torch_impl=flashmla_kv_indices_torch,
        python_impl=flashmla_kv_indices_python,
    )
