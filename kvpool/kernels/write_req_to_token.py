"""write_req_to_token: store a batch's prefix slots and new slots into its request-table rows.

Contract: for request ``b`` with table row ``r_b = req_pool_indices[b]``::

    req_to_token[r_b, 0 : P_b]    = prefix_slots[sum_{j<b} P_j   : sum_{j<=b} P_j]
    req_to_token[r_b, P_b : S_b]  = out_cache_loc[sum_{j<b} (S_j - P_j) : sum_{j<=b} (S_j - P_j)]

    row r_b:  | prefix slots (P_b columns) | new slots (S_b - P_b columns) | untouched ... |

``req_to_token`` is int32 ``(rows, max_context_len)``; slot tensors are int64 and flat in batch
order. Rows are distinct and ``S_b <= max_context_len`` (the caller checks values; the wrapper
refuses bad metadata before any backend runs). Columns at or past ``S_b`` and rows not in the
batch are left untouched.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

import torch

import kvpool.kernels.checks as checks
from kvpool.kernels.dispatch import block_for, nonempty, run_backend
from kvpool.kernels.host import batch_rows
from kvpool.kernels.launch import dense, exclusive_cumsum, launch, tl


def _write_req_to_token_kernel(  # type: ignore[no-untyped-def]
    req_to_token_ptr,
    row_stride,
    req_pool_indices_ptr,
    prefix_slots_ptr,
    prefix_start_ptr,  # exclusive prefix sum of P (tokens), precomputed on the device
    prefix_lens_ptr,
    seq_lens_ptr,
    out_cache_loc_ptr,
    ext_start_ptr,  # exclusive prefix sum of S - P (tokens), precomputed on the device
    BLOCK: tl.constexpr,
):
    # One program per request; it copies its two source ranges into its row, BLOCK at a time.
    pid = tl.program_id(0)
    row = tl.load(req_pool_indices_ptr + pid).to(tl.int64)
    p = tl.load(prefix_lens_ptr + pid).to(tl.int64)
    s = tl.load(seq_lens_ptr + pid).to(tl.int64)
    prefix_start = tl.load(prefix_start_ptr + pid).to(tl.int64)
    ext_start = tl.load(ext_start_ptr + pid).to(tl.int64)
    dst = req_to_token_ptr + row * row_stride
    offs = tl.arange(0, BLOCK)
    for start in range(0, p, BLOCK):
        col = start + offs
        mask = col < p
        slot = tl.load(prefix_slots_ptr + prefix_start + col, mask=mask)
        tl.store(dst + col, slot.to(tl.int32), mask=mask)
    for start in range(0, s - p, BLOCK):
        k = start + offs
        mask = k < s - p
        slot = tl.load(out_cache_loc_ptr + ext_start + k, mask=mask)
        tl.store(dst + p + k, slot.to(tl.int32), mask=mask)


def write_req_to_token_kernel_launch(
    kernel: object,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Launch ``kernel``: grid = batch size."""
    launch(
        kernel,
        req_pool_indices.numel(),
        1,
        req_to_token,
        req_to_token.stride(0),
        dense(req_pool_indices),
        nonempty(dense(prefix_slots)),  # empty when every prefix is
        exclusive_cumsum(prefix_lens),
        dense(prefix_lens),
        dense(seq_lens),
        nonempty(dense(out_cache_loc)),  # empty when every S == P
        exclusive_cumsum(seq_lens.to(torch.int64) - prefix_lens.to(torch.int64)),
        BLOCK=block_for(1),
    )


def _scatter(
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    first_col: torch.Tensor,
    lens: torch.Tensor,
    values: torch.Tensor,
) -> None:
    """``req_to_token[rows[b], first_col[b] + k] = values[start_b + k]`` for ``k < lens[b]``."""
    total = values.numel()
    if total == 0:
        return
    device = req_to_token.device
    req = torch.repeat_interleave(
        torch.arange(rows.numel(), device=device), lens, output_size=total
    )
    col = first_col[req] + torch.arange(total, device=device) - exclusive_cumsum(lens)[req]
    req_to_token[rows[req], col] = values.to(device=device, dtype=req_to_token.dtype)


def write_req_to_token_host(
    req_to_token: torch.Tensor,
    rows: Sequence[int],
    prefix_slots: torch.Tensor,
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    out_cache_loc: torch.Tensor,
) -> bool:
    """:func:`write_req_to_token` for a caller that holds the rows and lengths on the host and
    every tensor on the CPU (a checked-mode twin: host work is no device read there): ``row[:P]
    = prefix``, ``row[P:S] = new`` per request through NumPy views of the table and the slot
    arrays (values cast to the table's dtype, as the kernels' stores). Returns False, writing
    nothing, when it cannot: a tensor off the CPU, a 1-D slot array missing, lengths that do not
    fit the slot arrays or a row outside the table; the caller then runs the kernel (whose
    checks raise)."""
    if not (
        req_to_token.device.type == "cpu"
        and req_to_token.dim() == 2
        and prefix_slots.device.type == "cpu"
        and out_cache_loc.device.type == "cpu"
        and prefix_slots.dim() == 1
        and out_cache_loc.dim() == 1
    ):
        return False
    table = req_to_token.numpy()
    prefix, new = prefix_slots.numpy(), out_cache_loc.numpy()
    height, width = table.shape
    if not len(rows) == len(prefix_lens) == len(seq_lens):
        return False
    total_prefix = total_new = 0
    for r, a, b in zip(rows, prefix_lens, seq_lens, strict=True):  # every cell inside first
        if not (0 <= a <= b <= width and -height <= r < height):
            return False
        total_prefix += a
        total_new += b - a
    if total_prefix != prefix.size or total_new != new.size:
        return False
    at_prefix = at_new = 0
    for r, a, b in zip(rows, prefix_lens, seq_lens, strict=True):
        table[r, :a] = prefix[at_prefix : at_prefix + a]
        table[r, a:b] = new[at_new : at_new + b - a]
        at_prefix += a
        at_new += b - a
    return True


def write_req_to_token_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Vectorised fallback: two scatters (prefix, then new slots), sizes from host shapes."""
    device = req_to_token.device
    rows = req_pool_indices.to(device=device, dtype=torch.int64)
    p = prefix_lens.to(device=device, dtype=torch.int64)
    s = seq_lens.to(device=device, dtype=torch.int64)
    _scatter(req_to_token, rows, torch.zeros_like(p), p, prefix_slots)
    _scatter(req_to_token, rows, p, s - p, out_cache_loc)


def write_req_to_token_ref(
    table: MutableMapping[int, list[int]] | list[list[int]],
    req_pool_indices: Sequence[int],
    prefix_slots: Sequence[int],
    prefix_lens: Sequence[int],
    seq_lens: Sequence[int],
    out_cache_loc: Sequence[int],
) -> None:
    """Pure reference over lists: writes into ``table[row]`` (one list per row) in place."""
    prefix_cursor = 0
    ext_cursor = 0
    for row, p, s in zip(req_pool_indices, prefix_lens, seq_lens, strict=True):
        table[row][0:p] = prefix_slots[prefix_cursor : prefix_cursor + p]
        table[row][p:s] = out_cache_loc[ext_cursor : ext_cursor + s - p]
        prefix_cursor += p
        ext_cursor += s - p


def write_req_to_token_python(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """Run :func:`write_req_to_token_ref` on the batch's rows as lists, then copy them back."""
    rows = req_pool_indices.tolist()
    table = batch_rows(req_to_token, rows)
    write_req_to_token_ref(
        table,
        rows,
        prefix_slots.tolist(),
        prefix_lens.tolist(),
        seq_lens.tolist(),
        out_cache_loc.tolist(),
    )
    for r, values in table.items():
        req_to_token[r] = torch.tensor(values, dtype=req_to_token.dtype)


def check_write_req_to_token_args(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
) -> None:
    """:func:`write_req_to_token`'s metadata contract (:mod:`kvpool.kernels.checks`): a 2-D
    int32/int64 table (with rows when the batch is not empty); 1-D int32/int64
    ``req_pool_indices``, ``prefix_lens``, ``seq_lens`` of one length ``bs``; 1-D int32/int64
    ``prefix_slots`` and ``out_cache_loc``, empty when ``bs == 0``; one device."""
    op = "write_req_to_token"
    checks.table(op, "req_to_token", req_to_token, output=True)
    bs = checks.vector(op, "req_pool_indices", req_pool_indices).numel()
    checks.vector(op, "prefix_slots", prefix_slots)
    checks.vector(op, "prefix_lens", prefix_lens)
    checks.vector(op, "seq_lens", seq_lens)
    checks.vector(op, "out_cache_loc", out_cache_loc)
    checks.batch_lengths(op, "req_pool_indices", bs, prefix_lens=prefix_lens, seq_lens=seq_lens)
    checks.empty_with_batch(op, bs, prefix_slots=prefix_slots, out_cache_loc=out_cache_loc)
    checks.table_rows(op, "req_to_token", req_to_token, bs)
    checks.same_device(
        op,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        prefix_slots=prefix_slots,
        prefix_lens=prefix_lens,
        seq_lens=seq_lens,
        out_cache_loc=out_cache_loc,
    )


def write_req_to_token(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_slots: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    out_cache_loc: torch.Tensor,
    backend: str | None = None,
) -> None:
    """Write each request's prefix slots then new slots into its table row (see module doc).

    Units: ``req_pool_indices`` rows, ``prefix_lens`` / ``seq_lens`` tokens, ``prefix_slots``
    (length ``sum(P)``) and ``out_cache_loc`` (length ``sum(S - P)``) slots, flat in batch order.

    Checked before any backend runs, from metadata only (:func:`check_write_req_to_token_args`):
    dimensions, int32/int64 dtypes, the table's column stride 1, one length for the per-request
    arrays, empty slot arrays for an empty batch, a table with rows for a non-empty one
    (InvalidArgumentError); one device, not ``meta`` (KernelError). Nothing is written when refused.
    Values are not read: distinct rows in range, ``0 <= P <= S <= max_context_len`` and the slot
    arrays' lengths ``sum(P)`` / ``sum(S - P)`` are the caller's to check.
    """
    check_write_req_to_token_args(
        req_to_token, req_pool_indices, prefix_slots, prefix_lens, seq_lens, out_cache_loc
    )
    run_backend(
        backend,
        (req_to_token, req_pool_indices, prefix_slots, prefix_lens, seq_lens, out_cache_loc),
        kernel=_write_req_to_token_kernel,
        launch=write_req_to_token_kernel_launch,
        torch_impl=write_req_to_token_torch,
        python_impl=write_req_to_token_python,
    )
