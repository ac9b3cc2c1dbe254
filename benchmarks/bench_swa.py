"""SWA allocator benchmark: the optimized twin against the reference, measured in the same run.

``SWATokenToKVPoolAllocator`` at page size 16, a full pool of 65,536 tokens and an SWA pool of
32,768 (ratio 0.5), window 256 tokens. Operations (medians of calls timed one by one, each from
the same starting state, restored outside the timed region with ``restore_state``, which brings
back the mapping too):

- ``alloc_extend``: 32 requests of 0-255 prefix tokens and 480-544 new tokens (both pools);
- ``alloc_decode``: the 32 requests, one token each (some open a page);
- ``free_swa``: the window slides for the 32 requests at once (each releases the SWA slots of
  the whole pages that left its 256-token window), one call;
- ``free``: the 32 finished requests (full slots and their mapped SWA slots), one call.

The twin is unchecked (production mode) with the torch kernels, host copies of the lengths as
CPU tensors; the reference gets plain lists. Single torch thread. ``--quick``: fewer calls.
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
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator as Twin
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator as Ref

PAGE_SIZE, SIZE, SIZE_SWA, WINDOW = 16, 65536, 32768, 256
UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: no device-to-host reads for checks."""


def _median_us(call: Callable[[], object], reset: Callable[[], None], calls: int) -> float:
    times = []
    for _ in range(calls):
        reset()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _case(name: str, ref: Ref, twin: Twin, ref_call: Callable[[], Any],
          twin_call: Callable[[], Any], calls: int) -> dict[str, Any]:  # fmt: skip
    """Check both give the same result once, then time both from the same state."""
    ref_state, twin_state = ref.backup_state(), twin.backup_state()
    want, got = ref_call(), twin_call()
    got_list = got.tolist() if isinstance(got, torch.Tensor) else got
    assert want == got_list and ref.snapshot() == twin.snapshot(), name
    ref_us = _median_us(ref_call, lambda: ref.restore_state(ref_state), max(calls // 4, 3))
    twin_us = _median_us(twin_call, lambda: twin.restore_state(twin_state), calls)
    ref.restore_state(ref_state)
    twin.restore_state(twin_state)
    return {"op": name, "reference_us": round(ref_us), "twin_us": round(twin_us),
            "ratio": round(ref_us / twin_us, 1)}  # fmt: skip


def t(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """The four rows (see the module docstring)."""
    torch.set_num_threads(1)
    calls = 20 if quick else 200
    rng = random.Random(0)
    ref, twin = Ref(SIZE, SIZE_SWA, PAGE_SIZE), Twin(SIZE, SIZE_SWA, PAGE_SIZE, options=UNCHECKED)

    prefix = [rng.randint(0, 255) for _ in range(32)]
    got = ref.alloc_extend([0] * 32, [0] * 32, prefix, prefix, [NO_LAST_LOC] * 32, sum(prefix))
    twin.alloc_extend(t([0] * 32), t([0] * 32), t(prefix), t(prefix), t([-1] * 32), sum(prefix))
    assert got is not None
    ends = [sum(prefix[: i + 1]) for i in range(32)]
    last = [got[e - 1] if p else NO_LAST_LOC for e, p in zip(ends, prefix, strict=True)]
    seq = [p + rng.randint(480, 544) for p in prefix]
    n = sum(s - p for p, s in zip(prefix, seq, strict=True))
    p_t, s_t, l_t = t(prefix), t(seq), t(last)  # device tensors and host copies, built once
    rows = [_case(f"alloc_extend, 32 requests ({n} tokens)", ref, twin,
                  lambda: ref.alloc_extend(prefix, prefix, seq, seq, last, n),
                  lambda: twin.alloc_extend(p_t, p_t, s_t, s_t, l_t, n), calls)]  # fmt: skip

    # the batch as it stands after the extend: each request's slots, in order
    full = ref.alloc_extend(prefix, prefix, seq, seq, last, n)
    twin.alloc_extend(t(prefix), t(prefix), t(seq), t(seq), t(last), n)
    assert full is not None
    rows_of, pos = [], 0
    for p, s, e in zip(prefix, seq, ends, strict=True):
        own = got[e - p : e] if p else []
        rows_of.append(own + full[pos : pos + s - p])
        pos += s - p
    dec, dec_last = [len(r) + 1 for r in rows_of], [r[-1] for r in rows_of]
    d_t, dl_t = t(dec), t(dec_last)
    rows.append(_case("alloc_decode, 32 requests", ref, twin,
                      lambda: ref.alloc_decode(dec, dec, dec_last),
                      lambda: twin.alloc_decode(d_t, d_t, dl_t), calls))  # fmt: skip
    slid = [s for r in rows_of for s in r[: (len(r) - WINDOW) // PAGE_SIZE * PAGE_SIZE]]
    slid_t = t(slid)
    rows.append(_case(f"free_swa, window slide of 32 requests ({len(slid)} slots)", ref, twin,
                      lambda: ref.free_swa(slid), lambda: twin.free_swa(slid_t),
                      calls))  # fmt: skip
    every = [s for r in rows_of for s in r]
    every_t = t(every)
    rows.append(_case(f"free, 32 finished requests ({len(every)} slots)", ref, twin,
                      lambda: ref.free(every), lambda: twin.free(every_t), calls))  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in run(parser.parse_args().quick):
        print(row)


if __name__ == "__main__":
    main()
