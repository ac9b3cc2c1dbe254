"""Replay benchmark on Mooncake's conversation trace (in ``$KVPOOL_TRACES``, see kvpool.traces).

(a) ``tree``: every request of ``conversation_trace.jsonl`` (12,031) does ``match_prefix`` then
    ``insert`` of its whole prompt on the twin's RadixCache at page size 16 (stub allocator:
    values are views of one preallocated slot range, nothing is evicted). Only the two calls are
    timed (token synthesis is not). SGLang's own ``RadixCache`` (0.5.23 by default, loaded from
    the published wheel at run time, see benchmarks/bench_radix.py) replays the same requests in
    the same run, its keys built outside the timed calls; its column stays empty, with a reason,
    when it cannot be loaded. The reference replays the first :data:`REF_TREE_REQUESTS` requests
    for a ratio (the twin's time on the same prefix is measured in the same run).
(b) ``lifecycle``: the first 1,000 requests through the whole MemoryManager, on both twins, in
    batches of :data:`BATCH` (arrival order): ``new_req``; ``extend`` with chunked prefill
    (:data:`CHUNK` tokens per request per step) until every prompt is in; :data:`DECODE_CAP`
    decode steps (output lengths are capped at that to keep the run short); ``finish`` with
    insert. Pool: page size 16, :data:`POOL_TOKENS` slots (the tree evicts under pressure),
    1 layer of 1x1 MHA heads (the KV tags are written and are part of the cost).

Times are CPU seconds of the benchmark thread (``time.thread_time``): the machine is shared, and
wall time would count other processes' time slices. ``--quick``: (a) on the first 1,000
requests, (b) on the first 100.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as OptMM
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.radix.radix_cache import RadixCache as OptRadixCache
from kvpool.optimized.radix_key import RadixKey as OptKey
from kvpool.reference.lifecycle.memory_manager import MemoryManager as RefMM
from kvpool.reference.radix.radix_cache import RadixCache as RefRadixCache
from kvpool.reference.radix_key import RadixKey as RefKey
from kvpool.traces import (
    CONVERSATION_TRACE,
    TraceError,
    TraceRecord,
    load_trace,
    request_token_array,
)

SGLANG_RELEASE = "0.5.23"
PAGE_SIZE = 16
REF_TREE_REQUESTS = 300
BATCH = 4
CHUNK = 4096
DECODE_CAP = 4
POOL_TOKENS = 1 << 18

UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: checks that need a device read off."""


class StubAllocator:
    """Only what the tree needs of an allocator (nothing is evicted in the tree replay)."""

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size

    def free(self, idx: Any) -> None:
        pass


def replay_tree(twin: str, records: list[TraceRecord]) -> float:
    """CPU seconds (this thread, see :func:`time.thread_time`) spent in match_prefix + insert
    over ``records`` (page size 16). CPU time, not wall time: on a shared 2-core machine other
    processes' time slices would otherwise be counted."""
    longest = max(r.input_length for r in records)
    values = torch.arange(1, longest + 1, dtype=torch.int64)
    alloc = StubAllocator(PAGE_SIZE)
    total = 0.0
    if twin == "optimized":
        cache: Any = OptRadixCache(None, alloc, PAGE_SIZE, options=UNCHECKED)  # type: ignore[arg-type]
        for rec in records:
            key = OptKey(request_token_array(rec))
            t0 = time.thread_time()
            cache.match_prefix(key)
            cache.insert(key, values[: rec.input_length])
            total += time.thread_time() - t0
    else:
        cache = RefRadixCache(None, alloc, PAGE_SIZE)  # type: ignore[arg-type]
        ref_values = values.tolist()
        for rec in records:
            ref_key = RefKey(request_token_array(rec).tolist())
            t0 = time.thread_time()
            cache.match_prefix(ref_key)
            cache.insert(ref_key, ref_values[: rec.input_length])
            total += time.thread_time() - t0
    return total


def replay_tree_sglang(modules: Any, records: list[TraceRecord]) -> float:
    """:func:`replay_tree` on SGLang's own RadixCache (see benchmarks/bench_radix.py)."""
    from bench_radix import SGLangTree

    longest = max(r.input_length for r in records)
    values = torch.arange(1, longest + 1, dtype=torch.int64)
    tree = SGLangTree(modules, PAGE_SIZE)
    total = 0.0
    for rec in records:
        key = tree.key(request_token_array(rec))
        t0 = time.thread_time()
        tree.match_prefix(key)
        tree.insert(key, values[: rec.input_length])
        total += time.thread_time() - t0
    return total


def replay_lifecycle(twin: str, records: list[TraceRecord]) -> float:
    """CPU seconds (this thread) to push ``records`` through the whole lifecycle (see the
    module docstring); prompt synthesis is done before the clock starts."""
    longest = max(r.input_length for r in records)
    config = PoolConfig(
        size=POOL_TOKENS,
        page_size=PAGE_SIZE,
        req_pool_size=2 * BATCH,
        max_context_len=longest + DECODE_CAP + PAGE_SIZE,
        num_layers=1,
        head_num=1,
        head_dim=1,
    )
    mm: Any = OptMM(config, checked=False) if twin == "optimized" else RefMM(config)
    prompts = [request_token_array(r).tolist() for r in records]
    t0 = time.thread_time()
    for start in range(0, len(records), BATCH):
        rids = [f"r{i}" for i in range(start, min(start + BATCH, len(records)))]
        for i, rid in enumerate(rids, start):
            mm.new_req(rid, prompts[i])
        pending = list(rids)
        while pending:
            mm.extend(pending, [CHUNK] * len(pending))
            pending = [rid for rid in pending if mm.reqs[rid].is_chunked]
        for step in range(min(DECODE_CAP, min(r.output_length for r in records[start:]) or 1)):
            mm.decode(rids, [(7 * step + k) % 32000 for k in range(len(rids))])
        mm.finish(rids)
    return time.thread_time() - t0


def run(
    quick: bool = False, ref_requests: int | None = None, sglang: str = SGLANG_RELEASE
) -> list[dict[str, Any]]:
    """Both replays; one row each (plus the reference-ratio row of the tree replay).
    ``sglang``: the SGLang source of the tree replay's comparison (``"none"`` to skip)."""
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_radix import load_sglang_or_reason

    try:  # the full trace is not shipped (kvpool/data holds a sample only)
        records = load_trace(CONVERSATION_TRACE, limit=1000 if quick else None)
    except TraceError as exc:
        return [{"bench": "replay", "op": f"(skipped: {exc})"}]
    rows: list[dict[str, Any]] = []
    twin_s = replay_tree("optimized", records)
    modules, why = (None, "SGLang skipped") if sglang == "none" else load_sglang_or_reason(sglang)
    sg_s = None if modules is None else replay_tree_sglang(modules, records)
    rows.append(
        {
            "bench": "replay",
            "op": f"tree match+insert, {len(records)} conversation requests, ps=16",
            "twin_s": round(twin_s, 3),
            f"sglang_{sglang}_s": None if sg_s is None else round(sg_s, 3),
            "sglang/twin": None if sg_s is None else round(sg_s / twin_s, 2),
            "note": why or "stub allocator; twin keys int32 arrays, SGLang's array('q')",
        }
    )
    n_ref = min(len(records), 100 if quick else REF_TREE_REQUESTS)
    ref_s = replay_tree("reference", records[:n_ref])
    twin_sub = replay_tree("optimized", records[:n_ref])
    rows.append(
        {
            "bench": "replay",
            "op": f"tree match+insert, first {n_ref} requests, ps=16",
            "reference_s": round(ref_s, 3),
            "twin_s": round(twin_sub, 3),
            "ref/twin": round(ref_s / twin_sub, 1),
        }
    )
    n_life = 100 if quick else 1000
    life = records[:n_life]
    twin_life = replay_lifecycle("optimized", life)
    n_ref = min(n_life, n_life if ref_requests is None else ref_requests)
    ref_life = replay_lifecycle("reference", life[:n_ref])
    twin_same = twin_life if n_ref == n_life else replay_lifecycle("optimized", life[:n_ref])
    note = f"batches of {BATCH}, pool {POOL_TOKENS} tokens, output capped at {DECODE_CAP}"
    rows.append(
        {
            "bench": "replay",
            "op": f"lifecycle, first {n_ref} requests, ps=16, chunk {CHUNK}, {DECODE_CAP} decodes",
            "reference_s": round(ref_life, 2),
            "twin_s": round(twin_same, 2),
            "ref/twin": round(ref_life / twin_same, 1),
            "note": note,
        }
    )
    if n_ref != n_life:
        rows.append(
            {
                "bench": "replay",
                "op": f"lifecycle, first {n_life} requests (twin only)",
                "twin_s": round(twin_life, 2),
                "note": note,
            }
        )
    return rows


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_radix import print_rows

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer requests")
    parser.add_argument(
        "--ref-requests",
        type=int,
        default=None,
        help="requests the reference lifecycle replays (default: the same as the twin)",
    )
    parser.add_argument(
        "--sglang",
        default=SGLANG_RELEASE,
        help="SGLang to compare with: a release number, a wheel or folder path, or none",
    )
    args = parser.parse_args()
    print_rows(run(args.quick, args.ref_requests, args.sglang))


if __name__ == "__main__":
    main()
