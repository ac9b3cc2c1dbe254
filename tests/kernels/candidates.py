"""Candidate kernels for the harness and ``kvpool diff-kernel`` tests: one correct candidate per
op shape, and deliberately broken ones, each with a single bug of a kind that broke real kernels.

Host candidates are plain torch/Python (fast); the ``*_triton`` ones launch small Triton kernels
through the interpreter, for the checked-interpreter findings (races, out-of-bounds stores).
"""

from __future__ import annotations

import torch
import triton.language as tl

from kvpool.constants import NO_LAST_LOC, ceil_div, floor_align
from kvpool.reference.pools.paged_ops import alloc_decode_slots, alloc_extend_slots
from kvpool.testing.kernel_harness.interpreted import interpreted

Tensor = torch.Tensor


def _write(out: Tensor, values: list[int]) -> None:
    if values:
        out[: len(values)].copy_(torch.tensor(values, dtype=out.dtype))


def alloc_extend_ok(
    prefix_lens: Tensor,
    seq_lens: Tensor,
    last_loc: Tensor,
    free_pages: Tensor,
    out_indices: Tensor,
    page_size: int,
) -> None:
    """Correct: the reference over lists."""
    _write(
        out_indices,
        alloc_extend_slots(
            prefix_lens.tolist(),
            seq_lens.tolist(),
            last_loc.tolist(),
            free_pages.tolist(),
            page_size,
        ),
    )


def _extend_variant(
    prefix_lens: Tensor,
    seq_lens: Tensor,
    last_loc: Tensor,
    free_pages: Tensor,
    out_indices: Tensor,
    ps: int,
    *,
    tail_page: int = -1,
    advance_cursor: bool = True,
) -> None:
    """alloc_extend with two switchable bugs: which new page holds the tail, and whether the
    page cursor moves on between requests."""
    out: list[int] = []
    cursor = 0
    free = free_pages.tolist()
    for p, s, loc in zip(prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), strict=True):
        n_new = ceil_div(s, ps) - ceil_div(p, ps)
        pages = free[cursor : cursor + n_new]
        if advance_cursor:
            cursor += n_new
        n1 = min(s, ceil_div(p, ps) * ps) - p
        out += [loc + 1 + k for k in range(n1)]
        full = (floor_align(s, ps) - ceil_div(p, ps) * ps) // ps if p + n1 < s else 0
        for page in pages[:full]:
            out += range(page * ps, (page + 1) * ps)
        tail = s - floor_align(s, ps) if p + n1 < s else 0
        if tail:
            out += range(pages[tail_page] * ps, pages[tail_page] * ps + tail)
    _write(out_indices, out)


def alloc_extend_tail_in_first_page(*args: object) -> None:
    """Bug: the tail (part 3) goes to the request's FIRST new page, not its last."""
    _extend_variant(*args, tail_page=0)  # type: ignore[arg-type]


def alloc_extend_shared_cursor(*args: object) -> None:
    """Bug: every request takes its new pages from the head of the free list."""
    _extend_variant(*args, advance_cursor=False)  # type: ignore[arg-type]


def alloc_extend_ignores_partial_page(
    prefix_lens: Tensor,
    seq_lens: Tensor,
    last_loc: Tensor,
    free_pages: Tensor,
    out_indices: Tensor,
    page_size: int,
) -> None:
    """Bug: a prefix ending mid-page is treated as page-aligned (part 1 skipped, a new page
    started instead of finishing the prefix's page)."""
    aligned = [ceil_div(p, page_size) * page_size for p in prefix_lens.tolist()]
    shifted = [
        s + a - p for p, s, a in zip(prefix_lens.tolist(), seq_lens.tolist(), aligned, strict=True)
    ]
    fake_loc = [a - 1 if a else NO_LAST_LOC for a in aligned]
    _write(
        out_indices, alloc_extend_slots(aligned, shifted, fake_loc, free_pages.tolist(), page_size)
    )


def alloc_extend_past_end(
    prefix_lens: Tensor,
    seq_lens: Tensor,
    last_loc: Tensor,
    free_pages: Tensor,
    out_indices: Tensor,
    page_size: int,
) -> None:
    """Bug: correct values, plus one stray store just past the end of ``out_indices``."""
    alloc_extend_ok(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size)
    n = out_indices.numel()
    spill = torch.empty(0, dtype=out_indices.dtype).set_(
        out_indices.untyped_storage(), out_indices.storage_offset(), (n + 1,), (1,)
    )
    spill[n] = 0


def alloc_decode_wrong_condition(
    seq_lens: Tensor, last_loc: Tensor, free_pages: Tensor, out_indices: Tensor, page_size: int
) -> None:
    """Bug: opens a page when ``S % ps == 0`` instead of ``(S - 1) % ps == 0``."""
    shifted = [s + 1 for s in seq_lens.tolist()]
    _write(
        out_indices, alloc_decode_slots(shifted, last_loc.tolist(), free_pages.tolist(), page_size)
    )


def write_req_to_token_skips_prefix(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    prefix_slots: Tensor,
    prefix_lens: Tensor,
    seq_lens: Tensor,
    out_cache_loc: Tensor,
) -> None:
    """Bug: writes only the new slots (at their right columns), never the prefix."""
    at = 0
    for row, p, s in zip(
        req_pool_indices.tolist(), prefix_lens.tolist(), seq_lens.tolist(), strict=True
    ):
        req_to_token[row, p:s] = out_cache_loc[at : at + s - p].to(req_to_token.dtype)
        at += s - p


def get_last_loc_off_by_one(
    req_to_token: Tensor, req_pool_indices: Tensor, prefix_lens: Tensor
) -> Tensor:
    """Bug: reads column ``P`` instead of ``P - 1``."""
    rows, p = req_pool_indices.tolist(), prefix_lens.tolist()
    vals = [
        int(req_to_token[r, n].item()) if n > 0 else NO_LAST_LOC
        for r, n in zip(rows, p, strict=True)
    ]
    return torch.tensor(vals, dtype=torch.int64)


def flashinfer_ignores_start(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_indptr: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
) -> None:
    """Bug: always copies from column 0, ignoring ``kv_start_idx``."""
    for b, (row, n) in enumerate(
        zip(req_pool_indices.tolist(), page_kernel_lens.tolist(), strict=True)
    ):
        at = int(kv_indptr[b])
        kv_indices[at : at + n] = req_to_token[row, :n]


def flashmla_last_page_dropped(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
    page_size: int,
) -> None:
    """Bug: ``len // ps`` pages instead of ``ceil(len / ps)`` (drops a partial last page)."""
    for b, (row, n) in enumerate(
        zip(req_pool_indices.tolist(), page_kernel_lens.tolist(), strict=True)
    ):
        start = 0 if kv_start_idx is None else int(kv_start_idx[b])
        for j in range(n // page_size):
            kv_indices[b, j] = req_to_token[row, start + j * page_size] // page_size


def flashmla_v2p_ignored(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
    page_size: int,
    v2p: Tensor,
) -> None:
    """Bug: writes the virtual page ids (never translates through ``v2p``)."""
    from kvpool.kernels import create_flashmla_kv_indices

    create_flashmla_kv_indices(
        req_to_token, req_pool_indices, page_kernel_lens, kv_start_idx, kv_indices, page_size,
        backend="torch",
    )  # fmt: skip


def flashmla_v2p_freed_unclamped(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
    page_size: int,
    v2p: Tensor,
) -> None:
    """Bug: a freed (-1) v2p entry is written as -1 instead of the padding page 0."""
    for b, (row, n) in enumerate(
        zip(req_pool_indices.tolist(), page_kernel_lens.tolist(), strict=True)
    ):
        start = 0 if kv_start_idx is None else int(kv_start_idx[b])
        for j in range(-(-n // page_size)):
            slot = int(req_to_token[row, start + j * page_size])
            kv_indices[b, j] = int(v2p[0 if slot < 0 else slot // page_size])


def _decode_kernel(  # type: ignore[no-untyped-def]
    seq_lens, last_loc, free_pages, rank, out, PAGE_SIZE: tl.constexpr
):
    pid = tl.program_id(0)
    s = tl.load(seq_lens + pid)
    if (s - 1) % PAGE_SIZE == 0:
        # Reads free_pages[rank] with no length check: fine when pages suffice.
        tl.store(out + pid, tl.load(free_pages + tl.load(rank + pid)) * PAGE_SIZE)
    else:
        tl.store(out + pid, tl.load(last_loc + pid) + 1)


def alloc_decode_triton(
    seq_lens: Tensor, last_loc: Tensor, free_pages: Tensor, out_indices: Tensor, page_size: int
) -> None:
    """Correct (Triton): each page-opening request's free-list position is precomputed on the
    host. With too few pages it reads past ``free_pages`` (seen only with strict short lists)."""
    opens = ((seq_lens - 1) % page_size == 0).to(torch.int64)
    rank = torch.cumsum(opens, 0) - opens
    interpreted(_decode_kernel)[(seq_lens.numel(),)](
        seq_lens, last_loc, free_pages, rank, out_indices, PAGE_SIZE=page_size
    )


def _decode_counter_kernel(  # type: ignore[no-untyped-def]
    seq_lens, last_loc, free_pages, counter, out, PAGE_SIZE: tl.constexpr
):
    # Bug: the free-list cursor is a shared counter bumped without an atomic.
    pid = tl.program_id(0)
    s = tl.load(seq_lens + pid)
    if (s - 1) % PAGE_SIZE == 0:
        c = tl.load(counter)
        tl.store(counter, c + 1)
        tl.store(out + pid, tl.load(free_pages + c) * PAGE_SIZE)
    else:
        tl.store(out + pid, tl.load(last_loc + pid) + 1)


def alloc_decode_racy_triton(
    seq_lens: Tensor, last_loc: Tensor, free_pages: Tensor, out_indices: Tensor, page_size: int
) -> None:
    """Bug (Triton): right in grid order, but the page cursor is a non-atomic shared counter, so
    on a GPU requests race for pages. Only the shuffle/race checks see it."""
    counter = torch.zeros(1, dtype=torch.int64)
    interpreted(_decode_counter_kernel)[(seq_lens.numel(),)](
        seq_lens, last_loc, free_pages, counter, out_indices, PAGE_SIZE=page_size
    )


def _flashinfer_kernel(  # type: ignore[no-untyped-def]
    table, stride, rows, lens, starts, indptr, out, BLOCK: tl.constexpr, SLACK: tl.constexpr
):
    pid = tl.program_id(0)
    row = tl.load(rows + pid)
    n = tl.load(lens + pid)
    at = tl.load(indptr + pid)
    first = tl.load(starts + pid)
    for start in range(0, n + SLACK, BLOCK):
        k = start + tl.arange(0, BLOCK)
        mask = k < n + SLACK  # SLACK = 1 is the bug: one element too many
        tl.store(out + at + k, tl.load(table + row * stride + first + k, mask=mask), mask=mask)


def flashinfer_triton(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_indptr: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
    slack: int = 0,
) -> None:
    """Triton FlashInfer index builder (correct with ``slack=0``)."""
    if kv_indices.numel() == 0:
        return
    starts = torch.zeros_like(req_pool_indices) if kv_start_idx is None else kv_start_idx
    interpreted(_flashinfer_kernel)[(req_pool_indices.numel(),)](
        req_to_token, req_to_token.stride(0), req_pool_indices, page_kernel_lens, starts,
        kv_indptr, kv_indices, BLOCK=64, SLACK=slack,
    )  # fmt: skip


def flashinfer_off_by_one_triton(
    req_to_token: Tensor,
    req_pool_indices: Tensor,
    page_kernel_lens: Tensor,
    kv_indptr: Tensor,
    kv_start_idx: Tensor | None,
    kv_indices: Tensor,
) -> None:
    """Bug (Triton): each request copies one element too many, over the next request's first
    entry (or past the end of ``kv_indices`` for the last request)."""
    flashinfer_triton(
        req_to_token, req_pool_indices, page_kernel_lens, kv_indptr, kv_start_idx, kv_indices, 1
    )
