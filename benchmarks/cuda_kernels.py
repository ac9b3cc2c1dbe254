"""GPU timings of the compiled Triton kernels, as achieved bandwidth vs the device's peak.

For each kernel and size the script checks the Triton result against the torch fallback (both
on the GPU), times the public call with ``triton.testing.do_bench`` (median, ms; includes the
small prefix-sum launches the wrappers make), counts the bytes the kernel must move at least
(every index read and written once) and prints ``GB/s`` and the fraction of the peak.

Peak: ``--peak-gbps`` if given; else from the device properties (2 x memory clock x bus width,
for DDR/HBM); else a table of known devices. Without CUDA it prints a skip line and exits 0.

    python benchmarks/cuda_kernels.py [--quick] [--peak-gbps 4800]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvpool.kernels import (
    alloc_decode,
    alloc_extend,
    create_flashinfer_kv_indices,
    create_flashmla_kv_indices,
    get_last_loc,
    write_req_to_token,
)
from kvpool.reference.pools.paged_ops import extend_new_pages

KNOWN_PEAK_GBPS = {"H200": 4800.0, "H100": 3350.0, "H800": 3350.0, "A100": 2039.0, "L40S": 864.0}
"""Fallback peaks (GB/s) matched against the device name when its properties lack the clock."""

I32, I64 = 4, 8  # bytes per index


def peak_gbps(override: float | None) -> tuple[float, str]:
    """(peak GB/s, how it was found)."""
    if override:
        return override, "--peak-gbps"
    props = torch.cuda.get_device_properties(0)
    clock_khz = getattr(props, "memory_clock_rate", 0)
    bus_bits = getattr(props, "memory_bus_width", 0)
    if clock_khz and bus_bits:
        return 2 * clock_khz * 1e3 * bus_bits / 8 / 1e9, "device properties"
    for name, gbps in KNOWN_PEAK_GBPS.items():
        if name in props.name:
            return gbps, f"table entry {name}"
    raise SystemExit(f"unknown peak bandwidth for {props.name}; pass --peak-gbps")


@dataclass
class Case:
    name: str
    run: Callable[[str], object]  # backend name -> result (output tensors)
    bytes_moved: int


def build_cases(
    bs: int, prefix: int, extend: int, ps: int, seed: int = 0, device: str = "cuda"
) -> list[Case]:
    """Random valid inputs on ``device``: ``bs`` requests, prefixes up to ``prefix`` tokens,
    extends up to ``extend`` tokens, page size ``ps``."""
    rng = random.Random(seed)
    dev = torch.device(device)

    def t(values: list[int], dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=dev)

    pl = [rng.randrange(0, prefix + 1) for _ in range(bs)]
    sl = [p + rng.randrange(1, extend + 1) for p in pl]
    loc = [-1 if p == 0 else rng.randrange(1, 1000) * ps + (p - 1) % ps for p in pl]
    n_pages = sum(extend_new_pages(p, s, ps) for p, s in zip(pl, sl, strict=True))
    free = t(rng.sample(range(1, 4 * n_pages + 8), n_pages + 4))
    n_ext, n_all = sum(sl) - sum(pl), sum(sl)
    cols = -(-max(sl) // ps) * ps
    table = torch.randint(1, 2**20, (bs + 1, cols), dtype=torch.int32, device=dev)
    rows = t(rng.sample(range(1, bs + 1), bs))
    p_t, s_t, loc_t = t(pl), t(sl), t(loc)
    prefix_slots = torch.randint(1, 2**20, (sum(pl),), device=dev)
    new_slots = torch.randint(1, 2**20, (n_ext,), device=dev)
    indptr = t([0, *itertools.accumulate(sl)], torch.int32)
    n_blocks = cols // ps

    # One output buffer per (kernel, backend), allocated once: timing excludes allocation,
    # and every kernel is idempotent on its output.
    bufs: dict[tuple[str, str], torch.Tensor] = {}

    def buf(key: str, b: str, make: Callable[[], torch.Tensor]) -> torch.Tensor:
        if (key, b) not in bufs:
            bufs[key, b] = make()
        return bufs[key, b]

    def run_extend(b: str) -> object:
        out = buf("extend", b, lambda: torch.empty(n_ext, dtype=torch.int64, device=dev))
        alloc_extend(p_t, s_t, loc_t, free, out, ps, b)
        return out

    def run_decode(b: str) -> object:
        out = buf("decode", b, lambda: torch.empty(bs, dtype=torch.int64, device=dev))
        alloc_decode(s_t, loc_t, free, out, ps, b)
        return out

    def run_write(b: str) -> object:
        tab = buf("write", b, table.clone)
        write_req_to_token(tab, rows, prefix_slots, p_t, s_t, new_slots, b)
        return tab

    def run_flashinfer(b: str) -> object:
        out = buf("fi", b, lambda: torch.zeros(n_all, dtype=torch.int32, device=dev))
        create_flashinfer_kv_indices(table, rows, s_t, indptr, None, out, b)
        return out

    def run_flashmla(b: str) -> object:
        make = lambda: torch.zeros(bs, n_blocks, dtype=torch.int32, device=dev)  # noqa: E731
        out = buf("mla", b, make)
        create_flashmla_kv_indices(table, rows, s_t, None, out, ps, b)
        return out

    return [
        Case("alloc_extend", run_extend, 5 * I64 * bs + I64 * (n_pages + n_ext)),
        Case("alloc_decode", run_decode, 4 * I64 * bs),
        Case("write_req_to_token", run_write, 4 * I64 * bs + (I64 + I32) * n_all),
        Case("get_last_loc", lambda b: get_last_loc(table, rows, p_t, b), (3 * I64 + I32) * bs),
        Case("flashinfer_kv_indices", run_flashinfer, 3 * I64 * bs + 2 * I32 * n_all),
        Case("flashmla_kv_indices", run_flashmla, 2 * I64 * bs + 2 * I32 * -(-n_all // ps)),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Triton kernel bandwidth on CUDA")
    parser.add_argument("--quick", action="store_true", help="one size only")
    parser.add_argument("--peak-gbps", type=float, default=None, help="override the peak")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device; the Triton kernel benchmark needs a GPU")
        return 0
    from triton.testing import do_bench

    peak, source = peak_gbps(args.peak_gbps)
    print(f"device: {torch.cuda.get_device_name(0)}; peak {peak:.0f} GB/s ({source})")
    sizes = [(64, 2048, 512, 16)]
    if not args.quick:
        sizes += [(256, 8192, 4096, 64), (1024, 4096, 1, 1), (16, 0, 32768, 16)]
    print(f"{'kernel':<22}{'bs/P/E/ps':>22}{'MB':>9}{'ms':>10}{'GB/s':>10}{'% peak':>9}  check")
    failures = 0
    for bs, prefix, extend, ps in sizes:
        for case in build_cases(bs, prefix, extend, ps):
            got, want = case.run("triton"), case.run("torch")
            ok = isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor)
            ok = ok and torch.equal(got, want)  # type: ignore[arg-type]
            failures += not ok
            ms = float(do_bench(functools.partial(case.run, "triton"), return_mode="median"))
            gbps = case.bytes_moved / (ms * 1e-3) / 1e9
            print(
                f"{case.name:<22}{f'{bs}/{prefix}/{extend}/{ps}':>22}"
                f"{case.bytes_moved / 1e6:>9.2f}{ms:>10.4f}{gbps:>10.1f}"
                f"{100 * gbps / peak:>8.1f}%  {'ok' if ok else 'MISMATCH vs torch'}"
            )
    print("bytes = minimum traffic (each index read or written once); small batches are")
    print("launch-bound, so their fraction of peak is low by nature.")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
