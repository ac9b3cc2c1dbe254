"""The twin's lifecycle as an engine would run it: per batch, not per request, and sync-free.

Every step of the unchecked :class:`~kvpool.optimized.lifecycle.memory_manager.MemoryManager`
(extend, decode, EAGLE v2 and v1 steps, finish, abort, retract, session turns) runs under two
counters:

- **device reads**: ``item`` / ``int`` / ``bool`` / ``tolist`` / ``numpy`` / ``cpu`` of a tensor
  and operations whose result size depends on tensor data (``nonzero``, ``masked_select``,
  ``unique``, boolean indexing, ``repeat_interleave`` without ``output_size``): each is a
  device-to-host sync on a GPU. There must be none. (The free list's CPU windows take freed
  pages through a numpy view, :data:`CPU_ONLY_VIEWS`, logged apart: on a GPU that copy is a
  launch.)
- **launches**: every tensor operation that is not a view (what becomes a kernel launch on a
  GPU). Their number must not grow with the batch: batch 2 and batch 16 issue the same.

What counts as the hot path: the manager's own pool work (rows, slots, the request table, the
KV tags) and the release path: ``cache_finished_req`` (finish, abort, retract),
``cache_unfinished_req`` (a chunked prefill) and the tree's ``insert`` are counted. A finish
reads its rows in one gather and hands each request a view (``row_read``), the inserts keep
views, and the frees are views buffered by the free group, so none of them launches per request.
Paused (they run per request, as in SGLang, whose scheduler matches and evicts request by
request): ``match_prefix`` (a prefill's match and the re-match inside ``cache_unfinished_req``)
and ``evict``. On a CPU they read node values through numpy views (the tree's CPU-only fast
path: a "read" to these counters, no launch); on a GPU a match over several nodes joins them
with one ``torch.cat``, an eviction frees each node. Also per request, outside this run: the
``"checkpoint"`` release path (SGLang 0.5.23's) and a chunk whose prefix the tree already held
(its row rewritten and ``prefix_indices`` joined: two launches, as SGLang). The CUDA variant
below runs every step, the tree included, under ``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kvpool.config import PoolConfig
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.pools.paged_allocator import PagedTokenToKVPoolAllocator
from kvpool.optimized.radix.radix_cache import RadixCache

HOST_READS = frozenset(
    {"item", "tolist", "numpy", "cpu", "__int__", "__bool__", "__float__", "__index__"}
)
"""Tensor methods that copy device data to the host."""

DATA_DEPENDENT = frozenset(
    {"aten.nonzero", "aten.masked_select", "aten._unique2", "aten.unique_consecutive",
     "aten.unique_dim", "aten.argwhere", "aten._local_scalar_dense"}
)  # fmt: skip
"""Operators whose result size (or value on the host) needs the device's data."""

CPU_ONLY_VIEWS = frozenset({("free_list.py", "append")})
"""(file, function) of the ``numpy`` calls that exist on a CPU only: the free list's windows
there are numpy buffers, and a free copies its pages in with numpy (a view of the pages, no
read); on a GPU the buffers have no numpy view and the copy is one tensor operation. Logged as
``cpu:numpy``, not as a read."""

PAGE_DEDUP = frozenset({"read:aten.masked_select", "read:aten.unique_consecutive", "read:numpy"})
"""How the paged allocator finds the distinct pages of a ``free``: a bitmap, a sort, or (a few
slots on a CPU) a sort of a numpy view of the slots; one read each."""

TREE_METHODS = ("match_prefix", "evict")


class _Paused:
    """How deep the run is inside tree methods (counting stops while > 0)."""

    def __init__(self) -> None:
        self.depth = 0


class _HostReads(TorchFunctionMode):
    def __init__(self, log: Counter[str], paused: _Paused) -> None:
        super().__init__()
        self.log, self.paused = log, paused

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        name = getattr(func, "__name__", "")
        if not self.paused.depth and name in HOST_READS:
            caller = sys._getframe(1).f_code  # the Python frame that called the tensor method
            where = (caller.co_filename.rsplit("/", 1)[-1], caller.co_name)
            kind = "cpu" if name == "numpy" and where in CPU_ONLY_VIEWS else "read"
            self.log[f"{kind}:{name}"] += 1
        return func(*args, **(kwargs or {}))


class _Launches(TorchDispatchMode):
    def __init__(self, log: Counter[str], paused: _Paused) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.log, self.paused = log, paused

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if not self.paused.depth:
            base = str(func.overloadpacket)
            if base in DATA_DEPENDENT or _bool_index(base, args) or _unsized(base, kwargs):
                self.log[f"read:{base}"] += 1
            elif not func.is_view:
                self.log[f"op:{base}"] += 1
        return func(*args, **kwargs)


def _bool_index(base: str, args: tuple[Any, ...]) -> bool:
    if base not in ("aten.index", "aten.index_put", "aten.index_put_"):
        return False
    idx = args[1] if len(args) > 1 else ()
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in idx or ())


def _unsized(base: str, kwargs: dict[str, Any]) -> bool:
    return base == "aten.repeat_interleave" and kwargs.get("output_size") is None


class StepLog:
    """Per step: device reads and launches (see the module docstring)."""

    def __init__(self, mm: MemoryManager) -> None:
        self.steps: dict[str, Counter[str]] = {}
        self.paused = _Paused()
        for name in TREE_METHODS:
            method = getattr(mm.tree_cache, name)
            setattr(mm.tree_cache, name, self._pausing(method))

    def _pausing(self, method: Callable[..., Any]) -> Callable[..., Any]:
        paused = self.paused

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            paused.depth += 1
            try:
                return method(*args, **kwargs)
            finally:
                paused.depth -= 1

        return call

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        log: Counter[str] = Counter()
        with _HostReads(log, self.paused), _Launches(log, self.paused):
            yield
        self.steps[name] = log


def reads(log: Counter[str]) -> dict[str, int]:
    return {k: v for k, v in log.items() if k.startswith("read:")}


def launches(log: Counter[str]) -> int:
    return sum(v for k, v in log.items() if k.startswith("op:"))


SHARED = list(range(11, 27))
"""A one-page prefix every batch request shares: the finish batch's inserts walk (and split)
the node the first of them inserts, and the chunked prefill below starts from it."""


def prompt(i: int) -> list[int]:
    return [*SHARED, *(1000 + 37 * i + t for t in range(20 + i % 5))]


def chunked_prompt(i: int) -> list[int]:
    return [*SHARED, *(7000 + 43 * i + t for t in range(40))]


def run_lifecycle(
    bs: int, page_size: int, device: str = "cpu", radix: bool = True, log: bool = True
) -> tuple[MemoryManager, dict[str, Counter[str]]]:
    """Drive ``bs`` requests (and ``bs`` session turns) through every step; returns the
    per-step logs (empty when ``log`` is False)."""
    config = PoolConfig(
        size=1 << 17,  # sized so that every free takes the same de-duplication path
        page_size=page_size,
        req_pool_size=4 * bs + 4,
        max_context_len=512,
        disable_radix_cache=not radix,
    )
    mm = MemoryManager(config, device=device, checked=False)
    steps = StepLog(mm)
    step = steps.step if log else (lambda name: contextlib.nullcontext())
    rids = [f"r{i}" for i in range(bs + 2)]  # the batch, and two to retract and abort
    for i, rid in enumerate(rids):
        mm.new_req(rid, prompt(i))
    with step("extend"):
        mm.extend(rids)
    with step("decode"):
        mm.decode(rids, [7] * (bs + 2))
    with step("spec_step"):
        mm.spec_step(rids, [[8, 9]] * (bs + 2), 2)
    with step("decode_in_allocation"):
        mm.decode(rids, [10] * (bs + 2))
    with step("spec_draft_v1"):
        mm.spec_draft_v1(rids, 3)
    with step("retract"):
        mm.retract(rids[0])
    with step("abort"):
        mm.abort(rids[1])
    with step("finish"):
        mm.finish(rids[2:])
    sessions = [f"s{i}" for i in range(bs)]
    turns = [f"t{i}" for i in range(bs)]
    for i, (sid, rid) in enumerate(zip(sessions, turns, strict=True)):
        mm.open_session(sid)
        mm.new_req(rid, [3000 + 41 * i + t for t in range(18)], session_id=sid)
    mm.extend(turns)
    mm.finish(turns)
    nexts = [f"n{i}" for i in range(bs)]
    for sid, rid in zip(sessions, nexts, strict=True):
        mm.new_req(rid, [5, 6, 7], session_id=sid)
    with step("session_restore_extend"):
        mm.extend(nexts)
    mm.finish(nexts)
    with step("close_session"):
        mm.close_session(sessions[0])
    chunked = [f"c{i}" for i in range(bs)]
    for i, rid in enumerate(chunked):
        mm.new_req(rid, chunked_prompt(i))
    with step("chunked_extend"):  # from the shared prefix; each request stays chunked
        mm.extend(chunked, [16] * bs)
    with step("chunked_last"):  # the rest of each prompt: no longer chunked
        mm.extend(chunked)
    with step("chunked_finish"):
        mm.finish(chunked)
    return mm, steps.steps


BATCHED_STEPS = ("extend", "decode", "spec_step", "decode_in_allocation", "spec_draft_v1",
                 "finish", "session_restore_extend", "chunked_extend", "chunked_last",
                 "chunked_finish")  # fmt: skip
ONE_REQUEST_STEPS = ("retract", "abort", "close_session")


@pytest.mark.slow
@pytest.mark.parametrize("radix", [True, False], ids=["radix", "chunk_cache"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_no_device_read_on_any_step(page_size: int, radix: bool) -> None:
    """Unchecked, no step reads a tensor back to the host, and none sizes a result by its
    data, except the paged allocator's page de-duplication, once per ``free`` call (SGLang's
    ``torch.unique``; page size 1 has none): once per finish batch, whatever its size (one free
    group), and for one request released outside a group (abort, retract, a closed session)
    once per free of its release (at most three: the tree's, the unaligned tail's, the
    over-allocation's)."""
    _, small = run_lifecycle(2, page_size, radix=radix)
    _, steps = run_lifecycle(16, page_size, radix=radix)
    assert set(steps) == {*BATCHED_STEPS, *ONE_REQUEST_STEPS}
    found = {name: reads(log) for name, log in steps.items() if reads(log)}
    allowed = set() if page_size == 1 else {"finish", "chunked_finish", *ONE_REQUEST_STEPS}
    assert set(found) <= allowed, found
    for name, got in found.items():
        assert set(got) <= PAGE_DEDUP, (name, got)
        frees = sum(got.values())
        assert frees == 1 if name in BATCHED_STEPS else 1 <= frees <= 3, (name, got)
        assert reads(small[name]) == got, name  # the same at batch 2


@pytest.mark.parametrize("radix", [True, False], ids=["radix", "chunk_cache"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_launches_do_not_grow_with_the_batch(page_size: int, radix: bool) -> None:
    """Batch 2 and batch 16 issue the same number of tensor operations on every step."""
    _, small = run_lifecycle(2, page_size, radix=radix)
    _, large = run_lifecycle(16, page_size, radix=radix)
    grown = {
        name: (launches(small[name]), launches(large[name]))
        for name in small
        if launches(large[name]) != launches(small[name])
    }
    assert grown == {}, grown
    assert all(launches(small[name]) > 0 for name in ("extend", "decode", "spec_step"))


def test_the_counters_see_a_per_request_loop() -> None:
    """Control: the counters catch what they must forbid (a read per request, a launch per
    request)."""
    slots = torch.arange(16)
    paused = _Paused()
    log: Counter[str] = Counter()
    with _HostReads(log, paused), _Launches(log, paused):
        total = sum(int(slots[i]) for i in range(4))  # one read each
        parts = [slots[i : i + 1] + 1 for i in range(4)]  # one launch each
        picked = slots[slots > 3]  # data-dependent size
    assert total == 6 and len(parts) == 4 and picked.numel() == 12
    assert reads(log)["read:__int__"] == 4
    assert reads(log)["read:aten._local_scalar_dense"] == 4
    assert reads(log)["read:aten.index"] == 1
    assert launches(log) == 4 + 1  # the four adds and the comparison


def test_only_the_free_lists_cpu_copy_is_not_a_read() -> None:
    """Control: a ``numpy`` view taken anywhere else is a read; the free list's CPU-only copy
    (:data:`CPU_ONLY_VIEWS`) is logged apart, and a page-size-1 finish on a CPU takes it."""
    log: Counter[str] = Counter()
    with _HostReads(log, _Paused()):
        torch.arange(8).numpy()
    assert reads(log) == {"read:numpy": 1}
    _, steps = run_lifecycle(2, 1)
    assert steps["finish"]["cpu:numpy"] >= 1 and not reads(steps["finish"])


def _tree_reads_its_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """The release path as it was: each request's tree call reads (and converts) its row."""
    finished, unfinished = RadixCache.cache_finished_req, RadixCache.cache_unfinished_req

    def finish_one(
        self: RadixCache, req: Any, is_insert: bool = True, row_read: Any = None
    ) -> None:
        finished(self, req, is_insert)

    def chunk_one(self: RadixCache, req: Any, chunked: bool = False, row_read: Any = None) -> None:
        unfinished(self, req, chunked)

    monkeypatch.setattr(RadixCache, "cache_finished_req", finish_one)
    monkeypatch.setattr(RadixCache, "cache_unfinished_req", chunk_one)


def _one_gather_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """A finish that reads no rows ahead: every release gathers its own row."""
    monkeypatch.setattr(MemoryManager, "_read_held_rows", lambda self, reqs: None)


@pytest.mark.parametrize("per_request", [_tree_reads_its_rows, _one_gather_per_release])
def test_the_counters_see_a_per_request_release(
    per_request: Callable[[pytest.MonkeyPatch], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Control: a release path that reads rows per request grows with the batch, and the
    counters inside ``cache_finished_req`` / ``cache_unfinished_req`` see it."""
    per_request(monkeypatch)
    _, small = run_lifecycle(2, 16)
    _, large = run_lifecycle(16, 16)
    assert launches(large["finish"]) > launches(small["finish"])
    assert launches(large["chunked_finish"]) > launches(small["chunked_finish"])
    if per_request is _tree_reads_its_rows:
        assert launches(large["chunked_extend"]) > launches(small["chunked_extend"])


@pytest.mark.slow
def test_batched_lifecycle_matches_the_reference() -> None:
    """The batched steps still give the reference's results (the lockstep tests check every
    step; this is the run above, end to end)."""
    from kvpool.reference.lifecycle.memory_manager import MemoryManager as RefManager

    twin, _ = run_lifecycle(4, 16, log=False)
    config = twin.config
    ref = RefManager(config)
    rids = [f"r{i}" for i in range(6)]
    for i, rid in enumerate(rids):
        ref.new_req(rid, prompt(i))
    ref.extend(rids)
    ref.decode(rids, [7] * 6)
    ref.spec_step(rids, [[8, 9]] * 6, 2)
    ref.decode(rids, [10] * 6)
    ref.spec_draft_v1(rids, 3)
    ref.retract(rids[0])
    ref.abort(rids[1])
    ref.finish(rids[2:])
    sessions, turns, nexts = ([f"{p}{i}" for i in range(4)] for p in "stn")
    for i, (sid, rid) in enumerate(zip(sessions, turns, strict=True)):
        ref.open_session(sid)
        ref.new_req(rid, [3000 + 41 * i + t for t in range(18)], session_id=sid)
    ref.extend(turns)
    ref.finish(turns)
    for sid, rid in zip(sessions, nexts, strict=True):
        ref.new_req(rid, [5, 6, 7], session_id=sid)
    ref.extend(nexts)
    ref.finish(nexts)
    ref.close_session(sessions[0])
    chunked = [f"c{i}" for i in range(4)]
    for i, rid in enumerate(chunked):
        ref.new_req(rid, chunked_prompt(i))
    ref.extend(chunked, [16] * 4)
    ref.extend(chunked)
    ref.finish(chunked)
    assert twin.snapshot() == ref.snapshot()


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("radix", [True, False], ids=["radix", "chunk_cache"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_cuda_steps_never_synchronize(
    page_size: int, radix: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA, every step (the tree included) runs under sync debug mode "error": any
    device-to-host synchronisation raises, except the paged allocator's page de-duplication
    (one per ``free`` call, see :func:`test_no_device_read_on_any_step`)."""
    dedup = PagedTokenToKVPoolAllocator._sorted_unique_pages

    def dedup_may_sync(self: PagedTokenToKVPoolAllocator, slots: torch.Tensor) -> torch.Tensor:
        mode = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)
        try:
            return dedup(self, slots)
        finally:
            torch.cuda.set_sync_debug_mode(mode)

    monkeypatch.setattr(PagedTokenToKVPoolAllocator, "_sorted_unique_pages", dedup_may_sync)
    run_lifecycle(2, page_size, "cuda", radix, log=False)  # compile and warm up first
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mm, _ = run_lifecycle(16, page_size, "cuda", radix, log=False)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert mm.req_to_token_pool.req_to_token.is_cuda
    assert mm.snapshot().allocator.in_free_group is False
