"""Allocator benchmark: the optimized twin against the reference, measured in the same run.

Operations (page size 16 unless said otherwise; medians of calls timed one by one, each from the
same starting state, restored outside the timed region):

- ``alloc_extend``: 64 requests, each with a prefix of 0-255 tokens (ending mid-page for most)
  and 480-544 new tokens;
- ``alloc_decode``: 256 requests, a sixteenth of them opening a page;
- ``free``: the slots of a finished batch (the 64 requests above), as one call and as a free
  group of one free per request (how the lifecycle releases a batch);
- scaling: ``alloc_extend`` of 8,192 new tokens in total split over 1 .. 1024 requests, and
  ``alloc_decode`` of 1 .. 1024 requests; the twin's cost at 1024 over its cost at 1 shows that
  no hot path loops over requests in Python, and the crossover is the smallest batch size at
  which the twin is faster (below it, torch's fixed per-call cost loses to plain Python).
- join: a free group's end concatenates one part per free; ``torch.cat`` of 16, 64 and 1,024
  parts against the twin's ``cat_index_parts`` (below torch's autograd layer from 64 parts).

SGLang side by side, in the same run: SGLang 0.5.23's own allocator classes (its CPU code,
loaded from the published wheel at run time by :func:`kvpool.sglang.load_sglang`, never stored
here; ``$KVPOOL_SGLANG_CACHE`` or ``--sglang`` name where the wheel is) with
``use_triton_kernels = False``, i.e. its torch fallbacks ``alloc_extend_naive`` /
``alloc_decode_naive``: the code SGLang runs where Triton is not available. SGLang's objects are
called directly (no adapter in the timed call). The free-group rows add groups of 1 and 1,024
frees (requests of 16-80 tokens) and the page-size-1 allocators. When SGLang cannot be loaded
(no network, no cached wheel) its columns stay empty and the note says why.

The twin gets its host copies of the lengths as CPU tensors (as an engine keeps them), the
reference plain lists. Single torch thread. ``--quick`` makes fewer calls (under a minute).

Mode: the twin runs **unchecked** in every row (``checked=False``: no device read; the mode an
engine runs on CUDA), like with like against SGLang, which checks nothing (the ``mode`` column).

"vs SGLang" rows (:mod:`allocator_vs_sglang`, beside this file): every allocator operation
(``alloc``, ``alloc_extend``, ``alloc_decode`` at batch 1-1,024 and page sizes 16 and 1,
``free`` as one call and in free groups, partial pages and page size 1 included,
``free_segment``, ``free_page_ids``, ``need_sort`` frees, merges and merging allocs), the twin
and SGLang timed interleaved, each row with its target (``twin/sglang <= 1.0``; ``alloc_decode``
``<= 0.67``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvpool.constants import NO_LAST_LOC
from kvpool.optimized import PagedTokenToKVPoolAllocator as TwinAllocator
from kvpool.optimized import TokenToKVPoolAllocator as TwinTokenAllocator
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.free_list import PARTS_BELOW_AUTOGRAD, cat_index_parts
from kvpool.reference import PagedTokenToKVPoolAllocator as RefAllocator
from kvpool.reference import TokenToKVPoolAllocator as RefTokenAllocator

sys.path.insert(0, str(Path(__file__).resolve().parent))  # allocator_vs_sglang, whoever loads us
from allocator_vs_sglang import sglang_rows

PAGE_SIZE = 16
SGLANG_RELEASE = "0.5.23"
SCALING_TOKENS = 8192
SCALING_BATCHES = (1, 4, 16, 64, 128, 256, 512, 1024)


def _median_us(
    call: Callable[[], object], reset: Callable[[], None], calls: int, sync: Callable[[], None]
) -> float:
    """Median wall time (us) of ``call``, running ``reset`` (untimed) before each call."""
    times = []
    for _ in range(calls):
        reset()
        sync()
        t0 = time.perf_counter()
        call()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


class Pair:
    """The same allocator history on both twins, with a restorable starting state."""

    def __init__(self, size: int, device: str, sglang: Any = None, page_size: int = PAGE_SIZE):
        unchecked = TwinOptions.make(device, checked=False)
        if page_size == 1:
            self.ref: Any = RefTokenAllocator(size)
            self.twin: Any = TwinTokenAllocator(size, options=unchecked)
        else:
            self.ref = RefAllocator(size, page_size)
            self.twin = TwinAllocator(size, page_size, options=unchecked)
        self.device = device
        self.ref_state: Any = None
        self.twin_state: Any = None
        # SGLang's own allocator (CPU, torch fallbacks), or None when it could not be loaded
        self.sg: Any = None
        self.sg_adapter: Any = None
        self.sg_state: Any = None
        if sglang is not None:
            from kvpool.sglang import SGLangAllocator

            self.sg_adapter = SGLangAllocator(sglang, size, page_size, naive_extend=True)
            self.sg = self.sg_adapter.impl

    def prefill(self, prefix: list[int]) -> list[int]:
        """Allocate each request's prefix on both; returns each request's last_loc."""
        out = self.ref.alloc_extend(
            [0] * len(prefix),
            [0] * len(prefix),
            prefix,
            prefix,
            [NO_LAST_LOC] * len(prefix),
            sum(prefix),
        )
        zeros = torch.zeros(len(prefix), dtype=torch.int64, device=self.device)
        got = self.twin.alloc_extend(
            zeros,
            zeros.cpu(),
            self.tensor(prefix),
            torch.tensor(prefix),
            self.tensor([NO_LAST_LOC] * len(prefix)),
            sum(prefix),
        )
        assert out is not None and got is not None and got.tolist() == out
        if self.sg is not None:
            cpu = torch.tensor(prefix)
            zeros_cpu = torch.zeros(len(prefix), dtype=torch.int64)
            sg_out = self.sg.alloc_extend(
                zeros_cpu, zeros_cpu, cpu, cpu, torch.full_like(cpu, NO_LAST_LOC), sum(prefix)
            )
            assert sg_out is not None and sg_out.tolist() == out
        ends = [sum(prefix[: i + 1]) for i in range(len(prefix))]
        return [out[e - 1] if p else NO_LAST_LOC for e, p in zip(ends, prefix, strict=True)]

    def tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def save(self) -> None:
        self.ref_state, self.twin_state = self.ref.backup_state(), self.twin.backup_state()
        if self.sg_adapter is not None:
            self.sg_state = self.sg_adapter.backup_state()

    def reset_sg(self) -> None:
        self.sg_adapter.restore_state(self.sg_state)

    def reset_ref(self) -> None:
        self.ref.restore_state(self.ref_state)

    def reset_twin(self) -> None:
        self.twin.restore_state(self.twin_state)


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _sg_us(pair: Pair, call: Callable[[], object], calls: int) -> float | None:
    """SGLang's median (us) of ``call`` from the saved state, or None without SGLang."""
    if pair.sg is None:
        return None
    return _median_us(call, pair.reset_sg, calls, lambda: None)


def _extend_case(
    pair: Pair, prefix: list[int], new: list[int], calls: int, ref_calls: int
) -> tuple[float, float, float | None]:
    """(reference us, twin us, SGLang us) of one alloc_extend of ``new`` tokens after
    ``prefix``."""
    last = pair.prefill(prefix)
    pair.save()
    seq = [p + n for p, n in zip(prefix, new, strict=True)]
    total = sum(new)
    p_t, s_t, l_t = pair.tensor(prefix), pair.tensor(seq), pair.tensor(last)
    p_cpu, s_cpu, l_cpu = torch.tensor(prefix), torch.tensor(seq), torch.tensor(last)
    ref_out = pair.ref.alloc_extend(prefix, prefix, seq, seq, last, total)
    twin_out = pair.twin.alloc_extend(p_t, p_cpu, s_t, s_cpu, l_t, total)
    assert ref_out is not None and twin_out is not None and twin_out.tolist() == ref_out
    if pair.sg is not None:
        pair.reset_sg()
        sg_out = pair.sg.alloc_extend(p_cpu, p_cpu, s_cpu, s_cpu, l_cpu, total)
        assert sg_out is not None and sg_out.tolist() == ref_out
    sync = _sync(pair.device)
    ref_us = _median_us(
        lambda: pair.ref.alloc_extend(prefix, prefix, seq, seq, last, total),
        pair.reset_ref,
        ref_calls,
        lambda: None,
    )
    twin_us = _median_us(
        lambda: pair.twin.alloc_extend(p_t, p_cpu, s_t, s_cpu, l_t, total),
        pair.reset_twin,
        calls,
        sync,
    )
    sg_us = _sg_us(
        pair, lambda: pair.sg.alloc_extend(p_cpu, p_cpu, s_cpu, s_cpu, l_cpu, total), calls
    )
    return ref_us, twin_us, sg_us


def _decode_case(
    pair: Pair, prefix: list[int], calls: int, ref_calls: int
) -> tuple[float, float, float | None]:
    """(reference us, twin us, SGLang us) of one alloc_decode after ``prefix`` tokens per
    request."""
    last = pair.prefill(prefix)
    pair.save()
    seq = [p + 1 for p in prefix]
    s_t, s_cpu, l_t, l_cpu = (
        pair.tensor(seq),
        torch.tensor(seq),
        pair.tensor(last),
        torch.tensor(last),
    )
    ref_out = pair.ref.alloc_decode(seq, seq, last)
    twin_out = pair.twin.alloc_decode(s_t, s_cpu, l_t)
    assert ref_out is not None and twin_out is not None and twin_out.tolist() == ref_out
    if pair.sg is not None:
        pair.reset_sg()
        sg_out = pair.sg.alloc_decode(s_cpu, s_cpu, l_cpu)
        assert sg_out is not None and sg_out.tolist() == ref_out
    ref_us = _median_us(
        lambda: pair.ref.alloc_decode(seq, seq, last), pair.reset_ref, ref_calls, lambda: None
    )
    twin_us = _median_us(
        lambda: pair.twin.alloc_decode(s_t, s_cpu, l_t), pair.reset_twin, calls, _sync(pair.device)
    )
    sg_us = _sg_us(pair, lambda: pair.sg.alloc_decode(s_cpu, s_cpu, l_cpu), calls)
    return ref_us, twin_us, sg_us


def _row(
    op: str, ref_us: float, twin_us: float, note: str = "", sg_us: float | None = None
) -> dict[str, Any]:
    return {
        "bench": "allocators",
        "op": op,
        "mode": "twin unchecked",
        "reference_us": round(ref_us, 1),
        "twin_us": round(twin_us, 1),
        "ref/twin": round(ref_us / twin_us, 2),
        f"sglang_{SGLANG_RELEASE}_us": None if sg_us is None else round(sg_us, 1),
        "twin/sglang": None if sg_us is None else round(twin_us / sg_us, 2),
        "note": note,
    }


def load_sglang_or_reason(source: str) -> tuple[Any, str]:
    """(SGLang's modules, "") or (None, why they could not be loaded)."""
    try:
        from kvpool.sglang import load_sglang

        return load_sglang(source), ""
    except Exception as exc:  # no network, no cached wheel, no triton: skip SGLang's columns
        return None, f"SGLang {source} not loaded ({type(exc).__name__}: {exc})"


def run(
    quick: bool = False, device: str = "cpu", sglang: str = SGLANG_RELEASE
) -> list[dict[str, Any]]:
    """Measure every operation; one row per operation (times in microseconds). ``sglang``:
    the SGLang source to compare with (a release number, a path, ``"none"`` to skip)."""
    torch.set_num_threads(1)
    rng = random.Random(0)
    calls, ref_calls = (30, 10) if quick else (200, 40)
    sg, why = (None, "SGLang skipped") if sglang == "none" else load_sglang_or_reason(sglang)
    rows: list[dict[str, Any]] = []
    if why:
        rows.append({"bench": "allocators", "op": "SGLang columns", "note": why})

    prefix = [rng.randrange(256) for _ in range(64)]
    new = [rng.randrange(480, 545) for _ in range(64)]
    ref_us, twin_us, sg_us = _extend_case(Pair(1 << 17, device, sg), prefix, new, calls, ref_calls)
    rows.append(
        _row(
            "alloc_extend 64 reqs x ~512 new tokens",
            ref_us,
            twin_us,
            f"{sum(new)} tokens; target ref/twin >= 2",
            sg_us,
        )
    )

    decode_prefix = [rng.randrange(1, 2048) for _ in range(256)]
    ref_us, twin_us, sg_us = _decode_case(
        Pair(1 << 20, device, sg), decode_prefix, calls, ref_calls
    )
    rows.append(_row("alloc_decode 256 reqs", ref_us, twin_us, "target twin/sglang <= 0.67", sg_us))

    seq = [p + n for p, n in zip(prefix, new, strict=True)]
    rows.extend(_free_rows(device, seq, calls, ref_calls, sg, "finished batch (64 reqs)", 1 << 17))
    for n in (1, 1024):
        lens = [rng.randrange(16, 81) for _ in range(n)]
        rows.extend(_free_rows(device, lens, calls, ref_calls, sg, f"{n} reqs", 1 << 17, False))
    rows.extend(
        _free_rows(device, seq, calls, ref_calls, sg, "64 reqs, page size 1", 1 << 16, False, 1)
    )
    rows.extend(_scaling_rows(device, calls, ref_calls))
    rows.extend(_join_rows(device, calls))
    if sg is not None:
        rows.extend(sglang_rows(sg, quick, device))
    return rows


def _free_rows(
    device: str,
    seq: list[int],
    calls: int,
    ref_calls: int,
    sg: Any,
    what: str,
    size: int,
    one_call: bool = True,
    page_size: int = PAGE_SIZE,
) -> list[dict[str, Any]]:
    """Free the requests' slots (``seq[i]`` each): as one call (``one_call``), and as a free
    group of one free per request (how the lifecycle releases a batch)."""
    pair = Pair(size, device, sg, page_size)
    ref_blocks = [pair.ref.alloc(s) for s in _whole_pages(seq, page_size)]
    twin_full = [pair.twin.alloc(s) for s in _whole_pages(seq, page_size)]
    assert all(b is not None for b in ref_blocks) and all(b is not None for b in twin_full)
    assert [b.tolist() for b in twin_full] == ref_blocks
    # each request frees its own tokens (the tail of its last page stays unused)
    ref_blocks = [b[:s] for b, s in zip(ref_blocks, seq, strict=True)]
    twin_blocks = [b[:s] for b, s in zip(twin_full, seq, strict=True)]
    sg_blocks: list[torch.Tensor] = []
    if pair.sg is not None:
        got = [pair.sg.alloc(s) for s in _whole_pages(seq, page_size)]
        assert [g.tolist() for g in got] == [b.tolist() for b in twin_full]
        sg_blocks = [g[:s] for g, s in zip(got, seq, strict=True)]
    pair.save()
    ref_all = [s for b in ref_blocks for s in b]
    twin_all = torch.cat(twin_blocks)
    sync = _sync(device)

    def group(alloc: Any, blocks: list[Any]) -> Callable[[], None]:
        def run() -> None:
            alloc.free_group_begin()
            for b in blocks:
                alloc.free(b)
            alloc.free_group_end()

        return run

    group_ref = _median_us(group(pair.ref, ref_blocks), pair.reset_ref, ref_calls, lambda: None)
    group_twin = _median_us(group(pair.twin, twin_blocks), pair.reset_twin, calls, sync)
    group_sg = _sg_us(pair, group(pair.sg, sg_blocks), calls)
    note = f"{len(ref_all)} slots of {len(seq)} requests"
    rows = []
    if one_call:
        one_ref = _median_us(
            lambda: pair.ref.free(ref_all), pair.reset_ref, ref_calls, lambda: None
        )
        one_twin = _median_us(lambda: pair.twin.free(twin_all), pair.reset_twin, calls, sync)
        sg_all = torch.cat(sg_blocks) if sg_blocks else None
        one_sg = _sg_us(pair, lambda: pair.sg.free(sg_all), calls)
        rows.append(_row(f"free {what} (one call)", one_ref, one_twin, note, one_sg))
    rows.append(
        _row(f"free {what} (free group, {len(seq)} frees)", group_ref, group_twin, note, group_sg)
    )
    return rows


def _whole_pages(seq: list[int], page_size: int) -> list[int]:
    return [-(-s // page_size) * page_size for s in seq]


def _scaling_rows(device: str, calls: int, ref_calls: int) -> list[dict[str, Any]]:
    """alloc_extend of SCALING_TOKENS tokens and alloc_decode over growing batch sizes."""
    rows: list[dict[str, Any]] = []
    for op in ("alloc_extend", "alloc_decode"):
        twin_at: dict[int, float] = {}
        crossover: int | None = None
        for bs in SCALING_BATCHES:
            if op == "alloc_extend":  # mid-page prefixes: every part of the extend is exercised
                prefix, new = [5] * bs, [SCALING_TOKENS // bs] * bs
            else:  # one request in 16 opens a page
                prefix, new = [16 if i % 16 == 0 else 5 for i in range(bs)], [1] * bs
            # A pool twice what the batch needs: the reference's per-call cost grows with the
            # pool (it rebuilds its free set), which would hide the per-request costs compared.
            need = sum(
                -(-(p + n) // PAGE_SIZE) * PAGE_SIZE for p, n in zip(prefix, new, strict=True)
            )
            pair = Pair(max(2 * need, 64 * PAGE_SIZE), device)
            if op == "alloc_extend":
                ref_us, twin_us, _ = _extend_case(pair, prefix, new, calls, ref_calls)
                what = f"{bs} reqs x {SCALING_TOKENS // bs} tokens"
            else:
                ref_us, twin_us, _ = _decode_case(pair, prefix, calls, ref_calls)
                what = f"{bs} reqs"
            twin_at[bs] = twin_us
            if crossover is None and twin_us < ref_us:
                crossover = bs
            rows.append(_row(f"scaling {op} {what}", ref_us, twin_us))
        ratio = twin_at[SCALING_BATCHES[-1]] / twin_at[SCALING_BATCHES[0]]
        rows.append(
            {
                "bench": "allocators",
                "op": f"scaling {op} summary",
                "twin_bs1024/bs1": round(ratio, 2),
                "crossover_bs": crossover,
                "note": "target twin_bs1024/bs1 <= 4; crossover: smallest batch size measured "
                "at which the twin is faster (reference faster below it)",
            }
        )
    return rows


def _join_rows(device: str, calls: int) -> list[dict[str, Any]]:
    """A free group's end joins one part per free: ``torch.cat`` against the twin's
    :func:`cat_index_parts` (below autograd's layer from its threshold on), timed alternately
    on the same parts (1-80 slots each, views of one buffer, as page size 1 hands out)."""
    rng = random.Random(2)
    rows: list[dict[str, Any]] = []
    for n in (16, 64, 1024):
        lens = [rng.randrange(1, 81) for _ in range(n)]
        whole = torch.arange(sum(lens), dtype=torch.int64, device=device)
        parts = list(torch.split(whole, lens))
        sync = _sync(device)
        plain: list[float] = []
        joined: list[float] = []
        for _ in range(calls * 5):
            for call, times in ((torch.cat, plain), (cat_index_parts, joined)):
                sync()
                t0 = time.perf_counter()
                call(parts)
                sync()
                times.append(time.perf_counter() - t0)
        cat_us, twin_us = statistics.median(plain) * 1e6, statistics.median(joined) * 1e6
        rows.append(
            {
                "bench": "allocators",
                "op": f"join {n} index parts (a free group's end)",
                "torch_cat_us": round(cat_us, 1),
                "cat_index_parts_us": round(twin_us, 1),
                "twin/torch_cat": round(twin_us / cat_us, 2),
                "note": f"below autograd from {PARTS_BELOW_AUTOGRAD} parts",
            }
        )
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    """Print rows as an aligned table (columns: the union of the rows' keys)."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    table = [["" if r.get(c) is None else str(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer calls (under a minute)")
    parser.add_argument("--device", default="cpu", help="device of the twin's tensors")
    parser.add_argument(
        "--sglang",
        default=SGLANG_RELEASE,
        help="SGLang to compare with: a release number, a wheel or folder path, or none",
    )
    args = parser.parse_args(argv)
    print_rows(run(args.quick, args.device, args.sglang))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
