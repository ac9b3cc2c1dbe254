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

The twin gets its host copies of the lengths as CPU tensors (as an engine keeps them), the
reference plain lists. Single torch thread. ``--quick`` makes fewer calls (under a minute).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.constants import NO_LAST_LOC
from kvpool.optimized import PagedTokenToKVPoolAllocator as TwinAllocator
from kvpool.reference import PagedTokenToKVPoolAllocator as RefAllocator

PAGE_SIZE = 16
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

    def __init__(self, size: int, device: str) -> None:
        self.ref = RefAllocator(size, PAGE_SIZE)
        self.twin = TwinAllocator(size, PAGE_SIZE, device=device, checked=False)
        self.device = device
        self.ref_state: Any = None
        self.twin_state: Any = None

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
        ends = [sum(prefix[: i + 1]) for i in range(len(prefix))]
        return [out[e - 1] if p else NO_LAST_LOC for e, p in zip(ends, prefix, strict=True)]

    def tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def save(self) -> None:
        self.ref_state, self.twin_state = self.ref.backup_state(), self.twin.backup_state()

    def reset_ref(self) -> None:
        self.ref.restore_state(self.ref_state)

    def reset_twin(self) -> None:
        self.twin.restore_state(self.twin_state)


def _sync(device: str) -> Callable[[], None]:
    return torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)


def _extend_case(
    pair: Pair, prefix: list[int], new: list[int], calls: int, ref_calls: int
) -> tuple[float, float]:
    """(reference us, twin us) of one alloc_extend of ``new`` tokens after ``prefix``."""
    last = pair.prefill(prefix)
    pair.save()
    seq = [p + n for p, n in zip(prefix, new, strict=True)]
    total = sum(new)
    p_t, s_t, l_t = pair.tensor(prefix), pair.tensor(seq), pair.tensor(last)
    p_cpu, s_cpu = torch.tensor(prefix), torch.tensor(seq)
    ref_out = pair.ref.alloc_extend(prefix, prefix, seq, seq, last, total)
    twin_out = pair.twin.alloc_extend(p_t, p_cpu, s_t, s_cpu, l_t, total)
    assert ref_out is not None and twin_out is not None and twin_out.tolist() == ref_out
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
    return ref_us, twin_us


def _decode_case(pair: Pair, prefix: list[int], calls: int, ref_calls: int) -> tuple[float, float]:
    """(reference us, twin us) of one alloc_decode after ``prefix`` tokens per request."""
    last = pair.prefill(prefix)
    pair.save()
    seq = [p + 1 for p in prefix]
    s_t, s_cpu, l_t = pair.tensor(seq), torch.tensor(seq), pair.tensor(last)
    ref_out = pair.ref.alloc_decode(seq, seq, last)
    twin_out = pair.twin.alloc_decode(s_t, s_cpu, l_t)
    assert ref_out is not None and twin_out is not None and twin_out.tolist() == ref_out
    ref_us = _median_us(
        lambda: pair.ref.alloc_decode(seq, seq, last), pair.reset_ref, ref_calls, lambda: None
    )
    twin_us = _median_us(
        lambda: pair.twin.alloc_decode(s_t, s_cpu, l_t), pair.reset_twin, calls, _sync(pair.device)
    )
    return ref_us, twin_us


def _row(op: str, ref_us: float, twin_us: float, note: str = "") -> dict[str, Any]:
    return {
        "bench": "allocators",
        "op": op,
        "reference_us": round(ref_us, 1),
        "twin_us": round(twin_us, 1),
        "ref/twin": round(ref_us / twin_us, 2),
        "note": note,
    }


def run(quick: bool = False, device: str = "cpu") -> list[dict[str, Any]]:
    """Measure every operation; one row per operation (times in microseconds)."""
    torch.set_num_threads(1)
    rng = random.Random(0)
    calls, ref_calls = (30, 10) if quick else (200, 40)
    rows: list[dict[str, Any]] = []

    prefix = [rng.randrange(256) for _ in range(64)]
    new = [rng.randrange(480, 545) for _ in range(64)]
    ref_us, twin_us = _extend_case(Pair(1 << 17, device), prefix, new, calls, ref_calls)
    rows.append(
        _row(
            "alloc_extend 64 reqs x ~512 new tokens",
            ref_us,
            twin_us,
            f"{sum(new)} tokens; target ref/twin >= 2",
        )
    )

    decode_prefix = [rng.randrange(1, 2048) for _ in range(256)]
    ref_us, twin_us = _decode_case(Pair(1 << 20, device), decode_prefix, calls, ref_calls)
    rows.append(_row("alloc_decode 256 reqs", ref_us, twin_us))

    rows.extend(_free_rows(device, prefix, new, calls, ref_calls))
    rows.extend(_scaling_rows(device, calls, ref_calls))
    return rows


def _free_rows(
    device: str, prefix: list[int], new: list[int], calls: int, ref_calls: int
) -> list[dict[str, Any]]:
    """Free the 64 requests' slots: one call, and a free group of one free per request."""
    pair = Pair(1 << 17, device)
    seq = [p + n for p, n in zip(prefix, new, strict=True)]
    blocks_ref = [pair.ref.alloc_extend([0], [0], [s], [s], [NO_LAST_LOC], s) for s in seq]
    blocks_twin = [
        pair.twin.alloc_extend(
            pair.tensor([0]),
            torch.tensor([0]),
            pair.tensor([s]),
            torch.tensor([s]),
            pair.tensor([NO_LAST_LOC]),
            s,
        )
        for s in seq
    ]
    ref_blocks = [b for b in blocks_ref if b is not None]
    twin_blocks = [b for b in blocks_twin if b is not None]
    assert [b.tolist() for b in twin_blocks] == ref_blocks
    pair.save()
    ref_all = [s for b in ref_blocks for s in b]
    twin_all = torch.cat(twin_blocks)
    sync = _sync(device)

    def ref_group() -> None:
        pair.ref.free_group_begin()
        for b in ref_blocks:
            pair.ref.free(b)
        pair.ref.free_group_end()

    def twin_group() -> None:
        pair.twin.free_group_begin()
        for b in twin_blocks:
            pair.twin.free(b)
        pair.twin.free_group_end()

    one_ref = _median_us(lambda: pair.ref.free(ref_all), pair.reset_ref, ref_calls, lambda: None)
    one_twin = _median_us(lambda: pair.twin.free(twin_all), pair.reset_twin, calls, sync)
    group_ref = _median_us(ref_group, pair.reset_ref, ref_calls, lambda: None)
    group_twin = _median_us(twin_group, pair.reset_twin, calls, sync)
    note = f"{len(ref_all)} slots of 64 requests"
    return [
        _row("free finished batch (one call)", one_ref, one_twin, note),
        _row("free finished batch (free group, 64 frees)", group_ref, group_twin, note),
    ]


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
                ref_us, twin_us = _extend_case(pair, prefix, new, calls, ref_calls)
                what = f"{bs} reqs x {SCALING_TOKENS // bs} tokens"
            else:
                ref_us, twin_us = _decode_case(pair, prefix, calls, ref_calls)
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
    args = parser.parse_args(argv)
    print_rows(run(args.quick, args.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
