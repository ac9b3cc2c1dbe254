"""Every allocator operation: the optimized twin against SGLang's own allocator, in one run.

A helper of ``bench_allocators.py`` (its "vs SGLang" rows). Each case builds the twin's allocator
and SGLang's (0.5.23 by default, loaded from the wheel at run time; never stored here) from the
same history, runs the operation once on both and checks that they return the same slots and
leave the same free lists, then times them **interleaved**: call ``i`` of the twin, then call
``i`` of SGLang, each from the saved starting state (restored outside the timed region), so that
both sides see the same load from other processes; the row gives the median of each and their
ratio, next to the row's target.

Like with like: the twin runs **unchecked** (``checked=False``), the mode an engine runs on CUDA;
SGLang checks nothing either. SGLang runs its torch fallbacks (``use_triton_kernels = False``),
what it runs where Triton is not available. Under ``need_sort`` the twin takes
``Rules.for_sglang`` (SGLang 0.5.23 appends staged pages; kvpool's default prepends them), so
that both free lists match exactly.

Page size 1: SGLang's ``TokenToKVPoolAllocator`` has no ``alloc_decode`` / ``alloc_extend``: its
scheduler's decode step there is ``alloc(batch_size)``, and so is the twin lifecycle's
(:mod:`kvpool.optimized.lifecycle.primitives`). The page-size-1 decode rows time that step on
both sides (target 0.67, the decode target). The twin's own ``alloc_decode`` at page size 1
(which also takes and checks the three batch arrays: shapes, dtypes and every ``S >= 1`` of the
host copy) has no SGLang counterpart to hold it to a target; its row gives its time against the
same SGLang ``alloc(batch_size)`` for information (target and verdict ``-``).

Verdicts: each row's ``ok`` column says ``yes`` when ``twin/sglang`` is at most its target, else
``NO``; the last row counts them. A release without an operation (0.5.16 has no
``free_segment`` / ``free_page_ids``) gives one row saying so instead of its rows. SGLang 0.5.16
has no ``use_triton_kernels`` switch: its extend calls run inside
:func:`kvpool.sglang.kernels.naive_extend` (its own ``alloc_extend_naive``); its ``alloc_decode``
has no torch fallback and runs its Triton kernel through Triton's interpreter (the note says so).

Run directly: ``KVPOOL_SGLANG_CACHE=... python benchmarks/allocator_vs_sglang.py [--quick]
[--sglang 0.5.23]`` (one thread, as ``bench_allocators.py``, which ends with these rows).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from kvpool.constants import NO_LAST_LOC
from kvpool.optimized import PagedTokenToKVPoolAllocator as TwinPaged
from kvpool.optimized import TokenToKVPoolAllocator as TwinToken
from kvpool.optimized.options import TwinOptions
from kvpool.rules import Rules

TARGET = 1.0
"""Every operation: the twin at most SGLang's time (twin / SGLang <= 1.0)."""

DECODE_TARGET = 0.67
"""``alloc_decode``: the twin at most two thirds of SGLang's time, at every batch size."""

DECODE_BATCHES = (1, 8, 16, 64, 256, 1024)
"""Batch sizes of the ``alloc_decode`` rows (requests, one new token each)."""


@dataclass
class Side:
    """One implementation's allocator with a restorable starting state (``save`` / ``reset``).
    ``sglang``: SGLang's adapter (``SGLangAllocator``; ``alloc`` is its raw object)."""

    alloc: Any
    adapter: Any = None
    state: Any = None

    def save(self) -> None:
        self.state = (self.adapter or self.alloc).backup_state()

    def reset(self) -> None:
        (self.adapter or self.alloc).restore_state(self.state)


def make_sides(
    sglang: Any, size: int, page_size: int, need_sort: bool = False, device: str = "cpu"
) -> tuple[Side, Side]:
    """(twin, SGLang) allocators of ``size`` tokens, fresh."""
    from kvpool.sglang import SGLangAllocator

    rules = Rules.for_sglang(sglang.version) if need_sort else None
    twin: Any
    unchecked = TwinOptions.make(device, checked=False)
    if page_size == 1:
        twin = TwinToken(size, need_sort, rules=rules, options=unchecked)
    else:
        twin = TwinPaged(size, page_size, need_sort, rules=rules, options=unchecked)
    adapter = SGLangAllocator(sglang, size, page_size, need_sort, naive_extend=True)
    return Side(twin), Side(adapter.impl, adapter)


def _same_state(twin: Side, sg: Side) -> None:
    a, b = twin.alloc.snapshot(), sg.adapter.snapshot()
    assert a.free_pages == b.free_pages, "free_pages differ"
    assert a.release_pages == b.release_pages, "release_pages differ"


def _same_result(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
        assert a.tolist() == b.tolist(), "results differ"
    else:
        assert a is None and b is None


def interleaved_us(
    twin_call: Callable[[], object],
    sg_call: Callable[[], object],
    twin: Side,
    sg: Side,
    budget_s: float,
    sync: Callable[[], None],
) -> tuple[float, float]:
    """Median wall times (us) of the twin's and SGLang's call, taken alternately, each from its
    saved state; as many pairs as fit in about ``budget_s`` (at least 15, at most 3,000)."""
    t_twin: list[float] = []
    t_sg: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(t_twin) < 3000 and (len(t_twin) < 15 or time.perf_counter() < deadline):
        twin.reset()
        sync()
        t0 = time.perf_counter()
        twin_call()
        sync()
        t_twin.append(time.perf_counter() - t0)
        sg.reset()
        t0 = time.perf_counter()
        sg_call()
        t_sg.append(time.perf_counter() - t0)
    return statistics.median(t_twin) * 1e6, statistics.median(t_sg) * 1e6


class Bench:
    """Builds and times the cases; ``rows`` collects one row per case."""

    def __init__(self, sglang: Any, quick: bool, device: str = "cpu") -> None:
        self.sglang = sglang
        self.device = device
        self.budget_s = 0.12 if quick else 1.0
        self.rows: list[dict[str, Any]] = []
        self.rng = random.Random(1)

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def time(
        self,
        op: str,
        twin: Side,
        sg: Side,
        twin_call: Callable[[], object],
        sg_call: Callable[[], object],
        target: float | None = TARGET,
        note: str = "",
    ) -> None:
        """Save both states, check one call of each (same result, same free lists), time them.
        ``target`` None: an operation SGLang does not have, timed for information only."""
        twin.save()
        sg.save()
        _same_result(twin_call(), sg_call())
        _same_state(twin, sg)
        twin_us, sg_us = interleaved_us(twin_call, sg_call, twin, sg, self.budget_s, self.sync)
        twin.reset()  # back to the starting state: the next case may build on it
        sg.reset()
        ratio = twin_us / sg_us
        self.rows.append(
            {
                "bench": "allocators vs sglang",
                "op": op,
                "mode": "twin unchecked",
                "twin_us": round(twin_us, 1),
                f"sglang_{self.sglang.version}_us": round(sg_us, 1),
                "twin/sglang": round(ratio, 2),
                "target": "-" if target is None else f"<= {target}",
                "ok": "-" if target is None else "yes" if ratio <= target else "NO",
                "note": note,
            }
        )

    def sg_extend(self, impl: Any) -> Callable[..., Any]:
        """SGLang's ``alloc_extend`` on its torch fallback: from 0.5.23 the adapter has set
        SGLang's own ``use_triton_kernels = False``; an older release has no such switch, so
        the call runs inside :func:`kvpool.sglang.kernels.naive_extend`."""
        if hasattr(impl, "use_triton_kernels"):
            return impl.alloc_extend  # type: ignore[no-any-return]
        from kvpool.sglang.kernels import naive_extend

        def routed(*args: Any) -> Any:
            with naive_extend():
                return impl.alloc_extend(*args)

        return routed

    def tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    # ------------------------------------------------------------------ histories
    def blocks(
        self, twin: Side, sg: Side, lens: list[int], keep: list[int]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Allocate whole pages for ``lens[i]`` tokens on both; the first ``keep[i]`` slots of
        each request (what it frees)."""
        ps = twin.alloc.page_size
        whole = [-(-n // ps) * ps for n in lens]
        tb = [twin.alloc.alloc(w) for w in whole]
        sb = [sg.alloc.alloc(w) for w in whole]
        assert [t.tolist() for t in tb] == [s.tolist() for s in sb]
        return (
            [t[:k] for t, k in zip(tb, keep, strict=True)],
            [s[:k] for s, k in zip(sb, keep, strict=True)],
        )

    def prefill(self, twin: Side, sg: Side, prefix: list[int]) -> torch.Tensor:
        """Allocate each request's prefix on both (one alloc_extend); each one's last slot."""
        bs = len(prefix)
        zeros = torch.zeros(bs, dtype=torch.int64)
        p = torch.tensor(prefix)
        none = torch.full((bs,), NO_LAST_LOC, dtype=torch.int64)
        dev = self.device
        got = twin.alloc.alloc_extend(zeros.to(dev), zeros, p.to(dev), p, none.to(dev), sum(prefix))
        want = self.sg_extend(sg.alloc)(zeros, zeros, p, p, none, sum(prefix))
        assert got is not None and want is not None and got.tolist() == want.tolist()
        ends = torch.cumsum(p, 0) - 1
        return torch.where(p > 0, want[ends.clamp(min=0)], NO_LAST_LOC)

    # ------------------------------------------------------------------ cases
    def alloc_rows(self) -> None:
        for ps, n in ((16, 1024), (1, 1024)):
            twin, sg = make_sides(self.sglang, 1 << 17, ps, device=self.device)
            self.blocks(twin, sg, [40] * 64, [40] * 64)  # a used pool
            self.time(
                f"alloc {n} slots, page size {ps}",
                twin,
                sg,
                partial(twin.alloc.alloc, n),
                partial(sg.alloc.alloc, n),
            )

    def extend_rows(self) -> None:
        bs = 64
        prefix = [self.rng.randrange(256) for _ in range(bs)]
        new = [self.rng.randrange(480, 545) for _ in range(bs)]
        twin, sg = make_sides(self.sglang, 1 << 17, 16, device=self.device)
        last = self.prefill(twin, sg, prefix)
        seq = [p + n for p, n in zip(prefix, new, strict=True)]
        total = sum(new)
        p_cpu, s_cpu = torch.tensor(prefix), torch.tensor(seq)
        p_t, s_t, l_t = p_cpu.to(self.device), s_cpu.to(self.device), last.to(self.device)
        self.time(
            f"alloc_extend {bs} reqs x ~512 new tokens, page size 16",
            twin,
            sg,
            partial(twin.alloc.alloc_extend, p_t, p_cpu, s_t, s_cpu, l_t, total),
            partial(self.sg_extend(sg.alloc), p_cpu, p_cpu, s_cpu, s_cpu, last, total),
            note=f"{total} tokens",
        )

    def decode_rows(self) -> None:
        for ps in (16, 1):
            for bs in DECODE_BATCHES:
                prefix = [self.rng.randrange(1, 512) for _ in range(bs)]
                twin, sg = make_sides(self.sglang, 1 << 20, ps, device=self.device)
                if ps == 1:  # SGLang's page-size-1 allocator has no alloc_extend
                    last = torch.stack([b[-1] for b in self.blocks(twin, sg, prefix, prefix)[1]])
                else:
                    last = self.prefill(twin, sg, prefix)
                seq = torch.tensor([p + 1 for p in prefix])
                s_t, l_t = seq.to(self.device), last.to(self.device)
                twin_decode = partial(twin.alloc.alloc_decode, s_t, seq, l_t)
                if ps > 1:
                    opening = sum(1 for p in prefix if p % ps == 0)
                    note = f"{opening} of {bs} requests open a page"
                    if not hasattr(sg.alloc, "use_triton_kernels"):
                        note += f"; SGLang {self.sglang.version}: its Triton kernel, interpreted"
                    sg_decode = partial(sg.alloc.alloc_decode, seq, seq, last)
                    self.time(
                        f"alloc_decode {bs} reqs, page size {ps}",
                        twin,
                        sg,
                        twin_decode,
                        sg_decode,
                        DECODE_TARGET,
                        note,
                    )
                    continue
                sg_step = partial(sg.alloc.alloc, bs)
                self.time(
                    f"decode step {bs} reqs, page size 1: alloc({bs}) on both",
                    twin,
                    sg,
                    partial(twin.alloc.alloc, bs),
                    sg_step,
                    DECODE_TARGET,
                    "the decode step both schedulers run at page size 1",
                )
                self.time(
                    f"alloc_decode {bs} reqs, page size 1",
                    twin,
                    sg,
                    twin_decode,
                    sg_step,
                    None,
                    "SGLang has none at page size 1: for information, against its alloc(batch "
                    "size)",
                )

    def free_rows(self) -> None:
        rng = self.rng
        batch = [rng.randrange(256) + rng.randrange(480, 545) for _ in range(64)]
        small = [rng.randrange(16, 81) for _ in range(1024)]
        halves = "1,024 partial pages (8 of 16 slots each)"
        shapes = (  # (what, page size, pool, lens, kept slots, one call too)
            ("a finished batch of 64 reqs", 16, 1 << 17, batch, batch, True),
            ("1 req", 16, 1 << 17, small[:1], small[:1], False),
            ("1,024 reqs", 16, 1 << 17, small, small, False),
            (halves, 16, 1 << 17, [16] * 1024, [8] * 1024, False),
            ("a finished batch of 64 reqs, page size 1", 1, 1 << 16, batch, batch, True),
            ("1,024 reqs, page size 1", 1, 1 << 17, small, small, False),
        )
        for what, ps, size, lens, keep, one_call in shapes:
            twin, sg = make_sides(self.sglang, size, ps, device=self.device)
            tb, sb = self.blocks(twin, sg, lens, keep)
            note = f"{sum(keep)} slots"
            if one_call:
                t_all, s_all = torch.cat(tb), torch.cat(sb)
                self.time(
                    f"free {what} (one call)",
                    twin,
                    sg,
                    partial(twin.alloc.free, t_all),
                    partial(sg.alloc.free, s_all),
                    note=note,
                )
            self.time(
                f"free group of {len(lens)} frees: {what}",
                twin,
                sg,
                _group(twin.alloc, "free", tb),
                _group(sg.alloc, "free", sb),
                note=note,
            )

    def segment_rows(self) -> None:
        segs = [self.rng.randrange(2, 40) * 16 for _ in range(64)]  # page-aligned segments
        for ps in (16, 1):
            twin, sg = make_sides(self.sglang, 1 << 17, ps, device=self.device)
            if not hasattr(sg.alloc, "free_segment"):
                self.rows.append(
                    {
                        "bench": "allocators vs sglang",
                        "op": f"free_segment, free_page_ids, page size {ps}",
                        "note": f"not in SGLang {self.sglang.version}: no rows",
                    }
                )
                continue
            tb, sb = self.blocks(twin, sg, segs, segs)
            note = f"{sum(segs)} slots in {len(segs)} segments"
            self.time(
                f"free_segment one segment of {segs[0]} slots, page size {ps}",
                twin,
                sg,
                partial(twin.alloc.free_segment, tb[0], start_pos=0),
                partial(sg.alloc.free_segment, sb[0], start_pos=0),
            )
            self.time(
                f"free group of {len(segs)} free_segment calls, page size {ps}",
                twin,
                sg,
                _group(twin.alloc, "free_segment", tb),
                _group(sg.alloc, "free_segment", sb),
                note=note,
            )
            if ps > 1:
                tp = torch.cat([b[::ps] // ps for b in tb])
                sp = torch.cat([b[::ps] // ps for b in sb])
                self.time(
                    f"free_page_ids {tp.numel()} pages (one call), page size {ps}",
                    twin,
                    sg,
                    partial(twin.alloc.free_page_ids, tp),
                    partial(sg.alloc.free_page_ids, sp),
                )

    def need_sort_rows(self) -> None:
        lens = [self.rng.randrange(16, 400) for _ in range(64)]
        for ps in (16, 1):
            twin, sg = make_sides(self.sglang, 1 << 16, ps, need_sort=True, device=self.device)
            tb, sb = self.blocks(twin, sg, lens, lens)
            what = f"page size {ps}, need_sort"
            self.time(
                f"free one request's {lens[0]} slots, nothing staged, {what}",
                twin,
                sg,
                partial(twin.alloc.free, tb[0]),
                partial(sg.alloc.free, sb[0]),
            )
            for t_block, s_block in zip(tb[1:], sb[1:], strict=True):  # 63 staged frees
                twin.alloc.free(t_block)
                sg.alloc.free(s_block)
            self.time(
                f"free one request's {lens[0]} slots, 63 frees staged, {what}",
                twin,
                sg,
                partial(twin.alloc.free, tb[0]),
                partial(sg.alloc.free, sb[0]),
            )
            twin.alloc.free(tb[0])
            sg.alloc.free(sb[0])
            self.time(
                f"merge_and_sort_free of 64 staged frees, {what}",
                twin,
                sg,
                twin.alloc.merge_and_sort_free,
                sg.alloc.merge_and_sort_free,
            )
            need = (twin.alloc.free_pages.numel() + 1) * ps  # past free_pages: merges first
            self.time(
                f"alloc {need} slots that merges first, {what}",
                twin,
                sg,
                partial(twin.alloc.alloc, need),
                partial(sg.alloc.alloc, need),
            )


def _group(alloc: Any, method: str, blocks: list[torch.Tensor]) -> Callable[[], None]:
    """One free group calling ``alloc.<method>`` on every block (``free_segment`` from column
    0; SGLang takes ``start_pos`` by keyword)."""
    call = getattr(alloc, method)

    def run() -> None:
        alloc.free_group_begin()
        if method == "free_segment":
            for b in blocks:
                call(b, start_pos=0)
        else:
            for b in blocks:
                call(b)
        alloc.free_group_end()

    return run


def sglang_rows(sglang: Any, quick: bool, device: str = "cpu") -> list[dict[str, Any]]:
    """Every case's row (times in microseconds); see the module docstring."""
    bench = Bench(sglang, quick, device)
    bench.alloc_rows()
    bench.extend_rows()
    bench.decode_rows()
    bench.free_rows()
    bench.segment_rows()
    bench.need_sort_rows()
    timed = [r for r in bench.rows if r.get("ok") in ("yes", "NO")]
    met = sum(1 for r in timed if r["ok"] == "yes")
    bench.rows.append(
        {
            "bench": "allocators vs sglang",
            "op": "verdict",
            "ok": "yes" if met == len(timed) else "NO",
            "note": f"{met} of {len(timed)} rows meet their targets",
        }
    )
    return bench.rows


def main(argv: list[str] | None = None) -> int:
    """Print the rows (one torch thread, as ``bench_allocators.py``); exit status 0."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer timed pairs per row")
    parser.add_argument("--device", default="cpu", help="device of the twin's tensors")
    parser.add_argument("--sglang", default="0.5.23", help="SGLang release, wheel or folder")
    args = parser.parse_args(argv)
    from kvpool.sglang import load_sglang

    torch.set_num_threads(1)
    rows = sglang_rows(load_sglang(args.sglang), args.quick, args.device)
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    table = [["" if r.get(c) is None else str(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    for line in [cols, *table]:
        print("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip())
    return 0


__all__ = ["DECODE_BATCHES", "DECODE_TARGET", "TARGET", "Bench", "main", "sglang_rows"]

if __name__ == "__main__":
    sys.exit(main())
