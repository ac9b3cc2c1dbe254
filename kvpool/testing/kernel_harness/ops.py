"""Per-op adapters of the kernel harness: build tensors for a :class:`KernelCase`, run a candidate,
read its outputs back, and compute what the pure-Python reference expects.

A candidate has the :mod:`kvpool.kernels` signature minus ``backend`` and writes into
preallocated outputs (``get_last_loc`` returns its result). Every output buffer is a view of a
larger buffer whose tail (:data:`TAIL` elements) and untouched entries hold :data:`POISON`, so a
write past the end is seen even without the checked interpreter; every input is compared with a
copy afterwards, so a kernel that writes into an input is seen too.

Dtypes follow SGLang: lengths, ``last_loc``, page ids, slots of ``alloc_*``, rows and
``kv_start_idx`` int64; the request table, ``page_kernel_lens``, ``kv_indptr`` and index-kernel
outputs int32.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from kvpool.kernels.flashinfer_indices import flashinfer_kv_indices_ref
from kvpool.kernels.flashmla_indices import flashmla_kv_indices_ref
from kvpool.kernels.last_loc import get_last_loc_ref
from kvpool.kernels.write_req_to_token import write_req_to_token_ref
from kvpool.reference.pools.paged_ops import alloc_decode_slots, alloc_extend_slots
from kvpool.testing.kernel_harness.inputs import KernelCase
from kvpool.testing.kernel_harness.interpreter import allow_access

POISON = -7
"""Fill value of output buffers and unheld table cells: never a valid slot, page or -1."""

TAIL = 8
"""Poisoned elements after every output buffer (a write there is a write past the end)."""

Candidate = Callable[..., Any]


@dataclasses.dataclass
class Run:
    """What a candidate produced: named flat outputs, plus problems seen outside them."""

    outputs: dict[str, list[int]]
    problems: list[str]


def _t(values: Any, dtype: torch.dtype, device: str) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def _table(case: KernelCase, device: str, with_held: bool = True) -> torch.Tensor:
    """The request table (int32, ``num_rows x width``), poison except the held slots."""
    rows: list[list[int]] = [[POISON] * case.width for _ in range(case.num_rows)]
    if with_held:
        for r, h in zip(case.rows, case.held, strict=True):
            rows[r][: len(h)] = h
    return _t(rows, torch.int32, device)


class _Buffers:
    """Output views with poisoned tails, and copies of inputs to check they are not written."""

    def __init__(self) -> None:
        self._outs: list[tuple[str, torch.Tensor, int]] = []
        self._ins: list[tuple[str, torch.Tensor, torch.Tensor]] = []

    def out(self, name: str, init: torch.Tensor) -> torch.Tensor:
        flat = init.reshape(-1)
        base = torch.full((flat.numel() + TAIL,), POISON, dtype=init.dtype, device=init.device)
        base[: flat.numel()] = flat
        self._outs.append((name, base, flat.numel()))
        return base[: flat.numel()].view(init.shape)

    def inp(self, name: str, t: torch.Tensor) -> torch.Tensor:
        self._ins.append((name, t, t.clone()))
        return t

    def read(self) -> Run:
        problems: list[str] = []
        outputs: dict[str, list[int]] = {}
        for name, base, n in self._outs:
            outputs[name] = base[:n].tolist()
            tail = base[n:].tolist()
            if any(v != POISON for v in tail):
                k = next(i for i, v in enumerate(tail) if v != POISON)
                problems.append(f"wrote past the end of {name}: element {n + k} = {tail[k]}")
        for name, t, saved in self._ins:
            if not torch.equal(t, saved):
                k = int((t.reshape(-1) != saved.reshape(-1)).nonzero()[0, 0])
                problems.append(
                    f"modified input {name}: element {k} is {t.reshape(-1)[k].item()}, "
                    f"was {saved.reshape(-1)[k].item()}"
                )
        return Run(outputs, problems)


def _free_pages(case: KernelCase, device: str, pad_short: bool) -> torch.Tensor:
    """``free_pages`` as int64; when the case is short and ``pad_short``, a view of a buffer
    padded with POISON page ids up to the pages needed, so reading past it stays in memory."""
    pages = _t(case.free_pages, torch.int64, device)
    if not (case.short and pad_short):
        return pages
    base = torch.full((case.pages_needed + 1,), POISON, dtype=torch.int64, device=device)
    base[: pages.numel()] = pages
    return base[: pages.numel()]


def run_candidate(
    candidate: Candidate, case: KernelCase, device: str = "cpu", pad_short: bool = True
) -> Run:
    """Call ``candidate`` on tensors built from ``case``; return its outputs and problems.

    ``pad_short``: on a case with too few free pages, back ``free_pages`` with POISON padding
    (allowed to the checked interpreter), so only writes are judged, not reads past its end."""
    if case.op in ("alloc_extend", "alloc_decode"):
        free = _free_pages(case, device, pad_short)
        base = torch.empty(0, dtype=free.dtype, device=device).set_(free.untyped_storage())
        with allow_access(base):
            return _run(candidate, case, device, free)
    return _run(candidate, case, device, None)


def _run(candidate: Candidate, case: KernelCase, device: str, free: torch.Tensor | None) -> Run:
    b = _Buffers()
    assert free is not None or case.op not in ("alloc_extend", "alloc_decode")
    i64, i32 = torch.int64, torch.int32
    op = case.op
    if op == "alloc_extend":
        out = b.out(
            "out_indices",
            torch.full(
                (sum(case.seq_lens) - sum(case.prefix_lens),), POISON, dtype=i64, device=device
            ),
        )
        candidate(
            b.inp("prefix_lens", _t(case.prefix_lens, i64, device)),
            b.inp("seq_lens", _t(case.seq_lens, i64, device)),
            b.inp("last_loc", _t(case.last_loc, i64, device)),
            b.inp("free_pages", free),  # type: ignore[arg-type]
            out,
            case.page_size,
        )  # fmt: skip
    elif op == "alloc_decode":
        out = b.out("out_indices", torch.full((case.batch_size,), POISON, dtype=i64, device=device))
        candidate(
            b.inp("seq_lens", _t(case.seq_lens, i64, device)),
            b.inp("last_loc", _t(case.last_loc, i64, device)),
            b.inp("free_pages", free),  # type: ignore[arg-type]
            out,
            case.page_size,
        )
    elif op == "write_req_to_token":
        table = b.out("req_to_token", _table(case, device, with_held=False))
        prefix = [s for h, p in zip(case.held, case.prefix_lens, strict=True) for s in h[:p]]
        candidate(
            table,
            b.inp("req_pool_indices", _t(case.rows, i64, device)),
            b.inp("prefix_slots", _t(prefix, i64, device)),
            b.inp("prefix_lens", _t(case.prefix_lens, i64, device)),
            b.inp("seq_lens", _t(case.seq_lens, i64, device)),
            b.inp("out_cache_loc", _t(case.new_slots(), i64, device)),
        )
    elif op == "get_last_loc":
        got = candidate(
            b.inp("req_to_token", _table(case, device)),
            b.inp("req_pool_indices", _t(case.rows, i64, device)),
            b.inp("prefix_lens", _t(case.prefix_lens, i64, device)),
        )
        run = b.read()
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (case.batch_size,):
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            run.problems.append(
                f"returned {shape}, expected a tensor of shape ({case.batch_size},)"
            )
            run.outputs["last_loc"] = []
        else:
            run.outputs["last_loc"] = got.tolist()
        return run
    else:
        start = (
            None if case.kv_start is None else b.inp("kv_start_idx", _t(case.kv_start, i64, device))
        )
        common = (
            b.inp("req_to_token", _table(case, device)),
            b.inp("req_pool_indices", _t(case.rows, i64, device)),
            b.inp("page_kernel_lens", _t(case.kv_lens, i32, device)),
        )  # fmt: skip
        if op == "create_flashinfer_kv_indices":
            indptr = [0]
            for n in case.kv_lens:
                indptr.append(indptr[-1] + n)
            out = b.out("kv_indices", torch.full((indptr[-1],), POISON, dtype=i32, device=device))
            candidate(*common, b.inp("kv_indptr", _t(indptr, i32, device)), start, out)
        else:
            shape = (case.batch_size, case.mla_width)
            out = b.out("kv_indices", torch.full(shape, POISON, dtype=i32, device=device))
            if case.v2p is None:
                candidate(*common, start, out, case.page_size)
            else:
                v2p = b.inp("v2p", _t(case.v2p, i64, device))
                candidate(*common, start, out, case.page_size, v2p)
    return b.read()


def expected_outputs(case: KernelCase) -> dict[str, list[int]]:
    """The reference's outputs for ``case`` (same names and flat layout as :func:`run_candidate`).
    Precondition: ``not case.short``."""
    op, ps = case.op, case.page_size
    table: dict[int, list[int]] = {}
    if op != "write_req_to_token":
        full = [[POISON] * case.width for _ in range(case.num_rows)]
        for r, h in zip(case.rows, case.held, strict=True):
            full[r][: len(h)] = h
        table = dict(enumerate(full))
    if op == "alloc_extend":
        slots = alloc_extend_slots(
            case.prefix_lens, case.seq_lens, case.last_loc, case.free_pages, ps
        )
        return {"out_indices": slots}
    if op == "alloc_decode":
        return {
            "out_indices": alloc_decode_slots(case.seq_lens, case.last_loc, case.free_pages, ps)
        }
    if op == "write_req_to_token":
        grid = [[POISON] * case.width for _ in range(case.num_rows)]
        prefix = [s for h, p in zip(case.held, case.prefix_lens, strict=True) for s in h[:p]]
        write_req_to_token_ref(
            grid, case.rows, prefix, case.prefix_lens, case.seq_lens, case.new_slots()
        )
        return {"req_to_token": [v for row in grid for v in row]}
    if op == "get_last_loc":
        return {"last_loc": get_last_loc_ref(table, case.rows, case.prefix_lens)}
    if op == "create_flashinfer_kv_indices":
        indptr = [0]
        for n in case.kv_lens:
            indptr.append(indptr[-1] + n)
        flat = [POISON] * indptr[-1]
        flashinfer_kv_indices_ref(table, case.rows, case.kv_lens, indptr, case.kv_start, flat)
        return {"kv_indices": flat}
    block = [[POISON] * case.mla_width for _ in range(case.batch_size)]
    flashmla_kv_indices_ref(table, case.rows, case.kv_lens, case.kv_start, block, ps, case.v2p)
    return {"kv_indices": [v for row in block for v in row]}
