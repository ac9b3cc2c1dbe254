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

SGLang side by side, in the same run: SGLang's own ``RadixCache`` (0.5.23 by default; its CPU
code loaded from the published wheel at run time by :func:`kvpool.sglang.load_sglang`, never
stored here; ``$KVPOOL_SGLANG_CACHE`` or ``--sglang`` name where it is) builds the same trees and
times the same probes, its keys built before timing as SGLang builds them (``array('q')``), its
methods called directly (no adapter in the timed call). 0.5.23's ``match_prefix`` returns the
matched length, not the slots (the twin returns the slots). When SGLang cannot be loaded its
columns stay empty and a row says why.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvpool.optimized.options import TwinOptions
from kvpool.optimized.radix.radix_cache import RadixCache as OptRadixCache
from kvpool.optimized.radix_key import RadixKey as OptKey
from kvpool.reference.radix.radix_cache import RadixCache as RefRadixCache
from kvpool.reference.radix_key import RadixKey as RefKey

SGLANG_RELEASE = "0.5.23"
_BASE = "sglang.srt.mem_cache.base_prefix_cache"

SYS_LEN, HIST_LEN, FINAL_LEN = 2000, 5000, 1000
HISTS_PER_SYS, FINALS_PER_HIST = 10, 10

UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: checks that need a device read off."""


class StubAllocator:
    """Only what the tree needs of an allocator; frees are counted, not performed."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self.device = "cpu"  # SGLang's tree reads it
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
        cache: Any = OptRadixCache(None, alloc, page_size, options=UNCHECKED)  # type: ignore[arg-type]
        for seq in shape.sequences():
            cache.insert(OptKey(seq), values)
    else:
        cache = RefRadixCache(None, alloc, page_size)  # type: ignore[arg-type]
        ref_values = values.tolist()
        for seq in shape.sequences():
            cache.insert(RefKey(seq.tolist()), ref_values)
    return cache, time.perf_counter() - t0


def load_sglang_or_reason(source: str) -> tuple[Any, str]:
    """(SGLang's modules, "") or (None, why they could not be loaded)."""
    try:
        from kvpool.sglang import load_sglang

        return load_sglang(source), ""
    except Exception as exc:  # no network, no cached wheel, no triton: skip SGLang's columns
        return None, f"SGLang {source} not loaded ({type(exc).__name__}: {exc})"


class SGLangTree:
    """SGLang's own ``RadixCache`` over the stub allocator, called without the adapter."""

    def __init__(self, modules: Any, page_size: int) -> None:
        from kvpool.sglang import SGLangRadixCache, make_radix_key

        self.modules = modules
        self.adapter = SGLangRadixCache(modules, None, StubAllocator(page_size), page_size)
        self.impl = self.adapter.impl
        cls = type(self.impl)
        self._match, self._insert = cls.match_prefix, cls.insert  # not the adapter's clock
        self._match_params = modules.attr(_BASE, "MatchPrefixParams")
        self._insert_params = modules.attr(_BASE, "InsertParams")
        self._make_key = make_radix_key

    def key(self, seq: Any) -> Any:
        """SGLang's key of ``seq`` (built outside the timed calls)."""
        return self._make_key(self.modules, seq, None)

    def match_prefix(self, key: Any) -> int:
        """SGLang's match; returns the matched length (tokens)."""
        result = self._match(self.impl, self._match_params(key=key))
        indices = getattr(result, "device_indices", None)
        return len(indices) if indices is not None else int(result.device_prefix_len)

    def insert(self, key: Any, value: torch.Tensor) -> None:
        self._insert(self.impl, self._insert_params(key=key, value=value))


def _build_sglang(modules: Any, shape: TreeShape, page_size: int) -> tuple[SGLangTree, float]:
    tree = SGLangTree(modules, page_size)
    values = torch.arange(1, 8001, dtype=torch.int64)
    t0 = time.perf_counter()
    for seq in shape.sequences():
        tree.insert(tree.key(seq), values)
    return tree, time.perf_counter() - t0


def _measure_sglang(
    tree: SGLangTree, shape: TreeShape, page_size: int, calls: int
) -> dict[str, float]:
    expected = (SYS_LEN + HIST_LEN) // page_size * page_size
    keys = [tree.key(p) for p in shape.probes(calls)]
    got = tree.match_prefix(keys[0])
    assert got == expected, (got, expected)
    values = torch.arange(1, 8001, dtype=torch.int64)
    return {
        "match_prefix": _median_us(tree.match_prefix, keys),
        "insert": _median_us(lambda k: tree.insert(k, values), keys),
    }


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


def run(quick: bool = False, sglang: str = SGLANG_RELEASE) -> list[dict[str, Any]]:
    """Measure and return one row per (operation, page size). ``sglang``: the SGLang source to
    compare with (a release number, a path, ``"none"`` to skip)."""
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    modules, why = (None, "SGLang skipped") if sglang == "none" else load_sglang_or_reason(sglang)
    if why:
        rows.append({"bench": "radix", "op": "SGLang columns", "note": why})
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
        sg: dict[str, float] = {}
        full: dict[str, float] = {}
        full_note = "full tree not built in --quick mode"
        if not quick:
            big = TreeShape(100, seed=2)
            big_cache, big_build = _build("optimized", big, ps)
            big_tokens = big_cache.total_size()
            full = _measure("optimized", big_cache, big, ps, calls_twin)
            full_note = f"full tree: 10,000 seqs, {big_tokens:,} tokens, built in {big_build:.1f} s"
            del big_cache
            if modules is not None:
                big = TreeShape(100, seed=2)  # the same tree and probes again
                sg_tree, sg_build = _build_sglang(modules, big, ps)
                sg = _measure_sglang(sg_tree, big, ps, calls_twin)
                full_note += f"; SGLang built it in {sg_build:.1f} s"
                del sg_tree
        elif modules is not None:
            small_again = TreeShape(5, seed=1)  # the same tree, then the twin's probes
            sg_tree, _ = _build_sglang(modules, small_again, ps)
            sg = _measure_sglang(sg_tree, small_again, ps, calls_twin)
            del sg_tree
        for op in ("match_prefix", "insert"):
            twin_arr = full.get(op, twin_small[op])
            twin_list = full.get(op + "_list", twin_small[op + "_list"])
            sg_us = sg.get(op)
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
                    f"sglang_{sglang}_us": None if sg_us is None else round(sg_us, 1),
                    "sglang/twin": None if sg_us is None else round(sg_us / twin_arr, 2),
                    "sglang/twin_list": None if sg_us is None else round(sg_us / twin_list, 2),
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
    parser.add_argument(
        "--sglang",
        default=SGLANG_RELEASE,
        help="SGLang to compare with: a release number, a wheel or folder path, or none",
    )
    args = parser.parse_args()
    print_rows(run(args.quick, args.sglang))


if __name__ == "__main__":
    main()
