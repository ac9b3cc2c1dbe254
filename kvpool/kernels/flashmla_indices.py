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

**Virtual-to-physical pages** (SGLang 0.5.23's unified memory pool): with ``v2p`` (int64, one
entry per virtual page id) the table's slots are virtual and each entry is translated::

    v = req_to_token[r_b, s_b + j * ps];  page = 0 if v < 0 else v // ps
    kv_indices[b, j] = max(v2p[page], 0)

so a ``-1`` slot and a freed (``-1``) v2p entry both land on entry 0 (the reserved padding
page), as 0.5.23's FlashMLA / DCP block-table kernel does (specs/sglang_behaviour.md).
``v2p`` must cover every virtual page the windows reach (a value the caller checks; the
wrapper refuses bad metadata before any backend runs).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

import kvpool.kernels.checks as checks
from kvpool.constants import ceil_div
from kvpool.errors import InvalidArgumentError
from kvpool.kernels.dispatch import check_page_size, nonempty, run_backend
from kvpool.kernels.host import batch_rows, copy_back, optional_list
from kvpool.kernels.launch import dense, launch, tl

_PAGES_PER_ITERATION = 64


def _flashmla_kv_indices_kernel(  # type: ignore[no-untyped-def]
    req_to_token_ptr,
    row_stride,
    req_pool_indices_ptr,
    page_kernel_lens_ptr,
    kv_start_idx_ptr,
    kv_indices_ptr,
    kv_indices_stride,
    v2p_ptr,
    HAS_START: tl.constexpr,
    HAS_V2P: tl.constexpr,
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
        page = slot // PAGE_SIZE
        if HAS_V2P:
            # Triton's // truncates toward zero: a negative slot is sent to entry 0 explicitly.
            page = tl.where(slot < 0, 0, page)
            page = tl.maximum(tl.load(v2p_ptr + page, mask=mask, other=0), 0)
        tl.store(dst + j, page.to(tl.int32), mask=mask)


def flashmla_kv_indices_kernel_launch(
    kernel: object,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    v2p: torch.Tensor | None = None,
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
        page_kernel_lens
        if kv_start_idx is None
        else dense(kv_start_idx),  # unread unless HAS_START
        nonempty(kv_indices),
        kv_indices.stride(0),
        page_kernel_lens if v2p is None else dense(v2p),  # unread without HAS_V2P
        HAS_START=kv_start_idx is not None,
        HAS_V2P=v2p is not None,
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
    v2p: torch.Tensor | None = None,
) -> None:
    """Vectorised fallback over the dense ``(bs, max_pages)`` block: gather the first slot of
    every page (translated through ``v2p`` when given), keep the old entry where the request
    has no such page. No host sync."""
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
    slots = req_to_token[rows[:, None], cols]
    pages = slots // page_size
    if v2p is not None:
        # Entries without a page are masked below; send them (and -1 slots) to entry 0 first.
        virtual = torch.where(has_page & (slots >= 0), pages, torch.zeros_like(pages))
        pages = v2p.to(device)[virtual.long()].clamp(min=0)
    block.copy_(torch.where(has_page, pages.to(block.dtype), block))


def flashmla_kv_indices_ref(
    table: Mapping[int, Sequence[int]] | Sequence[Sequence[int]],
    req_pool_indices: Sequence[int],
    page_kernel_lens: Sequence[int],
    kv_start_idx: Sequence[int] | None,
    kv_indices: list[list[int]],
    page_size: int,
    v2p: Sequence[int] | None = None,
) -> None:
    """Pure reference over lists: writes into ``kv_indices`` (one list per request) in place;
    with ``v2p`` each virtual page is translated (module docstring)."""
    for b, (row, length) in enumerate(zip(req_pool_indices, page_kernel_lens, strict=True)):
        start = 0 if kv_start_idx is None else kv_start_idx[b]
        for j in range(ceil_div(length, page_size)):
            slot = table[row][start + j * page_size]
            if v2p is None:
                kv_indices[b][j] = slot // page_size
            else:
                kv_indices[b][j] = max(v2p[0 if slot < 0 else slot // page_size], 0)


def flashmla_kv_indices_python(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    v2p: torch.Tensor | None = None,
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
        optional_list(v2p),
    )
    copy_back(kv_indices, out)


def check_flashmla_kv_indices_args(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    v2p: torch.Tensor | None = None,
) -> None:
    """:func:`create_flashmla_kv_indices`'s metadata contract (:mod:`kvpool.kernels.checks`):
    power-of-two ``page_size``; a 2-D int32/int64 table (with rows when the batch is not
    empty); 1-D int32/int64 ``req_pool_indices``, ``page_kernel_lens`` and ``kv_start_idx``
    (when given) of one length ``bs``; a 2-D int32/int64 ``kv_indices`` of at least ``bs``
    rows; 1-D int32/int64 ``v2p`` (when given); one device."""
    op = "create_flashmla_kv_indices"
    check_page_size(page_size)
    checks.table(op, "req_to_token", req_to_token)
    bs = checks.vector(op, "req_pool_indices", req_pool_indices).numel()
    checks.vector(op, "page_kernel_lens", page_kernel_lens)
    checks.table(op, "kv_indices", kv_indices, output=True)
    checks.batch_lengths(op, "req_pool_indices", bs, page_kernel_lens=page_kernel_lens)
    if kv_start_idx is not None:
        checks.vector(op, "kv_start_idx", kv_start_idx)
        checks.batch_lengths(op, "req_pool_indices", bs, kv_start_idx=kv_start_idx)
    if v2p is not None:
        checks.vector(op, "v2p", v2p)
    if kv_indices.shape[0] < bs:
        raise InvalidArgumentError(
            f"{op}: kv_indices has shape {tuple(kv_indices.shape)}, fewer rows than the "
            f"batch's {bs} requests (one row per request)"
        )
    checks.table_rows(op, "req_to_token", req_to_token, bs)
    checks.same_device(
        op,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        page_kernel_lens=page_kernel_lens,
        kv_start_idx=kv_start_idx,
        kv_indices=kv_indices,
        v2p=v2p,
    )


def create_flashmla_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
    *,
    v2p: torch.Tensor | None = None,
) -> None:
    """Fill row ``b`` of the int32 block table ``kv_indices`` with request ``b``'s page ids
    (physical ids through ``v2p`` when given: virtual page -> physical page, int64).
    Units: rows, tokens (``page_kernel_lens``, ``kv_start_idx``), page ids (output).

    Checked before any backend runs, from metadata only (:func:`check_flashmla_kv_indices_args`):
    ``page_size`` a power of two (PageSizeError); dimensions, int32/int64 dtypes, the output's
    column stride 1, one length ``bs`` for the per-request arrays, at least ``bs`` rows of
    ``kv_indices``, a table with rows for a non-empty batch (InvalidArgumentError); one device, not
    ``meta`` (KernelError). Nothing is written when refused. Values are not read: rows in range,
    each window within its row, enough columns of ``kv_indices`` for ``ceil(len_b / ps)`` pages and
    ``v2p`` covering every virtual page are the caller's to check.
    """
    check_flashmla_kv_indices_args(
        req_to_token, req_pool_indices, page_kernel_lens, kv_start_idx, kv_indices, page_size,
        v2p,
    )  # fmt: skip
    run_backend(
        backend,
        (
            req_to_token,
            req_pool_indices,
            page_kernel_lens,
            kv_start_idx,
            kv_indices,
            page_size,
            v2p,
        ),
        kernel=_flashmla_kv_indices_kernel,
        launch=flashmla_kv_indices_kernel_launch,
        torch_impl=flashmla_kv_indices_torch,
        python_impl=flashmla_kv_indices_python,
    )


def create_flashmla_kv_indices_v2p(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    page_kernel_lens: torch.Tensor,
    kv_start_idx: torch.Tensor | None,
    kv_indices: torch.Tensor,
    page_size: int,
    v2p: torch.Tensor,
    backend: str | None = None,
) -> None:
    """:func:`create_flashmla_kv_indices` with a virtual-to-physical page map (positional, so
    the kernel harness can check it as its own op). ``v2p`` is required: a 1-D int32/int64
    tensor (InvalidArgumentError otherwise); the rest is checked as there."""
    checks.vector("create_flashmla_kv_indices_v2p", "v2p", v2p)
    create_flashmla_kv_indices(
        req_to_token, req_pool_indices, page_kernel_lens, kv_start_idx, kv_indices, page_size,
        backend, v2p=v2p,
    )  # fmt: skip
