"""KV storage variants: the optimized twin against the reference, measured in the same run.

Pools of 1,024 slots (page size 16), 2 layers, 8 heads of 64 channels (MLA FP4: one fused row of
512 + 64). Per variant, medians of calls timed one by one:

- ``set_kv_buffer``: 256 tokens of one layer (quantised for FP4 / MXFP8 / MLA FP4);
- ``get_key_buffer``: one layer read back (dequantised: the whole layer, 1,040 rows);
- ``read_tags``: the tags of 256 slots (what the lifecycle's integrity check reads).

Both sides get the same values (float32-exact); the first call of each op checks that they store
the same bytes (or, for page-major, the same raw buffer) before anything is timed. The twin is
unchecked, one torch thread; the reference gets nested lists. ``--quick``: fewer calls.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import kvpool.optimized.kv.fp4 as opt_fp4
import kvpool.optimized.kv.mla_fp4 as opt_mla
import kvpool.optimized.kv.mxfp8 as opt_mx
import kvpool.optimized.kv.page_major as opt_pm
import kvpool.reference.kv.fp4 as ref_fp4
import kvpool.reference.kv.mla_fp4 as ref_mla
import kvpool.reference.kv.mxfp8 as ref_mx
import kvpool.reference.kv.page_major as ref_pm
from kvpool.optimized.options import TwinOptions

SIZE, PAGE, LAYERS, HEADS, DIM, TOKENS = 1024, 16, 2, 8, 64, 256
UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: no device-to-host reads for checks."""


def _median_us(call: Callable[[], object], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def _stored(kv: Any) -> Any:
    if hasattr(kv, "raw_bytes"):
        return kv.raw_bytes()
    return [x.view(torch.uint8).tolist() if isinstance(x, torch.Tensor) else x
            for x in kv.get_raw_kv_buffer(0)]  # fmt: skip


def pairs() -> dict[str, tuple[Any, Any, int, int]]:
    """name -> (reference pool, twin pool, heads, dim)."""
    mha = (SIZE, PAGE, "float32", HEADS, DIM, LAYERS)
    return {
        "FP4": (ref_fp4.MHATokenToKVPoolFP4(*mha),
                opt_fp4.MHATokenToKVPoolFP4(*mha, options=UNCHECKED), HEADS, DIM),
        "MXFP8": (ref_mx.MHATokenToKVPoolMXFP8(*mha),
                  opt_mx.MHATokenToKVPoolMXFP8(*mha, options=UNCHECKED), HEADS, DIM),
        "page-major": (ref_pm.PageMajorMHATokenToKVPool(*mha),
                       opt_pm.PageMajorMHATokenToKVPool(*mha, options=UNCHECKED), HEADS, DIM),
        "MLA FP4": (ref_mla.MLATokenToKVPoolFP4(SIZE, PAGE, 512, 64, LAYERS),
                    opt_mla.MLATokenToKVPoolFP4(SIZE, PAGE, 512, 64, LAYERS, options=UNCHECKED),
                    1, 576),
    }  # fmt: skip


def _variant_rows(
    name: str, ref: Any, twin: Any, heads: int, dim: int, rng: random.Random, calls: int
) -> list[dict[str, Any]]:
    loc = rng.sample(range(PAGE, SIZE + PAGE), TOKENS)
    values = torch.randn(TOKENS, heads, dim, generator=torch.Generator().manual_seed(1))
    nested, loc_t = values.tolist(), torch.tensor(loc)
    ref.set_kv_buffer(0, loc, nested, nested)
    twin.set_kv_buffer(0, loc_t, values, values)
    assert _stored(ref) == _stored(twin), name
    tags = [rng.randint(1, 16_777_213) for _ in loc]
    ref.write_tags(loc, tags)
    twin.write_tags(loc_t, tags)
    assert ref.read_tags(loc) == twin.read_tags(loc_t) == tags, name
    ops: list[tuple[str, Callable[[], object], Callable[[], object]]] = [
        (f"set_kv_buffer, {TOKENS} tokens", lambda: ref.set_kv_buffer(0, loc, nested, nested),
         lambda: twin.set_kv_buffer(0, loc_t, values, values)),
        ("get_key_buffer, one layer", lambda: ref.get_key_buffer(1),
         lambda: twin.get_key_buffer(1)),
        (f"read_tags, {TOKENS} slots", lambda: ref.read_tags(loc), lambda: twin.read_tags(loc_t)),
    ]  # fmt: skip
    rows = []
    for op, ref_call, twin_call in ops:
        ref_us = _median_us(ref_call, max(calls // 4, 3))
        twin_us = _median_us(twin_call, calls)
        rows.append({"variant": name, "op": op, "reference_us": round(ref_us),
                     "twin_us": round(twin_us), "ratio": round(ref_us / twin_us, 1)})  # fmt: skip
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """One row per variant and operation (see the module docstring)."""
    torch.set_num_threads(1)
    calls = 5 if quick else 21
    rng = random.Random(0)
    rows: list[dict[str, Any]] = []
    for name, (ref, twin, heads, dim) in pairs().items():
        rows += _variant_rows(name, ref, twin, heads, dim, rng, calls)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in run(parser.parse_args().quick):
        print(row)


if __name__ == "__main__":
    main()
