"""CPU timings of every kvpool kernel: torch fallback vs the pure-Python reference.

The baseline is the ``python`` backend (the pure reference over ``.tolist()``), measured in the
same run; the table prints each backend's median time per call and its speed-up over that
baseline. The Triton interpreter runs the real kernel source on the host: its time is shown for
information only (it is a correctness tool, not a fast path).

    python benchmarks/bench_kernels.py            # realistic sizes
    python benchmarks/bench_kernels.py --quick    # small sizes, few repeats (< 60 s)
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvpool.kernels import (
    alloc_decode,
    alloc_extend,
    available_backends,
    create_flashinfer_kv_indices,
    create_flashmla_kv_indices,
    get_last_loc,
    write_req_to_token,
)
from kvpool.reference.pools.paged_ops import extend_new_pages

Run = Callable[[str], object]


@dataclass(frozen=True)
class Sizes:
    bs: int  # requests per batch
    prefix: int  # tokens of cached prefix per request
    extend: int  # new tokens per request
    page_size: int


def _t(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
    return torch.tensor(values, dtype=dtype)


def build_cases(sz: Sizes, seed: int = 0) -> dict[str, Run]:
    """One closure per kernel, taking the backend name, on fixed random valid inputs."""
    rng = random.Random(seed)
    ps, bs = sz.page_size, sz.bs
    prefix = [rng.randrange(0, sz.prefix + 1) for _ in range(bs)]
    seq = [p + rng.randrange(1, sz.extend + 1) for p in prefix]
    last_loc = [-1 if p == 0 else rng.randrange(1, 1000) * ps + (p - 1) % ps for p in prefix]
    pages = sum(extend_new_pages(p, s, ps) for p, s in zip(prefix, seq, strict=True))
    free = _t(rng.sample(range(1, 4 * pages + 8), pages + 4))
    ext_out = torch.empty(sum(seq) - sum(prefix), dtype=torch.int64)
    cols = -(-max(seq) // ps) * ps
    table = torch.randint(1, 2**20, (bs + 1, cols), dtype=torch.int32)
    rows = _t(rng.sample(range(1, bs + 1), bs))
    p_t, s_t, loc_t = _t(prefix), _t(seq), _t(last_loc)
    prefix_slots = torch.randint(1, 2**20, (sum(prefix),), dtype=torch.int64)
    lens = s_t
    indptr = _t([0, *itertools.accumulate(seq)])
    kv_flat = torch.empty(sum(seq), dtype=torch.int32)
    kv_block = torch.empty(bs, cols // ps, dtype=torch.int32)
    dec_out = torch.empty(bs, dtype=torch.int64)
    return {
        "alloc_extend": lambda b: alloc_extend(p_t, s_t, loc_t, free, ext_out, ps, b),
        "alloc_decode": lambda b: alloc_decode(s_t, loc_t, free, dec_out, ps, b),
        "write_req_to_token": lambda b: write_req_to_token(
            table, rows, prefix_slots, p_t, s_t, ext_out, b
        ),
        "get_last_loc": lambda b: get_last_loc(table, rows, p_t, b),
        "flashinfer_kv_indices": lambda b: create_flashinfer_kv_indices(
            table, rows, lens, indptr, None, kv_flat, b
        ),
        "flashmla_kv_indices": lambda b: create_flashmla_kv_indices(
            table, rows, lens, None, kv_block, ps, b
        ),
    }


def median_seconds(fn: Callable[[], object], repeats: int, budget_s: float) -> float:
    """Median wall time of ``fn`` after one warm-up call, stopping early past ``budget_s``."""
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
        if time.perf_counter() > deadline:
            break
    return statistics.median(times)


def measure(
    quick: bool, repeats: int | None = None, interpret: bool = True
) -> tuple[Sizes, int, list[str], dict[str, dict[str, float]]]:
    """Milliseconds per kernel and backend (medians), baseline ``python`` measured in the same
    run. Returns the sizes, the repeat count, the backends and ``{kernel: {backend: ms}}``."""
    torch.set_num_threads(1)
    sz = Sizes(16, 256, 128, 16) if quick else Sizes(64, 2048, 512, 16)
    repeats = repeats or (5 if quick else 20)
    budget = 2.0 if quick else 10.0
    backends = ["python", "torch"]
    if "interpret" in available_backends() and interpret:
        backends.append("interpret")
    figures = {
        name: {
            b: 1e3 * median_seconds(functools.partial(case, b), repeats, budget) for b in backends
        }
        for name, case in build_cases(sz).items()
    }
    return sz, repeats, backends, figures


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Rows for ``benchmarks/run_all.py`` / ``kvpool bench``: reference vs torch fallback (the
    twin's CPU path), in microseconds, with the ratio; the interpreter is left out (not a speed
    path)."""
    _, _, _, figures = measure(quick, interpret=False)
    return [
        {
            "bench": "kernels",
            "op": name,
            "reference_us": round(1e3 * ms["python"], 1),
            "twin_us": round(1e3 * ms["torch"], 1),
            "ref/twin": round(ms["python"] / ms["torch"], 2),
        }
        for name, ms in figures.items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, few repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--no-interpret", action="store_true", help="skip the Triton interpreter")
    args = parser.parse_args(argv)
    sz, repeats, backends, figures = measure(args.quick, args.repeats, not args.no_interpret)
    print(
        f"kvpool kernels on CPU: bs={sz.bs} prefix<={sz.prefix} extend<={sz.extend} "
        f"page_size={sz.page_size}; median of <={repeats} runs; baseline = python reference"
    )
    header = f"{'kernel':<24}" + "".join(f"{b + ' ms':>16}" for b in backends)
    header += "".join(f"{b + ' x':>14}" for b in backends[1:])
    print(header)
    print("-" * len(header))
    for name, ms in figures.items():
        line = f"{name:<24}" + "".join(f"{ms[b]:>16.3f}" for b in backends)
        line += "".join(f"{ms['python'] / ms[b]:>13.2f}x" for b in backends[1:])
        print(line)
    print("x = python-reference time / backend time (higher is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
