"""alloc_extend: the slots of tokens ``[P_i, S_i)`` of every request of a batch.

Contract (specs/sglang_behaviour.md, section 4):
request ``i`` writes ``S_i - P_i`` slots into ``out_indices``
starting at ``sum_{j<i} (S_j - P_j)``; its new pages (``ceil(S_i/ps) - ceil(P_i/ps)`` of them)
are read from ``free_pages`` starting at the sum of earlier requests' new pages. Three parts::

    token position   P ........ ceil(P/ps)*ps ......... floor(S/ps)*ps ...... S
    slots            last_loc+1, +2 ...| whole new pages ...| head of last new page
                     (part 1: finish    (part 2)             (part 3: tail)
                      the prefix page)

Seen per token, parts 2 and 3 are one rule: position ``x >= ceil(P/ps)*ps`` lives in new page
``x // ps - ceil(P/ps)`` at offset ``x % ps``; the kernel uses it. The torch fallback instead
plans the output on the host as runs of consecutive slots (a part 1, then one run per new page)
and writes them with a difference array and one running sum.

The kernel only reads ``free_pages``; the caller drops the consumed head afterwards, and checks
capacity and the values beforehand (see
:func:`kvpool.reference.pools.paged_ops.validate_extend_args`); the wrapper refuses bad metadata
(shapes, dtypes, lengths, devices) before any backend runs.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

import kvpool.kernels.checks as checks
from kvpool.kernels.dispatch import block_for, check_page_size, nonempty, run_backend, write_back
from kvpool.kernels.host import HostLens, Int64Array, host_array, host_copy, to_device
from kvpool.kernels.launch import dense, exclusive_cumsum, launch, tl
from kvpool.reference.pools.paged_ops import alloc_extend_slots


def _alloc_extend_kernel(  # type: ignore[no-untyped-def]
    prefix_lens_ptr,
    seq_lens_ptr,
    last_loc_ptr,
    free_pages_ptr,
    out_start_ptr,  # exclusive prefix sum of S - P (tokens), precomputed on the device
    page_start_ptr,  # exclusive prefix sum of new pages, precomputed on the device
    out_ptr,
    PAGE_SIZE: tl.constexpr,
    BLOCK: tl.constexpr,  # tokens per loop iteration: a whole number of pages
):
    # One program per request. Prefix sums are passed in, so programs are independent.
    pid = tl.program_id(0)
    p = tl.load(prefix_lens_ptr + pid).to(tl.int64)
    s = tl.load(seq_lens_ptr + pid).to(tl.int64)
    last_loc = tl.load(last_loc_ptr + pid).to(tl.int64)
    out_start = tl.load(out_start_ptr + pid).to(tl.int64)
    page_start = tl.load(page_start_ptr + pid).to(tl.int64)

    prefix_pages_end = (p + PAGE_SIZE - 1) // PAGE_SIZE * PAGE_SIZE
    offs = tl.arange(0, BLOCK)
    # Part 1: finish the prefix's partial page (fewer than PAGE_SIZE <= BLOCK slots).
    n1 = tl.minimum(s, prefix_pages_end) - p
    tl.store(out_ptr + out_start + offs, last_loc + 1 + offs, mask=offs < n1)

    # Parts 2 and 3: positions from prefix_pages_end to s, BLOCK tokens per iteration.
    n_new_tokens = s - tl.minimum(s, prefix_pages_end)
    for start in range(0, n_new_tokens, BLOCK):
        x = start + offs  # offset from prefix_pages_end, in tokens
        mask = x < n_new_tokens
        page = tl.load(free_pages_ptr + page_start + x // PAGE_SIZE, mask=mask, other=0)
        slot = page.to(tl.int64) * PAGE_SIZE + x % PAGE_SIZE
        tl.store(out_ptr + out_start + n1 + x, slot, mask=mask)


def _starts(
    prefix_lens: torch.Tensor, seq_lens: torch.Tensor, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exclusive prefix sums (int64, on the inputs' device) of extend tokens and new pages."""
    p = prefix_lens.to(torch.int64)
    s = seq_lens.to(torch.int64)
    pages = (s + page_size - 1) // page_size - (p + page_size - 1) // page_size
    return exclusive_cumsum(s - p), exclusive_cumsum(pages)


def alloc_extend_kernel_launch(
    kernel: object,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Launch ``kernel`` (a triton.jit / interpreted form of the kernel): grid = batch size."""
    out_start, page_start = _starts(prefix_lens, seq_lens, page_size)
    launch(
        kernel,
        prefix_lens.numel(),
        1,
        dense(prefix_lens),
        dense(seq_lens),
        dense(last_loc),
        nonempty(dense(free_pages)),  # empty when every token finishes a prefix page
        out_start,
        page_start,
        nonempty(out_indices),  # empty when every S == P
        PAGE_SIZE=page_size,
        BLOCK=block_for(page_size),
    )


def _extend_rows(
    p: Int64Array, s: Int64Array, page_size: int
) -> tuple[Int64Array, Int64Array, Int64Array, int]:
    """The output of an extend as runs of consecutive slots ("rows"), planned on the host.

    Rows, in source order: one part-1 row per request (``n1`` slots from ``last_loc + 1``),
    then one row per new page in ``free_pages`` order (``ps`` slots from ``page * ps``; the
    request's last new page holds only its ``n3`` tail when the extend ends mid-page). Returns
    the output positions where each row starts and ends, the constant to subtract from each
    row's source value (``last_loc`` or ``page * ps``) so that it becomes ``first slot - start
    - 1``, and the number of new pages. Empty rows start and end at the same position.
    """
    shift, mask = page_size.bit_length() - 1, page_size - 1
    cut = np.minimum(s, (p + mask) & -page_size)  # where the prefix's last page ends
    npg = (s - cut + mask) >> shift  # new pages
    out_end = np.cumsum(s - p)
    before = out_end - s  # output position of token 0 of the request (were it extended)
    page_end = np.cumsum(npg)
    bs, num_pages = p.size, int(page_end[-1])
    # Output position of new page j (of request r): first new-page token of r + pages before.
    first_new = before + cut - ((page_end - npg) << shift)
    starts = np.empty(bs + num_pages, dtype=np.int64)
    np.add(before, p, out=starts[:bs])
    page_rows = starts[bs:]
    np.add(np.repeat(first_new, npg), np.arange(0, num_pages << shift, page_size), out=page_rows)
    ends = np.empty_like(starts)
    np.add(before, cut, out=ends[:bs])
    np.minimum(page_rows + page_size, np.repeat(out_end, npg), out=ends[bs:])
    minus = starts.copy()
    minus[bs:] += 1  # part 1 starts at last_loc + 1, a page row at page * ps
    return starts, ends, minus, num_pages


def alloc_extend_torch(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    *,
    prefix_lens_cpu: HostLens | None = None,
    seq_lens_cpu: HostLens | None = None,
) -> None:
    """Vectorised fallback, no per-request loop and no device-to-host sync.

    With host copies of the lengths (given, or the tensors themselves when they live on the
    CPU) the output's layout is computed on the host at row (page) granularity and written with
    a handful of device operations: a difference array of row jumps and one running sum. Without
    them (device tensors only) every output token is computed on the device.
    """
    total = out_indices.numel()
    if total == 0 or prefix_lens.numel() == 0:
        return
    if page_size == 1:  # every token takes one whole page, in batch order
        out_indices.copy_(free_pages[:total])
        return
    prefix_lens_cpu = host_copy(prefix_lens, prefix_lens_cpu)
    seq_lens_cpu = host_copy(seq_lens, seq_lens_cpu)
    if prefix_lens_cpu is None or seq_lens_cpu is None:
        _alloc_extend_per_token(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size)
        return
    p, s = host_array(prefix_lens_cpu), host_array(seq_lens_cpu)
    starts, ends, minus, num_pages = _extend_rows(p, s, page_size)
    device = out_indices.device
    first = torch.cat(
        (
            last_loc.to(device=device, dtype=torch.int64),
            free_pages[:num_pages].to(device=device, dtype=torch.int64)
            << (page_size.bit_length() - 1),
        )
    )
    jump = first - to_device(minus, device)  # first slot of the row - its start - 1
    # Difference array: +1 per token, +jump where a row starts, -jump where it ends; its
    # running sum is start-of-row slot + offset. Empty rows cancel out.
    diff = torch.ones(total + 1, dtype=torch.int64, device=device)
    diff.index_add_(0, to_device(starts, device), jump)
    diff.index_add_(0, to_device(ends, device), jump, alpha=-1)
    if out_indices.dtype == torch.int64:
        torch.cumsum(diff[:total], 0, out=out_indices)
    else:
        out_indices.copy_(torch.cumsum(diff[:total], 0))


_LIST_TOKENS = 4096
"""Up to this many new tokens :func:`alloc_extend_host` builds the slots as a list (the
reference's loop: one ``range`` per page); more take the NumPy plan."""


def alloc_extend_host(
    prefix_lens_cpu: Int64Array,
    seq_lens_cpu: Int64Array,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> bool:
    """:func:`alloc_extend` for a caller that checked the batch and holds every tensor on the
    CPU (a checked-mode allocator: host work is no device read there): the torch fallback's
    plan and difference array computed in NumPy over views, written into ``out_indices``.
    ``prefix_lens_cpu`` / ``seq_lens_cpu``: the lengths (tokens) as int64 arrays. Returns False,
    writing nothing, when it cannot (a tensor off the CPU, ``out_indices`` not 1-D int64, a
    length mismatch, too few ``free_pages``): the caller then runs the kernel."""
    total = out_indices.numel()
    if not (
        out_indices.device.type == "cpu"
        and last_loc.device.type == "cpu"
        and free_pages.device.type == "cpu"
        and out_indices.dtype == torch.int64
        and out_indices.dim() == 1
        and last_loc.dim() == 1
        and free_pages.dim() == 1
        and prefix_lens_cpu.size == seq_lens_cpu.size == last_loc.numel()
    ):
        return False
    if total == 0 or prefix_lens_cpu.size == 0:
        return True
    if page_size == 1:  # every token takes one whole page, in batch order
        if free_pages.numel() < total:
            return False
        out_indices.numpy()[:] = free_pages.numpy()[:total]
        return True
    if total <= _LIST_TOKENS:  # the reference's plan over lists: one range() per run
        slots = _extend_slot_runs(
            prefix_lens_cpu.tolist(),
            seq_lens_cpu.tolist(),
            last_loc.tolist(),
            free_pages,
            page_size,
        )
        if slots is None or len(slots) != total:
            return False
        out_indices.numpy()[:] = slots
        return True
    starts, ends, minus, num_pages = _extend_rows(prefix_lens_cpu, seq_lens_cpu, page_size)
    if free_pages.numel() < num_pages or int(ends.max(initial=0)) > total:
        return False
    pages = free_pages.numpy()[:num_pages].astype(np.int64, copy=False)
    first = np.concatenate(
        (last_loc.numpy().astype(np.int64, copy=False), pages << (page_size.bit_length() - 1))
    )
    jump = first - minus  # first slot of the row - its start - 1 (as the torch fallback)
    diff = np.ones(total + 1, dtype=np.int64)
    np.add.at(diff, starts, jump)
    np.subtract.at(diff, ends, jump)
    np.cumsum(diff[:total], out=out_indices.numpy())
    return True


def _extend_slot_runs(
    p: list[int], s: list[int], loc: list[int], free_pages: torch.Tensor, ps: int
) -> list[int] | None:
    """:func:`~kvpool.reference.pools.paged_ops.alloc_extend_slots` on host lists (tokens;
    ``free_pages`` a CPU tensor of page ids), each run of consecutive slots one ``range``:
    part 1 from ``last_loc + 1``, then one run per new page (a whole page, or the tail at the
    head of the last one). None when some request has not ``0 <= P <= S`` or the pages are
    too few."""
    needed = 0
    for a, b in zip(p, s, strict=True):
        if not 0 <= a <= b:
            return None
        needed += -(-b // ps) + a // -ps  # ceil(S / ps) - ceil(P / ps)
    if free_pages.numel() < needed:
        return None
    held = free_pages.numpy()[:needed].tolist()  # a CPU tensor: a view
    out: list[int] = []
    at = 0
    for a, b, last in zip(p, s, loc, strict=True):
        column = -(-a // ps) * ps  # the first column past the prefix's pages
        out.extend(range(last + 1, last + 1 + min(b, column) - a))
        while column < b:
            base = held[at] * ps
            out.extend(range(base, base + min(ps, b - column)))
            column += ps
            at += 1
    return out


def _alloc_extend_per_token(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Device-only fallback: one lane per output token (the token total is
    ``out_indices.numel()``, known on the host); gathers by ``index_select``, shifts for the
    power-of-two divisions."""
    total = out_indices.numel()
    bs = prefix_lens.numel()
    device = out_indices.device
    shift, mask = page_size.bit_length() - 1, page_size - 1
    p = prefix_lens.to(device=device, dtype=torch.int64)
    s = seq_lens.to(device=device, dtype=torch.int64)
    loc = last_loc.to(device=device, dtype=torch.int64)
    out_start, page_start = _starts(p, s, page_size)
    prefix_pages_end = ((p + mask) >> shift) << shift
    req = torch.repeat_interleave(torch.arange(bs, device=device), s - p, output_size=total)
    # Per request, then gathered once: pos - (value below) is the token's offset from P.
    pos = torch.arange(total, device=device) + (p - out_start).index_select(0, req)
    end1 = prefix_pages_end.index_select(0, req)
    part1 = pos + (loc + 1 - p).index_select(0, req)
    if free_pages.numel() == 0:  # valid input: every token finishes a prefix page
        out_indices.copy_(part1)
        return
    page_idx = page_start.index_select(0, req) + ((pos - end1).clamp(min=0) >> shift)
    page_idx = page_idx.clamp(max=free_pages.numel() - 1)  # part-1 lanes gather a dummy
    page = free_pages.to(device=device, dtype=torch.int64).index_select(0, page_idx)
    slot = torch.where(pos < end1, part1, (page << shift) + (pos & mask))
    out_indices.copy_(slot)


def alloc_extend_python(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
) -> None:
    """The pure reference (:func:`kvpool.reference.pools.paged_ops.alloc_extend_slots`) over
    lists."""
    slots = alloc_extend_slots(
        prefix_lens.tolist(), seq_lens.tolist(), last_loc.tolist(), free_pages.tolist(), page_size
    )
    write_back(out_indices, slots)


def check_alloc_extend_args(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    prefix_lens_cpu: HostLens | None = None,
    seq_lens_cpu: HostLens | None = None,
) -> None:
    """:func:`alloc_extend`'s metadata contract (:mod:`kvpool.kernels.checks`): power-of-two
    ``page_size``; 1-D int32/int64 ``prefix_lens``, ``seq_lens``, ``last_loc`` (and host
    copies) of one length ``bs``; 1-D int32/int64 ``free_pages``; 1-D int64 ``out_indices``,
    empty when ``bs == 0``; one device. No device read."""
    op = "alloc_extend"
    check_page_size(page_size)
    bs = checks.vector(op, "prefix_lens", prefix_lens).numel()
    checks.vector(op, "seq_lens", seq_lens)
    checks.vector(op, "last_loc", last_loc)
    checks.vector(op, "free_pages", free_pages)
    checks.vector(op, "out_indices", out_indices, checks.SLOT_DTYPES, output=True)
    checks.batch_lengths(op, "prefix_lens", bs, seq_lens=seq_lens, last_loc=last_loc)
    checks.empty_with_batch(op, bs, out_indices=out_indices)
    checks.host_lens(op, "prefix_lens_cpu", prefix_lens_cpu, bs)
    checks.host_lens(op, "seq_lens_cpu", seq_lens_cpu, bs)
    checks.same_device(
        op,
        prefix_lens=prefix_lens,
        seq_lens=seq_lens,
        last_loc=last_loc,
        free_pages=free_pages,
        out_indices=out_indices,
    )


def alloc_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
    *,
    prefix_lens_cpu: HostLens | None = None,
    seq_lens_cpu: HostLens | None = None,
) -> None:
    """Write the slots of tokens ``[P_i, S_i)`` of every request into ``out_indices``.

    Units: ``prefix_lens`` / ``seq_lens`` tokens (one per request), ``last_loc`` the slot of
    token ``P_i - 1`` (or -1 when ``P_i == 0``), ``free_pages`` page ids (read from the head,
    not modified), ``out_indices`` int64 slots of length ``sum(S - P)``.
    ``prefix_lens_cpu`` / ``seq_lens_cpu``: optional host copies of the lengths, which let the
    torch backend plan the output on the host for device tensors too (CPU tensors are their own
    host copies); the other backends ignore them.

    Checked before any backend runs, from metadata only (:func:`check_alloc_extend_args`):
    ``page_size`` a power of two (PageSizeError); dimensions, int32/int64 dtypes (int64
    ``out_indices``, contiguous), one length for the per-request arrays and the host copies, an
    empty ``out_indices`` for an empty batch (InvalidArgumentError); one device, not ``meta``
    (KernelError). Nothing is written when refused. Values are not read: ``0 <= P <= S``,
    ``last_loc``, ``len(out_indices) == sum(S - P)`` and enough ``free_pages`` are the caller's to
    check (the allocator does, :func:`kvpool.reference.pools.paged_ops.validate_extend_args`).
    """
    check_alloc_extend_args(
        prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size,
        prefix_lens_cpu, seq_lens_cpu,
    )  # fmt: skip
    alloc_extend_unchecked(
        prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, backend,
        prefix_lens_cpu=prefix_lens_cpu, seq_lens_cpu=seq_lens_cpu,
    )  # fmt: skip


def alloc_extend_unchecked(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    out_indices: torch.Tensor,
    page_size: int,
    backend: str | None = None,
    *,
    prefix_lens_cpu: HostLens | None = None,
    seq_lens_cpu: HostLens | None = None,
) -> None:
    """:func:`alloc_extend` without its metadata checks, for a caller that has made the same
    checks itself (the optimized allocator); not part of the public kernel API."""
    run_backend(
        backend,
        (prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size),
        kernel=_alloc_extend_kernel,
        launch=alloc_extend_kernel_launch,
        torch_impl=functools.partial(
            alloc_extend_torch, prefix_lens_cpu=prefix_lens_cpu, seq_lens_cpu=seq_lens_cpu
        ),
        python_impl=alloc_extend_python,
    )
