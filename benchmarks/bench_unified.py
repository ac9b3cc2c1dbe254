"""Unified radix cache benchmark: the twin against SGLang 0.5.23's two tree cores, in one run.

Three trees take the same calls: kvpool's optimized ``UnifiedRadixCache`` (FULL component,
unchecked, as an engine runs it), and SGLang 0.5.23's own ``UnifiedRadixCache`` with
``tree_components=(FULL,)`` over its compiled Rust tree core (``tree_core_backend="rust"``,
SGLang's default) and over its Python tree core (``"python"``). SGLang's code is loaded from
the published wheel at run time (:func:`kvpool.sglang.load_sglang`, :func:`kvpool.sglang.
tree_core.load_unified`; ``$KVPOOL_SGLANG_CACHE`` or ``--sglang`` say where), never stored
here; its methods are called directly in the timed code (no kvpool adapter), its keys built
before timing as SGLang builds them (``RadixKey(array('q'))``), the twin's as int32 arrays.
When SGLang cannot be loaded its columns stay empty, a row says why, and the twin still runs.

Timed, at page sizes 1 and 16 (medians over many calls, each call timed alone; the three trees
are built side by side and take turns in 20 blocks of consecutive calls, see
:func:`interleaved_medians`):

- ``match_prefix`` on the tree of benchmarks/bench_radix.py (2,000-token system prompts,
  5,000-token histories, 1,000-token final turns; 20 system prompts: 2,000 inserted 8,000-token
  sequences; ``--quick``: 5, 500) of an unseen sequence sharing 7,000 tokens (6,992 at page
  size 16). SGLang 0.5.23's match returns the matched length and node only; the scheduler then
  reads the slots with ``path_device_indices`` (the twin's match returns them), so SGLang is
  timed both ways: the match alone, and the match plus ``path_device_indices``;
- ``insert`` of such a sequence (one new 1,000-token leaf) with ``prev_prefix_len`` = the
  matched length (the scheduler's case: the prefix slots are the tree's own, nothing to free),
  and again with ``prev_prefix_len=0`` (the tree frees the 7,000 duplicate slots itself, one
  ``free_segment`` per overlapped node);
- ``evict`` of 256 tokens from a tree of many leaves: 32 prefixes of 1,024 tokens, each with
  256 leaves of 64 tokens, inserted round-robin (8,192 leaves; ``--quick``: 8 x 128); 1,000
  evictions in sequence (``--quick``: 200), each 4 least recently used leaves.

The allocator of these rows is a stub: ``page_size``, ``device`` and frees that only count.

Trace replay: kvpool's shipped sample of Mooncake's conversation trace
(``kvpool/data/conversation_sample.jsonl``, 400 requests, 5.7M prompt tokens; tokens from
:func:`kvpool.traces.request_token_array`, cut to whole pages; ``--quick``: the first 100)
replayed on each tree over a page pool of :data:`POOL_TOKENS` slots, as the scheduler does it:
per request ``match_prefix`` (and SGLang's ``path_device_indices``: the prefix's slots), lock the
matched node, ``evict`` when the pool has fewer free slots than the request's new tokens, take
fresh slots for them, ``insert`` (prefix slots + fresh slots, ``prev_prefix_len`` = matched
length), unlock. Times are CPU seconds of the benchmark thread (``time.thread_time``) summed over
the tree calls only (the pool's own work, key building and slot concatenation are outside); the
three trees must report the same hits and evictions (the row says whether they did).

Ratios (SGLang core / twin) are measured in the same run: on a shared machine read them, not the
absolute times. The ``quiet`` ratios divide each tree's quietest block (replays: quietest round):
when other processes load the machine, memory-bound calls (SGLang's Rust insert copies the key
and slots into the core) slow down more than others, and these say what an unloaded machine
would show. ``--quick``: smaller trees, fewer calls, 100 requests.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.radix_key import RadixKey as OptKey
from kvpool.optimized.unified.radix_cache import UnifiedRadixCache as OptUnified
from kvpool.traces import SAMPLE_TRACE, TraceError, load_trace, request_token_array

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_radix, whoever loads this file
from bench_radix import (
    HIST_LEN,
    SGLANG_RELEASE,
    SYS_LEN,
    UNCHECKED,
    StubAllocator,
    TreeShape,
    load_sglang_or_reason,
    print_rows,
)

_BASE = "sglang.srt.mem_cache.base_prefix_cache"
CORES = ("rust", "python")
"""SGLang 0.5.23's tree cores, its default first."""

POOL_TOKENS = 1 << 20
"""Slots of the replay's pool (the sample's prompts hold about 5M distinct tokens: the trees
evict all along)."""

ROUNDS = 20
"""The trees take turns in this many blocks of calls (see :func:`interleaved_medians`)."""

REPLAY_ROUNDS = 5
"""Each replay runs this many times on fresh trees, the trees taking turns (``--quick``: 3);
the rows give the median round and the quietest."""

EVICT_TOKENS = 256
EVICT_PREFIX, EVICT_LEAF = 1024, 64

Tokens = npt.NDArray[np.int32]


class SegmentStub(StubAllocator):
    """bench_radix's stub plus the segment frees the unified cache calls; frees only count."""

    def free_segment(self, idx: Any, start_pos: int = 0) -> None:
        self.freed += len(idx)

    def free_full_segment(self, idx: Any, start_pos: int = 0) -> None:
        self.freed += len(idx)


class PagePool:
    """The replay's slots: a page-granular free list, identical for the three trees. A tree's
    free only records the tensor (the timed calls pay next to nothing for it); the pages come
    back on the next :meth:`available`, checked there (whole pages, none freed twice). Page 0
    is never handed out (SGLang keeps slot 0 as padding)."""

    def __init__(self, size: int, page_size: int) -> None:
        self.page_size = page_size
        self.device = "cpu"
        self._free: npt.NDArray[np.int64] = np.arange(1, size // page_size, dtype=np.int64)
        self._is_free = np.zeros(size // page_size, dtype=bool)
        self._is_free[1:] = True
        self._returned: list[torch.Tensor] = []

    def free(self, idx: torch.Tensor) -> None:
        self._returned.append(idx)

    def free_segment(self, idx: torch.Tensor, start_pos: int = 0) -> None:
        self._returned.append(idx)

    def free_full_segment(self, idx: torch.Tensor, start_pos: int = 0) -> None:
        self._returned.append(idx)

    def available(self) -> int:
        """Free slots, after taking back what the trees freed."""
        if self._returned:
            slots = torch.cat(self._returned).numpy()
            self._returned.clear()
            ps = self.page_size
            pages = slots[::ps] // ps
            assert len(slots) == len(pages) * ps, "a page freed in part"
            assert not self._is_free[pages].any(), "a page freed twice"
            self._is_free[pages] = True
            assert int(self._is_free.sum()) == len(self._free) + len(pages), "a page freed twice"
            self._free = np.concatenate((self._free, pages))
        return len(self._free) * self.page_size

    def alloc(self, num_tokens: int) -> torch.Tensor:
        """``num_tokens`` (whole pages) fresh slots (the caller evicted enough first)."""
        if self.available() < num_tokens:
            raise RuntimeError(f"pool: {num_tokens} slots asked, {self.available()} free")
        n = num_tokens // self.page_size
        pages, self._free = self._free[:n], self._free[n:]
        self._is_free[pages] = False
        offsets = np.arange(self.page_size, dtype=np.int64)
        return torch.from_numpy((pages[:, None] * self.page_size + offsets).reshape(-1))


# ---------------------------------------------------------------------------- the three trees
class SGLangSide:
    """SGLang 0.5.23's unified cache classes and parameter records, loaded once."""

    def __init__(self, modules: Any) -> None:
        from kvpool.sglang import make_radix_key
        from kvpool.sglang.tree_core import load_unified

        self.modules = modules
        self.unified = load_unified(modules)
        self.params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        self.match_params = modules.attr(_BASE, "MatchPrefixParams")
        self.insert_params = modules.attr(_BASE, "InsertParams")
        self.evict_params = modules.attr(_BASE, "EvictParams")
        self._make_key: Any = make_radix_key  # takes any int sequence, numpy arrays too

    def cache(self, core: str, allocator: Any, page_size: int) -> Any:
        """SGLang's ``UnifiedRadixCache`` (FULL) over tree core ``core``."""
        params = self.params(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=allocator,
            page_size=page_size,
            eviction_policy="lru",
            tree_components=self.unified.components(("full",)),
            tree_core_backend=core,
        )
        cache = self.unified.cache_module.UnifiedRadixCache(params)
        chosen = type(cache.tree_core).__name__
        assert ("Rust" in chosen) == (core == "rust"), (core, chosen)
        return cache

    def key(self, tokens: Tokens) -> Any:
        """SGLang's ``RadixKey`` of ``tokens`` (built outside the timed calls)."""
        return self._make_key(self.modules, tokens, None)


def _twin(allocator: Any, page_size: int) -> OptUnified:
    return OptUnified(None, allocator, page_size, options=UNCHECKED)  # type: ignore[arg-type]


Op = tuple[Callable[[Any], Any], list[Any]]
"""A timed operation: the call and its argument for each timed call."""

Figure = tuple[float, float]
"""A tree's time for a row: the median, and the quietest block's (or round's) median."""


def interleaved_medians(ops: dict[str, Op]) -> dict[str, Figure]:
    """Median time (us) of each operation's calls, each call timed alone, and the lowest median
    of one block. The trees take turns in :data:`ROUNDS` blocks of consecutive calls (the first
    to go rotates), so that a busy spell on the shared machine falls on all of them, while a
    block keeps one tree's calls together (one call of another tree in between would empty the
    CPU caches it uses)."""
    names = list(ops)
    calls = len(ops[names[0]][1])
    block = max(1, -(-calls // ROUNDS))
    times: dict[str, list[int]] = {name: [] for name in names}
    quietest: dict[str, float] = {name: float("inf") for name in names}
    for r, start in enumerate(range(0, calls, block)):
        for j in range(len(names)):
            name = names[(r + j) % len(names)]
            fn, args = ops[name]
            ts = []
            for arg in args[start : start + block]:
                t0 = time.perf_counter_ns()
                fn(arg)
                ts.append(time.perf_counter_ns() - t0)
            times[name] += ts
            quietest[name] = min(quietest[name], statistics.median(ts))
    return {
        name: (statistics.median(t) / 1000.0, quietest[name] / 1000.0) for name, t in times.items()
    }


def _tree_data(num_sys: int, calls: int) -> tuple[list[Tokens], list[list[Tokens]]]:
    """The tree's sequences and three distinct probe sets (match, insert, insert from 0)."""
    shape = TreeShape(num_sys, seed=3)
    seqs = list(shape.sequences())
    return seqs, [shape.probes(calls) for _ in range(3)]


class Tree:
    """One of the three trees over a :class:`SegmentStub`: its cache and its timed calls."""

    def __init__(self, side: SGLangSide | None, core: str, page_size: int) -> None:
        self.side, self.page_size = side, page_size
        self.alloc = SegmentStub(page_size)
        self.cache: Any = (
            _twin(self.alloc, page_size)
            if side is None
            else side.cache(core, self.alloc, page_size)
        )

    def key(self, tokens: Tokens) -> Any:
        return OptKey(tokens) if self.side is None else self.side.key(tokens)

    def build(self, seqs: list[Tokens]) -> float:
        """Insert ``seqs`` (keys built inside: a build is not a timed figure); seconds."""
        longest = max(len(s) for s in seqs)
        values = torch.arange(1, longest + 1, dtype=torch.int64)
        t0 = time.perf_counter()
        if self.side is None:
            for seq in seqs:
                self.cache.insert(OptKey(seq), values, prev_prefix_len=0)
        else:
            ip, insert = self.side.insert_params, self.cache.insert
            for seq in seqs:
                insert(ip(key=self.side.key(seq), value=values))
        return time.perf_counter() - t0

    def matched(self, key: Any) -> int:
        """Length of the match of ``key`` (checked against the slots SGLang reads back)."""
        if self.side is None:
            return len(self.cache.match_prefix(key).device_indices)
        got = self.cache.match_prefix(self.side.match_params(key=key))
        assert len(self.cache.path_device_indices(got.last_device_node)) == got.device_prefix_len
        return int(got.device_prefix_len)

    def tree_ops(self, probes: list[list[Tokens]], prefix: int) -> dict[str, Op]:
        """The timed calls of the big tree: match, match + slots, insert (``prev_prefix_len``
        ``prefix``, then 0), on keys built here, before timing."""
        match_keys, ins_keys, ins0_keys = ([self.key(p) for p in probe] for probe in probes)
        values = torch.arange(1, max(len(p) for p in probes[1]) + 1, dtype=torch.int64)
        cache = self.cache
        if self.side is None:
            return {
                "match": (cache.match_prefix, match_keys),
                "match+slots": (cache.match_prefix, match_keys),  # its match returns the slots
                "insert": (lambda k: cache.insert(k, values, prev_prefix_len=prefix), ins_keys),
                "insert0": (lambda k: cache.insert(k, values, prev_prefix_len=0), ins0_keys),
            }
        mp, ip = self.side.match_params, self.side.insert_params
        match, insert, path = cache.match_prefix, cache.insert, cache.path_device_indices
        return {
            "match": (lambda k: match(mp(key=k)), match_keys),
            "match+slots": (lambda k: path(match(mp(key=k)).last_device_node), match_keys),
            "insert": (lambda k: insert(ip(key=k, value=values, prev_prefix_len=prefix)), ins_keys),
            "insert0": (lambda k: insert(ip(key=k, value=values)), ins0_keys),
        }

    def evict_op(self, calls: int) -> Op:
        """``calls`` evictions of :data:`EVICT_TOKENS` tokens."""
        if self.side is None:
            return self.cache.evict, [EVICT_TOKENS] * calls
        ep, evict = self.side.evict_params, self.cache.evict
        return (lambda n: evict(ep(num_tokens=n))), [EVICT_TOKENS] * calls

    def evictable(self) -> int:
        return int(self.cache.evictable_size())


def _evict_data(prefixes: int, leaves: int) -> list[Tokens]:
    """Sequences of the eviction tree, round-robin over the prefixes; each leaf's first token
    is its own (no two leaves share a node)."""
    rng = np.random.default_rng(4)
    heads = [rng.integers(0, 32000, EVICT_PREFIX, dtype=np.int32) for _ in range(prefixes)]
    out = []
    for leaf in range(leaves):
        for head in heads:
            tail = rng.integers(0, 32000, EVICT_LEAF, dtype=np.int32)
            tail[0] = 32000 + leaf
            out.append(np.concatenate((head, tail)))
    return out


def measure_trees(
    side: SGLangSide | None, cores: tuple[str, ...], ps: int, quick: bool
) -> tuple[dict[str, dict[str, Figure]], str, str]:
    """Medians (us) per operation per tree (``"twin"`` and each core) at page size ``ps``,
    and the notes of the big tree and the eviction tree."""
    num_sys, calls = (5, 200) if quick else (20, 2000)
    seqs, probes = _tree_data(num_sys, calls)
    expected = (SYS_LEN + HIST_LEN) // ps * ps
    trees = {"twin": Tree(None, "", ps)} | {core: Tree(side, core, ps) for core in cores}
    builds = {name: tree.build(seqs) for name, tree in trees.items()}
    del seqs
    for name, tree in trees.items():
        got = tree.matched(tree.key(probes[0][0]))
        assert got == expected, (name, got, expected)
    ops = {name: tree.tree_ops(probes, expected) for name, tree in trees.items()}
    out: dict[str, dict[str, Figure]] = {name: {} for name in trees}
    for op in ("match", "match+slots", "insert", "insert0"):
        freed = {name: tree.alloc.freed for name, tree in trees.items()}
        for name, fig in interleaved_medians({n: o[op] for n, o in ops.items()}).items():
            out[name][op] = fig
        # every tree freed the same duplicates (prev_prefix_len=0: at least the prefix's; a
        # final turn whose first tokens a cached one shares adds a few, in every tree alike)
        dups = {tree.alloc.freed - freed[name] for name, tree in trees.items()}
        assert len(dups) == 1 and min(dups) >= (expected * calls if op == "insert0" else 0), op
    tree_note = f"{num_sys * 100:,} seqs; built in " + ", ".join(
        f"{name} {s:.2f} s" for name, s in builds.items()
    )
    del trees, ops
    prefixes, leaves, ev_calls = (8, 128, 200) if quick else (32, 256, 1000)
    ev_seqs = _evict_data(prefixes, leaves)
    trees = {"twin": Tree(None, "", ps)} | {core: Tree(side, core, ps) for core in cores}
    for tree in trees.values():
        tree.build(ev_seqs)
    before = {name: tree.evictable() for name, tree in trees.items()}
    evicts = interleaved_medians({name: tree.evict_op(ev_calls) for name, tree in trees.items()})
    for name, tree in trees.items():
        assert before[name] - tree.evictable() == EVICT_TOKENS * ev_calls, name
        out[name]["evict"] = evicts[name]
    ev_note = f"{len(ev_seqs):,} leaves of {EVICT_LEAF} tokens; {ev_calls} evictions in a row"
    return out, tree_note, ev_note


# ---------------------------------------------------------------------------- trace replay
def _prompts(quick: bool, ps: int) -> list[Tokens]:
    """The sample's prompts (the first 100 with ``quick``), cut to whole pages."""
    records = load_trace(SAMPLE_TRACE, limit=100 if quick else None)
    return [t[: len(t) // ps * ps] for t in map(request_token_array, records)]


def replay_twin(prompts: list[Tokens], ps: int) -> tuple[float, int, int]:
    """CPU seconds in the twin's tree calls over the replay; tokens hit, tokens evicted."""
    pool = PagePool(POOL_TOKENS, ps)
    cache = _twin(pool, ps)
    match, lock, unlock = cache.match_prefix, cache.inc_lock_ref, cache.dec_lock_ref
    insert, evict = cache.insert, cache.evict
    keys = [OptKey(p) for p in prompts]
    total, hits, evicted = 0.0, 0, 0
    for key, prompt in zip(keys, prompts, strict=True):
        t0 = time.thread_time()
        result = match(key)
        node = result.last_device_node
        lock(node)
        total += time.thread_time() - t0
        prefix = result.device_indices
        m = len(prefix)
        need = len(prompt) - m
        short = need - pool.available()
        if short > 0:
            t0 = time.thread_time()
            evicted += evict(short)
            total += time.thread_time() - t0
        value = torch.cat((prefix, pool.alloc(need)))
        t0 = time.thread_time()
        insert(key, value, prev_prefix_len=m)
        unlock(node)
        total += time.thread_time() - t0
        hits += m
    return total, hits, evicted


def replay_sglang(
    side: SGLangSide, core: str, prompts: list[Tokens], ps: int
) -> tuple[float, int, int]:
    """:func:`replay_twin` on SGLang's unified cache over ``core`` (match + the slots through
    ``path_device_indices``, lock with the receipt SGLang hands back, evict, insert, unlock)."""
    pool = PagePool(POOL_TOKENS, ps)
    cache = side.cache(core, pool, ps)
    match, path = cache.match_prefix, cache.path_device_indices
    lock, unlock = cache.inc_lock_ref, cache.dec_lock_ref
    insert, evict = cache.insert, cache.evict
    mp, ip, ep = side.match_params, side.insert_params, side.evict_params
    keys = [side.key(p) for p in prompts]
    total, hits, evicted = 0.0, 0, 0
    for key, prompt in zip(keys, prompts, strict=True):
        t0 = time.thread_time()
        result = match(mp(key=key))
        node = result.last_device_node
        prefix = path(node)
        receipt = lock(node).to_dec_params()
        total += time.thread_time() - t0
        m = len(prefix)
        need = len(prompt) - m
        short = need - pool.available()
        if short > 0:
            t0 = time.thread_time()
            evicted += evict(ep(num_tokens=short)).num_tokens_evicted
            total += time.thread_time() - t0
        value = torch.cat((prefix, pool.alloc(need)))
        t0 = time.thread_time()
        insert(ip(key=key, value=value, prev_prefix_len=m))
        unlock(node, receipt)
        total += time.thread_time() - t0
        hits += m
    return total, hits, evicted


# ---------------------------------------------------------------------------- rows
def _row(op: str, twin: Figure, sg: dict[str, Figure], unit: str, note: str) -> dict[str, Any]:
    """One row: the medians, their ratios, and the ratios of the quietest blocks' medians."""
    digits = 3 if unit == "s" else 1
    row: dict[str, Any] = {"bench": "unified", "op": op, f"twin_{unit}": round(twin[0], digits)}
    for core in CORES:
        row[f"sglang_{core}_{unit}"] = round(sg[core][0], digits) if core in sg else None
    for core in CORES:
        row[f"{core}/twin"] = round(sg[core][0] / twin[0], 2) if core in sg else None
    for core in CORES:
        row[f"quiet {core}/twin"] = round(sg[core][1] / twin[1], 2) if core in sg else None
    row["note"] = note
    return row


def run(quick: bool = False, sglang: str = SGLANG_RELEASE) -> list[dict[str, Any]]:
    """Measure and return one row per (operation, page size), then the replays. ``sglang``:
    the SGLang source to compare with (a release number, a path, ``"none"`` to skip)."""
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    modules, why = (None, "SGLang skipped") if sglang == "none" else load_sglang_or_reason(sglang)
    side: SGLangSide | None = None
    if modules is not None:
        try:
            side = SGLangSide(modules)
        except Exception as exc:  # a release without the unified cache, no msgspec, no .so
            why = f"SGLang {sglang}'s unified cache not loaded ({type(exc).__name__}: {exc})"
    cores = CORES if side is not None else ()
    for ps in (1, 16):
        got, tree_note, ev_note = measure_trees(side, cores, ps, quick)
        expected = (SYS_LEN + HIST_LEN) // ps * ps
        for op, label, note in (
            ("match", "match_prefix (SGLang: length + node)", tree_note),
            ("match+slots", "match_prefix + slots (SGLang: + path_device_indices)", tree_note),
            ("insert", f"insert, 1,000 new tokens, prev_prefix_len={expected}", tree_note),
            ("insert0", f"insert, prev_prefix_len=0 (frees {expected:,} duplicates)", tree_note),
            ("evict", f"evict {EVICT_TOKENS} tokens", ev_note),
        ):
            per_core = {core: got[core][op] for core in cores}
            rows.append(_row(f"{label} ps={ps}", got["twin"][op], per_core, "us", note))
    for ps in (1, 16):
        try:
            prompts = _prompts(quick, ps)
        except TraceError as exc:
            rows.append({"bench": "unified", "op": f"replay (skipped: {exc})"})
            break
        rounds = 3 if quick else REPLAY_ROUNDS
        times: dict[str, list[float]] = {name: [] for name in ("twin", *cores)}
        outcomes: set[tuple[int, int]] = set()
        for _ in range(rounds):  # the trees take turns, so a busy spell hits all of them
            seconds, hits, evicted = replay_twin(prompts, ps)
            times["twin"].append(seconds)
            outcomes.add((hits, evicted))
            for core in cores:
                assert side is not None
                seconds, core_hits, core_evicted = replay_sglang(side, core, prompts, ps)
                times[core].append(seconds)
                outcomes.add((core_hits, core_evicted))
        figs = {name: (statistics.median(t), min(t)) for name, t in times.items()}
        sg_s = {core: figs[core] for core in cores}
        same = len(outcomes) == 1
        note = (
            f"median of {rounds}; pool {POOL_TOKENS:,} slots; {hits:,} tokens hit, "
            f"{evicted:,} evicted"
            + ("" if not cores else "; same in all trees" if same else "; TREES DIFFER")
        )
        label = f"replay, {len(prompts)} conversation requests ps={ps}"
        rows.append(_row(label, figs["twin"], sg_s, "s", note))
    if side is None:  # last, so that the table's columns come in the rows' order
        rows.append({"bench": "unified", "op": "SGLang columns", "note": why})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller trees, fewer calls")
    parser.add_argument(
        "--sglang",
        default=SGLANG_RELEASE,
        help="SGLang to compare with: a release number, a wheel or folder path, or none",
    )
    args = parser.parse_args()
    print_rows(run(args.quick, args.sglang))


if __name__ == "__main__":
    main()
