"""Host-tier benchmark: the optimized twin's ``HiRadixCache`` and host pool against the
reference, measured in the same run.

A device pool of 8,192 tokens at page size 16 (MHA, 1 head of dim 2, 2 layers: the content is
tags, so buffer width does not matter), a host pool of twice that, write-through. One round:

- ``insert`` of 64 sequences of 128 tokens (distinct first pages): each writes its node to host
  (64 writes in flight);
- ``writing_check``: the 64 acknowledgements (tags copied device -> host, nodes unlocked);
- ``evict`` of every device token: 64 nodes become host-only;
- ``match_prefix`` + ``init_load_back`` of the 64 sequences, then ``ready_to_load_host_cache``:
  64 host hits restored into device slots (one merged load);
- ``loading_check``: the load acknowledgement (tags copied host -> device, nodes unlocked);
- the host pool alone: ``alloc`` of 4,096 slots, then ``free`` of them one page a call (256
  calls), and ``free`` of 4,096 slots in one call.

Each round starts from freshly built pools (untimed); every phase is timed as a whole with
``time.perf_counter``; the figures are medians over the rounds. Both twins' tree snapshots are
compared after each round. The twin is unchecked (production mode), one torch thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.optimized.options import TwinOptions
from kvpool.tags import kv_tags

PAGE, DEVICE, SEQS, LEN = 16, 8192, 64, 128
UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: no device-to-host reads for checks."""


def _build(twin: str) -> tuple[Any, Any, Any, Any]:
    if twin == "reference":
        from kvpool.reference import RadixKey, ReqToTokenPool
        from kvpool.reference.hicache.hiradix_cache import HiRadixCache
        from kvpool.reference.hicache.memory_pool_host import MHATokenToKVPoolHost
        from kvpool.reference.kv.mha import MHATokenToKVPool
        from kvpool.reference.pools.paged_allocator import PagedTokenToKVPoolAllocator

        alloc: Any = PagedTokenToKVPoolAllocator(DEVICE, PAGE)
        dev: Any = MHATokenToKVPool(DEVICE, PAGE, "float32", 1, 2, 2)
        host: Any = MHATokenToKVPoolHost(dev, 2.0, 0, PAGE)
        tree: Any = HiRadixCache(ReqToTokenPool(4, 8), alloc, PAGE, host, load_back_threshold=0)
        return tree, alloc, dev, RadixKey
    from kvpool.optimized import RadixKey as TwinKey
    from kvpool.optimized import ReqToTokenPool as TwinPool
    from kvpool.optimized.hicache.hiradix_cache import HiRadixCache as TwinTree
    from kvpool.optimized.hicache.memory_pool_host import MHATokenToKVPoolHost as TwinHost
    from kvpool.optimized.kv.mha import MHATokenToKVPool as TwinKV
    from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator as TwinAlloc

    alloc = TwinAlloc(DEVICE, PAGE, options=UNCHECKED)
    dev = TwinKV(DEVICE, PAGE, "float32", 1, 2, 2, options=UNCHECKED)
    host = TwinHost(dev, 2.0, 0, PAGE)
    tree = TwinTree(TwinPool(4, 8, options=UNCHECKED), alloc, PAGE, host, load_back_threshold=0)
    return tree, alloc, dev, TwinKey


def _sequences() -> list[list[int]]:
    return [[1000 * (i + 1) + j for j in range(LEN)] for i in range(SEQS)]


def _round(twin: str) -> tuple[dict[str, float], Any]:
    tree, alloc, dev, key_cls = _build(twin)
    seqs = _sequences()
    keys = [key_cls(s) for s in seqs]
    slots = []
    for s in seqs:  # the requests' KV, computed before the round (untimed)
        got = alloc.alloc(LEN)
        dev.write_tags(got, kv_tags(s))
        slots.append(got)
    times: dict[str, float] = {}

    def timed(name: str, call: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        out = call()
        times[name] = time.perf_counter() - t0
        return out

    timed("insert", lambda: [tree.insert(k, v) for k, v in zip(keys, slots, strict=True)])
    timed("writing_check", tree.writing_check)
    timed("evict", lambda: tree.evict(DEVICE))

    def load_all() -> None:
        for k in keys:
            tree.init_load_back(tree.match_prefix(k).last_host_node)
        tree.ready_to_load_host_cache()

    timed("load_back", load_all)
    timed("loading_check", tree.loading_check)
    host = tree.token_to_kv_pool_host
    host.clear()
    got = timed("host_alloc", lambda: host.alloc(4096))
    chunks = [got[i : i + PAGE] for i in range(0, 4096, PAGE)]
    timed("host_free", lambda: [host.free(c) for c in chunks])
    got = host.alloc(4096)
    timed("host_free_one", lambda: host.free(got))
    return times, tree.snapshot()


ROWS = (
    ("insert", f"`insert`, {SEQS} sequences of {LEN} tokens (64 writes issued)"),
    ("writing_check", f"`writing_check`, {SEQS} write acknowledgements"),
    ("evict", f"`evict` of {SEQS * LEN} device tokens to host ({SEQS} nodes)"),
    ("load_back", f"`match_prefix` + `init_load_back` of {SEQS} host hits, one load"),
    ("loading_check", "`loading_check`, the merged load acknowledgement"),
    ("host_alloc", "host pool `alloc` of 4,096 slots"),
    ("host_free", "host pool `free` of 4,096 slots, one page a call (256 calls)"),
    ("host_free_one", "host pool `free` of 4,096 slots in one call"),
)


def run(quick: bool = False) -> list[dict[str, Any]]:
    """One row per phase (see the module docstring)."""
    torch.set_num_threads(1)
    rounds = 2 if quick else 5
    ref_t: dict[str, list[float]] = {name: [] for name, _ in ROWS}
    twin_t: dict[str, list[float]] = {name: [] for name, _ in ROWS}
    for _ in range(rounds):
        a, ref_snap = _round("reference")
        b, twin_snap = _round("optimized")
        assert ref_snap == twin_snap, "the twins' trees differ after a round"
        for name, _ in ROWS:
            ref_t[name].append(a[name])
            twin_t[name].append(b[name])
    rows = []
    for name, label in ROWS:
        r, t = statistics.median(ref_t[name]) * 1e6, statistics.median(twin_t[name]) * 1e6
        rows.append({"op": label, "reference_us": round(r), "twin_us": round(t),
                     "ratio": round(r / t, 2)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in run(parser.parse_args().quick):
        print(row)


if __name__ == "__main__":
    main()
