"""Hybrid (Mamba) benchmark: the twin's HybridReqToTokenPool and Mamba steps against the
reference, measured in the same run.

A batch of B requests (B = 64, 256 and 1,024) on a pool of 1,024 rows and 3,080 Mamba slots, 4 Mamba
layers, two track buffers per request (speculative decoding):

- ``admit``: rows, running slots and track buffers for B fresh requests;
- ``prepare_forward``: the batch's deferred work, half of the requests copying a cached state
  (copy-on-write) and half clearing a fresh slot;
- ``forward_state``: each request's new state written into every layer;
- ``release_running``: every request of the batch finishing (slot, track buffers, row);
- the Mamba radix cache (``tree``): ``insert`` of B sequences of 32 tokens (16 prompts sharing
  8-token prefixes, so nodes split), ``match_prefix`` with copy-on-write of B of them, and
  ``evict`` of every state.

Medians of calls timed one by one, each from the same starting state built outside the timed
region; the reference's and the twin's calls alternate in blocks of five, so that the load of a
shared machine weighs on both alike, and the garbage collector is off inside a timed call (as
in ``timeit``). The twin runs on the CPU with one torch thread, checked mode off
(production); its state buffers are the twin's default tiny shapes (conv 3, state 4 floats per
layer and slot), so the figures measure bookkeeping, not memory bandwidth. ``--quick`` makes
fewer calls.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from kvpool.optimized.mamba import lifecycle as twin_steps
from kvpool.optimized.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as TwinPool
from kvpool.optimized.mamba.radix_cache import MambaRadixCache as TwinTree
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.token_allocator import TokenToKVPoolAllocator as TwinKV
from kvpool.optimized.radix_key import RadixKey as TwinKey
from kvpool.reference.mamba import lifecycle as ref_steps
from kvpool.reference.mamba.hybrid_req_to_token_pool import HybridReqToTokenPool as RefPool
from kvpool.reference.mamba.radix_cache import MambaRadixCache as RefTree
from kvpool.reference.pools.token_allocator import TokenToKVPoolAllocator as RefKV
from kvpool.reference.radix_key import RadixKey as RefKey
from kvpool.testing.machines.hybrid import MachineMambaReq as Req

ROWS, SLOTS, LAYERS, TRACK = 1024, 3080, 4, 2
BATCHES = (64, 256, 1024)
UNCHECKED = TwinOptions.make("cpu", checked=False)
"""The twin as an engine runs it: no device-to-host reads for checks."""

Setup = Callable[[], Callable[[], object]]


def _median_us(setup: Setup, calls: int) -> float:
    """Median wall time (us) of the callable ``setup()`` returns (setup untimed)."""
    return _medians_us([setup], calls)[0]


def _medians_us(setups: list[Setup], calls: int, block: int = 5) -> list[float]:
    """Median wall time (us) of each setup's callable over ``calls`` calls, taken in
    alternating blocks of ``block`` calls per setup (so that the load of a shared machine
    weighs on the reference and the twin alike, while each block runs warm code)."""
    times: list[list[float]] = [[] for _ in setups]
    for _ in range(-(-calls // block)):
        for setup, out in zip(setups, times, strict=True):
            for _ in range(block):
                call = setup()
                gc.disable()  # as timeit does: no collection inside a timed call
                try:
                    t0 = time.perf_counter()
                    call()
                    out.append(time.perf_counter() - t0)
                finally:
                    gc.enable()
    return [statistics.median(t) * 1e6 for t in times]


def _pool(twin: bool) -> Any:
    if twin:
        return TwinPool(ROWS, 16, SLOTS, LAYERS, TRACK, options=UNCHECKED)
    return RefPool(ROWS, 16, SLOTS, LAYERS, TRACK)


def _admitted(twin: bool, batch: int, cow: bool = False) -> tuple[Any, Any, list[Req]]:
    """A pool with ``batch`` admitted requests (half staged to copy checkpoint slot 1 when
    ``cow``), and the twin's steps module."""
    steps = twin_steps if twin else ref_steps
    pool = _pool(twin)
    checkpoint = pool.mamba_allocator.alloc(1)
    reqs = [Req() for _ in range(batch)]
    if cow:
        for req in reqs[::2]:
            steps.stage_cow(pool, req, int(checkpoint[0]))
    assert steps.admit(pool, reqs) is not None
    return pool, steps, reqs


def measure(batch: int, twin: bool, calls: int) -> dict[str, float]:
    """Median microseconds of each operation for one twin and batch size."""
    return {name: _median_us(setup, calls) for name, setup in setups(batch, twin).items()}


def setups(batch: int, twin: bool) -> dict[str, Setup]:
    """Each operation's setup for one twin and batch size."""
    steps = twin_steps if twin else ref_steps
    tags = list(range(1, batch + 1))

    def admit() -> Callable[[], object]:
        pool, reqs = _pool(twin), [Req() for _ in range(batch)]
        return lambda: steps.admit(pool, reqs)

    def prepare() -> Callable[[], object]:
        pool, s, reqs = _admitted(twin, batch, cow=True)
        return lambda: s.prepare_forward(pool, reqs)

    def forward() -> Callable[[], object]:
        pool, s, reqs = _admitted(twin, batch)
        s.prepare_forward(pool, reqs)
        return lambda: s.forward_state(pool, reqs, tags)

    def release() -> Callable[[], object]:
        pool, s, reqs = _admitted(twin, batch)
        return lambda: [s.release_running(pool, r) for r in reqs]

    return {"admit": admit, "prepare_forward": prepare, "forward_state": forward,
            "release_running": release}  # fmt: skip


def _sequences(batch: int) -> list[list[int]]:
    """``batch`` sequences of 32 tokens: 16 shared 8-token heads, then distinct tails."""
    return [[i % 16] * 8 + [1000 + i * 32 + j for j in range(24)] for i in range(batch)]


def measure_tree(batch: int, twin: bool, calls: int) -> dict[str, float]:
    """Median microseconds of the tree operations for one twin and batch size."""
    return {name: _median_us(setup, calls) for name, setup in tree_setups(batch, twin).items()}


def tree_setups(batch: int, twin: bool) -> dict[str, Setup]:
    """Each tree operation's setup for one twin and batch size."""
    seqs = _sequences(batch)
    key = TwinKey if twin else RefKey

    def filled() -> tuple[Any, Any, Any]:
        pool, size = _pool(twin), 32 * batch + 64  # tokens: the sequences, and a little more
        if twin:
            kv: Any = TwinKV(size, options=UNCHECKED)
            return pool, kv, TwinTree(pool, kv)
        kv = RefKV(size)
        return pool, kv, RefTree(pool, kv)

    def insert() -> Callable[[], object]:
        pool, kv, tree = filled()
        values = [kv.alloc(32) for _ in seqs]
        slots = pool.mamba_allocator.alloc(batch)
        pairs = list(zip(seqs, values, slots, strict=True))
        return lambda: [tree.insert(key(s), v, m) for s, v, m in pairs]

    def inserted() -> tuple[Any, Any]:
        pool, kv, tree = filled()
        for s in seqs:
            tree.insert(key(s), kv.alloc(32), pool.mamba_allocator.alloc(1)[0])
        return pool, tree

    def match() -> Callable[[], object]:
        _, tree = inserted()
        pairs = [([*s, 7], Req()) for s in seqs]
        return lambda: [tree.match_prefix(key(s), r, True) for s, r in pairs]

    def evict() -> Callable[[], object]:
        _, tree = inserted()
        return lambda: tree.evict(0, batch)

    return {"tree insert": insert, "tree match_prefix (cow)": match, "tree evict": evict}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """One row per (operation, batch size): reference and twin medians and their ratio."""
    torch.set_num_threads(1)
    calls = 5 if quick else 30
    rows: list[dict[str, Any]] = []
    for batch in BATCHES:
        pairs = [(setups(batch, False), setups(batch, True), calls)]
        if batch <= 256:  # the reference tree's LRU orders are lists: quadratic
            pairs.append((tree_setups(batch, False), tree_setups(batch, True), max(calls // 3, 3)))
        for ref, twin, n in pairs:
            for op in ref:
                r, t = _medians_us([ref[op], twin[op]], n)
                rows.append({"op": f"{op} ({batch} requests)", "reference_us": round(r),
                             "twin_us": round(t), "reference/twin": round(r / t, 2)})  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in run(parser.parse_args().quick):
        print(row)


if __name__ == "__main__":
    main()
