"""Radix-tree benchmark: ``match_prefix`` and ``insert`` on a big tree, twin vs reference.

The tree (issue 6): 100 system prompts of 2,000 tokens, each with 10 histories of 5,000 tokens,
each with 10 final turns of 1,000 tokens: 10,000 inserted 8,000-token sequences, 15.2M distinct
tokens. Timed operations (medians over many calls, each call timed alone):

- ``match_prefix`` of an 8,000-token key that matches 7,000 tokens (system prompt + history, then
  an unseen final turn), at page sizes 1 and 16 (at 16 the match is 6,992: the history node ends
  on the last whole page);
- ``insert`` of an 8,000-token sequence sharing those 7,000 tokens (a new 1,000-token leaf).

Every twin figure comes twice, side by side: with the key's token ids in an int32 array, and in a
Python list (as token ids usually arrive; the list -> array packing is part of the timed call).
The list keys are built before timing, like the arrays, and are distinct per call (so their int
objects are not in the CPU caches, as for a request whose tokens arrived a while ago).
Allocator: a stub with only ``page_size`` and ``free`` (nothing is evicted: pure tree cost).
The reference is far too slow to build the full tree, so both twins are also measured on a
smaller tree of the same shape (5 system prompts: 500 sequences); the twin/reference ratio comes
from that tree. ``--quick`` uses the small tree only and fewer calls.

SGLang 0.5.16's RadixCache on this machine class (figures from the issue): 39 us match, 46 us
match at page size 16, 45 us insert.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvpool.optimized.radix_cache import RadixCache as OptRadixCache
from kvpool.optimized.radix_key import RadixKey as OptKey
from kvpool.reference.radix_cache import RadixCache as RefRadixCache
from kvpool.reference.radix_key import RadixKey as RefKey

SGLANG_US = {"match_prefix": 39.0, "match_prefix_ps16": 46.0, "insert": 45.0}
"""SGLang 0.5.16's figures (microseconds) for the same shapes, from the issue."""

SYS_LEN, HIST_LEN, FINAL_LEN = 2000, 5000, 1000
HISTS_PER_SYS, FINALS_PER_HIST = 10, 10


class StubAllocator:
    """Only what the tree needs of an allocator; frees are counted, not performed."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.freed = 0

    def free(self, idx: Any) -> None:
        self.freed += len(idx)


class TreeShape:
    """Token arrays of a tree: system prompts, histories and final turns (seeded)."""

    def __init__(self, num_sys: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.num_sys = num_sys
        self.sys = [rng.integers(0, 32000, SYS_LEN, dtype=np.int32) for _ in range(num_sys)]
        self.hist = [
            [rng.integers(0, 32000, HIST_LEN, dtype=np.int32) for _ in range(HISTS_PER_SYS)]
            for _ in range(num_sys)
        ]
        self.rng = rng

    def sequences(self) -> Any:
        """Every inserted sequence (8,000 tokens), in insertion order."""
        for s in range(self.num_sys):
            for h in range(HISTS_PER_SYS):
                for _ in range(FINALS_PER_HIST):
                    final = self.rng.integers(0, 32000, FINAL_LEN, dtype=np.int32)
                    yield np.concatenate((self.sys[s], self.hist[s][h], final))

    def probes(self, n: int) -> list[np.ndarray]:
        """``n`` unseen 8,000-token sequences sharing 7,000 tokens with the tree."""
        out = []
        for i in range(n):
            s, h = i % self.num_sys, (i // self.num_sys) % HISTS_PER_SYS
            final = self.rng.integers(0, 32000, FINAL_LEN, dtype=np.int32)
            out.append(np.concatenate((self.sys[s], self.hist[s][h], final)))
        return out


def _median_us(fn: Callable[[Any], Any], args: list[Any]) -> float:
    times = []
    for a in args:
        t0 = time.perf_counter_ns()
        fn(a)
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000.0


def _build(twin: str, shape: TreeShape, page_size: int) -> tuple[Any, float]:
    """Insert every sequence of ``shape``; returns the cache and the build time (s)."""
    alloc = StubAllocator(page_size)
    values = torch.arange(1, 8001, dtype=torch.int64)
    t0 = time.perf_counter()
    if twin == "optimized":
        cache: Any = OptRadixCache(None, alloc, page_size)  # type: ignore[arg-type]
        for seq in shape.sequences():
            cache.insert(OptKey(seq), values)
    else:
        cache = RefRadixCache(None, alloc, page_size)  # type: ignore[arg-type]
        ref_values = values.tolist()
        for seq in shape.sequences():
            cache.insert(RefKey(seq.tolist()), ref_values)
    return cache, time.perf_counter() - t0


def _measure(
    twin: str, cache: Any, shape: TreeShape, page_size: int, calls: int
) -> dict[str, float]:
    """Median match and insert times (us) on ``cache``; the twin also with list keys (a second,
    distinct set of probes, so that its inserts add new leaves too)."""
    expected = (SYS_LEN + HIST_LEN) // page_size * page_size
    probes = shape.probes(calls)
    out: dict[str, float] = {}
    if twin == "optimized":
        keys = [OptKey(p) for p in probes]
        lists = [p.tolist() for p in shape.probes(calls)]
        for k, lst in zip(keys[:3], lists[:3], strict=True):
            assert len(cache.match_prefix(k).device_indices) == expected
            assert len(cache.match_prefix(OptKey(lst)).device_indices) == expected
        out["match_prefix"] = _median_us(cache.match_prefix, keys)
        out["match_prefix_list"] = _median_us(lambda lst: cache.match_prefix(OptKey(lst)), lists)
        values = torch.arange(1, 8001, dtype=torch.int64)
        out["insert"] = _median_us(lambda k: cache.insert(k, values), keys)
        out["insert_list"] = _median_us(lambda lst: cache.insert(OptKey(lst), values), lists)
    else:
        ref_keys = [RefKey(p.tolist()) for p in probes]
        assert len(cache.match_prefix(ref_keys[0]).device_indices) == expected
        out["match_prefix"] = _median_us(cache.match_prefix, ref_keys)
        ref_values = list(range(1, 8001))
        out["insert"] = _median_us(lambda k: cache.insert(k, ref_values), ref_keys)
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure and return one row per (operation, page size)."""
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    small = TreeShape(5, seed=1)
    calls_ref = 15 if quick else 60
    calls_twin = 200 if quick else 2000
    for ps in (1, 16):
        ref_cache, ref_build = _build("reference", small, ps)
        ref = _measure("reference", ref_cache, small, ps, calls_ref)
        del ref_cache
        twin_small_cache, twin_build = _build("optimized", small, ps)
        twin_small = _measure("optimized", twin_small_cache, small, ps, calls_twin)
        del twin_small_cache
        full: dict[str, float] = {}
        full_note = "full tree not built in --quick mode"
        if not quick:
            big = TreeShape(100, seed=2)
            big_cache, big_build = _build("optimized", big, ps)
            big_tokens = big_cache.total_size()
            full = _measure("optimized", big_cache, big, ps, calls_twin)
            full_note = f"full tree: 10,000 seqs, {big_tokens:,} tokens, built in {big_build:.1f} s"
            del big_cache
        for op in ("match_prefix", "insert"):
            sg = SGLANG_US["match_prefix_ps16" if (op == "match_prefix" and ps == 16) else op]
            twin_arr = full.get(op, twin_small[op])
            twin_list = full.get(op + "_list", twin_small[op + "_list"])
            rows.append(
                {
                    "bench": "radix",
                    "op": f"{op} ps={ps}",
                    "reference_us": round(ref[op], 1),
                    "twin_us": round(twin_small[op], 1),
                    "twin_list_us": round(twin_small[op + "_list"], 1),
                    "ref/twin": round(ref[op] / twin_small[op], 1),
                    "twin_full_tree_us": round(full[op], 1) if full else None,
                    "twin_full_tree_list_us": round(full[op + "_list"], 1) if full else None,
                    "sglang_us": sg,
                    "sglang/twin": round(sg / twin_arr, 2),
                    "sglang/twin_list": round(sg / twin_list, 2),
                    "note": (
                        f"small tree (500 seqs; ref build {ref_build:.1f} s, "
                        f"twin {twin_build:.2f} s); {full_note}"
                    ),
                }
            )
    return rows


def print_rows(rows: list[dict[str, Any]]) -> None:
    """Print rows as an aligned table (columns: the union of the rows' keys)."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    table = [[("" if r.get(c) is None else str(r.get(c))) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    for t in table:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small tree, fewer calls")
    print_rows(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
