"""alloc_decode: one slot per request for its new token (position ``S - 1``).

Contract (specs/sglang_behaviour.md, section 4):
``seq_lens`` counts the new token. A request whose new token
opens a page (``(S - 1) % ps == 0``) takes the first slot of the next free page, pages handed
out in batch order from the head of ``free_pages``; any other request gets ``last_loc + 1``::

    request      0         1          2         3
    (S-1) % ps   0         2          0         1
    slot         f[0]*ps   loc1 + 1   f[1]*ps   loc3 + 1      (f = free_pages)

The kernel only reads ``free_pages``; capacity and values are the caller's job, bad metadata
(shapes, dtypes, lengths, devices) is refused by the wrapper before any backend runs.
"""

from __future__ import annotations

import numpy as np
import torch

import kvpool.kernels.checks as checks
from kvpool.kernels.dispatch import (
    check_page_size,
    nonempty,
    resolve_backend,
    run_backend,
    write_back,
)
from kvpool.kernels.host import HostLens, Int64Array, host_copy, page_opening_requests, to_device
from kvpool.kernels.launch import dense, exclusive_cumsum, launch, tl
from kvpool.reference.pools.paged_ops import alloc_decode_slots

_REQUESTS_PER_PROGRAM = 128


def _alloc_decode_kernel(  # type: ignore[no-untyped-def]
    seq_lens_ptr,
    last_loc_ptr,
    free_pages_ptr,
    page_rank_ptr,  # exclusive prefix count of page-opening requests, precomputed on the device
    out_ptr,
    bs,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,  # requests per program
):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < bs
    s = tl.load(seq_lens_ptr + offs, mask=mask, other=1).to(tl.int64)
    last_loc = tl.load(last_loc_ptr + offs, mask=mask, other=0).to(tl.int64)
    opens_page = (s - 1) % PAGE_SIZE == 0
    rank = tl.load(page_rank_ptr + offs, mask=mask, other=0)
    page = tl.load(free_pages_ptr + rank, mask=mask & opens_page, other=0).to(tl.int64)
    slot = tl.where(opens_page, page * PAGE_SIZE, last_loc + 1)
    tl.store(out_ptr + offs, slot, mask=mask)


def _page_rank(seq_lens: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(opens_page mask, exclusive count of earlier page-opening requests) on the device."""
    opens = (seq_lens.to(torch.int64) - 1) % page_size == 0
    return opens, exclusive_cumsum(opens)


def alloc_decode_kernel_launch(
    kernel: object,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Launch ``kernel``: one program per ``BLOCK`` requests."""
    bs = seq_lens.numel()
    _, rank = _page_rank(seq_lens, page_size)
    launch(
        kernel,
        bs,
        _REQUESTS_PER_PROGRAM,
        dense(seq_lens),
        dense(last_loc),
        nonempty(dense(free_pages)),  # empty when no request opens a page
        rank,
        out_indices,
        bs,
        PAGE_SIZE=page_size,
        BLOCK=_REQUESTS_PER_PROGRAM,
    )


def alloc_decode_torch(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    *,
    seq_lens_cpu: HostLens | None = None,
    opens_cpu: Int64Array | None = None,
) -> None:
    """Vectorised fallback, no host sync. With a host copy of ``seq_lens`` (given, or the tensor
    itself on the CPU) the page-opening requests are found on the host (or given directly as
    ``opens_cpu``, :func:`~kvpool.kernels.host.page_opening_requests`) and the device does
    ``last_loc + 1`` and one indexed copy; without one, a device prefix count ranks them."""
    bs = seq_lens.numel()
    if bs == 0:
        return
    if opens_cpu is None:
        seq_lens_cpu = host_copy(seq_lens, seq_lens_cpu)
        if seq_lens_cpu is None:
            _alloc_decode_ranked(seq_lens, last_loc, free_pages, out_indices, page_size)
            return
        opens_cpu = page_opening_requests(seq_lens_cpu, page_size)
    n = int(opens_cpu.size)
    if _host_int64(out_indices, last_loc, free_pages):
        _alloc_decode_host(last_loc, free_pages, out_indices, page_size, opens_cpu, n)
        return
    device = out_indices.device
    dtype = out_indices.dtype
    if n < bs:
        if last_loc.dtype is not dtype or last_loc.device != device:
            last_loc = last_loc.to(device=device, dtype=dtype)
        torch.add(last_loc, 1, out=out_indices)
    if n:
        first_slots = free_pages if free_pages.numel() == n else free_pages[:n]
        if first_slots.dtype is not dtype or first_slots.device != device:
            first_slots = first_slots.to(device=device, dtype=dtype)
        first_slots = first_slots << (page_size.bit_length() - 1)
        if n == bs:
            out_indices.copy_(first_slots)
        else:
            out_indices.index_copy_(0, to_device(opens_cpu, device), first_slots)


def _host_int64(*tensors: torch.Tensor) -> bool:
    """True when every tensor is a 1-D int64 CPU tensor (numpy can view it without a copy)."""
    return all(t.is_cpu and t.dtype is torch.int64 and t.dim() == 1 for t in tensors)


def _alloc_decode_host(
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    opens: Int64Array,
    n: int,
) -> None:
    """The CPU form of the planned fallback, on numpy views of the tensors (the same two steps,
    ``last_loc + 1`` and the new pages' first slots at ``opens``, without torch's per-operation
    dispatch cost: about a third of it on small batches)."""
    out = out_indices.numpy()
    if n == out.size:
        np.left_shift(free_pages.numpy()[:n], page_size.bit_length() - 1, out=out)
        return
    np.add(last_loc.numpy(), 1, out=out)
    if n:
        out[opens] = free_pages.numpy()[:n] << (page_size.bit_length() - 1)


def _alloc_decode_ranked(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Device-only fallback: a prefix count ranks page-opening requests."""
    device = out_indices.device
    opens, rank = _page_rank(seq_lens.to(device), page_size)
    next_slot = last_loc.to(device=device, dtype=torch.int64) + 1
    if free_pages.numel() == 0:  # valid input: no request opens a page
        out_indices.copy_(next_slot.to(out_indices.dtype))
        return
    pages = free_pages.to(device=device, dtype=torch.int64)[rank.clamp(max=free_pages.numel() - 1)]
    out_indices.copy_(torch.where(opens, pages * page_size, next_slot).to(out_indices.dtype))


def next_slots_if_torch(last_loc: torch.Tensor, backend: str | None) -> torch.Tensor | None:
    """:func:`alloc_decode`'s result when no request opens a page, ``last_loc + 1`` (int64), as
    ONE torch operation instead of an output buffer and a launch, when ``backend`` resolves to
    the torch fallback for ``last_loc`` (int64); None otherwise (run :func:`alloc_decode`)."""
    if last_loc.dtype is not torch.int64 or resolve_backend(backend, last_loc) != "torch":
        return None
    return last_loc + 1


def alloc_decode_python(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """The pure reference (:func:`kvpool.reference.pools.paged_ops.alloc_decode_slots`) over
    lists."""
    slots = alloc_decode_slots(seq_lens.tolist(), last_loc.tolist(), free_pages.tolist(), page_size)
    write_back(out_indices, slots)


def check_alloc_decode_args(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    seq_lens_cpu: HostLens | None = None,
    opens_cpu: Int64Array | None = None,
) -> None:
    """:func:`alloc_decode`'s metadata contract (:mod:`kvpool.kernels.checks`): power-of-two
    ``page_size``; 1-D int32/int64 ``seq_lens``, ``last_loc`` (and host copy) and 1-D int64
    ``out_indices`` of one length ``bs``; 1-D int32/int64 ``free_pages``; ``opens_cpu`` a 1-D
    integer array of at most ``bs`` entries; one device. No device read."""
    op = "alloc_decode"
    check_page_size(page_size)
    bs = checks.vector(op, "seq_lens", seq_lens).numel()
    checks.vector(op, "last_loc", last_loc)
    checks.vector(op, "free_pages", free_pages)
    checks.vector(op, "out_indices", out_indices, checks.SLOT_DTYPES, output=True)
    checks.batch_lengths(op, "seq_lens", bs, last_loc=last_loc, out_indices=out_indices)
    checks.host_lens(op, "seq_lens_cpu", seq_lens_cpu, bs)
    checks.page_indices(op, "opens_cpu", opens_cpu, bs)
    checks.same_device(
        op, seq_lens=seq_lens, last_loc=last_loc, free_pages=free_pages, out_indices=out_indices
    )


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
    *,
    seq_lens_cpu: HostLens | None = None,
    opens_cpu: Int64Array | None = None,
) -> None:
    """Write one slot per request (for token ``S_i - 1``) into ``out_indices`` (length bs).

    Units: ``seq_lens`` tokens including the new one (``>= 1``), ``last_loc`` the slot of token
    ``S_i - 2`` (ignored when the new token opens a page), ``free_pages`` page ids (read, not
    modified), ``out_indices`` int64 slots. ``seq_lens_cpu``: optional host copy of
    ``seq_lens`` for the torch backend (CPU tensors are their own host copies); ``opens_cpu``:
    the page-opening requests already found from it
    (:func:`~kvpool.kernels.host.page_opening_requests`). The other backends ignore both.

    Checked before any backend runs, from metadata only (:func:`check_alloc_decode_args`):
    ``page_size`` a power of two (PageSizeError); dimensions, int32/int64 dtypes (int64
    ``out_indices``, contiguous), one length ``bs`` for ``seq_lens``, ``last_loc``, ``out_indices``
    and the host copy (InvalidArgumentError); one device, not ``meta`` (KernelError). Nothing is
    written when refused. Values are not read: ``S >= 1``, ``last_loc`` and enough ``free_pages``
    for the page-opening requests are the caller's to check.
    """
    check_alloc_decode_args(
        seq_lens, last_loc, free_pages, out_indices, page_size, seq_lens_cpu, opens_cpu
    )
    alloc_decode_unchecked(
        seq_lens, last_loc, free_pages, out_indices, page_size, backend,
        seq_lens_cpu=seq_lens_cpu, opens_cpu=opens_cpu,
    )  # fmt: skip


def alloc_decode_unchecked(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
    *,
    seq_lens_cpu: HostLens | None = None,
    opens_cpu: Int64Array | None = None,
) -> None:
    """:func:`alloc_decode` without its metadata checks, for a caller that has made the same
    checks itself (the optimized allocator); not part of the public kernel API."""
    if resolve_backend(backend, seq_lens, last_loc, free_pages, out_indices) == "torch":
        # the CPU hot path: straight to the fallback, without run_backend's generic dispatch
        alloc_decode_torch(
            seq_lens,
            last_loc,
            free_pages,
            out_indices,
            page_size,
            seq_lens_cpu=seq_lens_cpu,
            opens_cpu=opens_cpu,
        )
        return
    run_backend(
        backend,
        (seq_lens, last_loc, free_pages, out_indices, page_size),
        kernel=_alloc_decode_kernel,
        launch=alloc_decode_kernel_launch,
        torch_impl=alloc_decode_torch,
        python_impl=alloc_decode_python,
    )
