"""Seeded bugs (SEMANTICS section 10's kinds) injected into the optimized twin at run time.

Each :class:`Mutant` patches one freshly built :class:`kvpool.optimized.memory_manager.
MemoryManager` in place (instance attributes only: no file is edited and other instances are
untouched) and names the detectors expected to catch it: invariant ids or ``lockstep-diff``.
The mutated twin runs with checked mode OFF, as in production, so that the harness's invariants,
not the twin's own misuse checks, have to find the damage. ``focus`` narrows the configurations
(page sizes, radix on) to where the bug can show.

:func:`hunt` runs the lockstep machine (reference vs mutant) under a hypothesis profile and
reports whether, how fast and by what the bug was caught, with the shrunk trace length.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from kvpool.config import PoolConfig
from kvpool.constants import RESERVED_INDEX, ceil_align, floor_align
from kvpool.testing.campaign import optimized_factory, reference_factory, shrink
from kvpool.testing.lockstep import Factory, LockstepFailure, make_lockstep_machine
from kvpool.testing.swarm import Chooser, draw_config

Patch = Callable[[Any], None]


@dataclass(frozen=True)
class Mutant:
    """A seeded bug: ``patch(manager)`` injects it; ``expected`` detectors should catch it."""

    name: str
    kind: str
    expected: tuple[str, ...]
    patch: Patch
    page_sizes: tuple[int, ...] = (1, 2, 4, 16)
    overrides: dict[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] | None = None

    def config_drawer(self) -> Callable[[Chooser], PoolConfig]:
        def draw(c: Chooser) -> PoolConfig:
            return draw_config(c, page_size=c.choice(self.page_sizes), **self.overrides)

        return draw

    def factory(self, base: Factory | None = None) -> Factory:
        """A factory of mutated twins (``base`` defaults to the unchecked torch twin)."""
        build = base or optimized_factory("torch", checked=False)

        def mutated(config: PoolConfig) -> Any:
            manager = build(config)
            self.patch(manager)
            return manager

        return mutated


def _need(obj: Any, *names: str) -> None:
    """Fail loudly when the twin no longer has an attribute a mutant patches (it was renamed):
    better a clear error than a mutant that silently injects nothing."""
    missing = [n for n in names if not hasattr(obj, n)]
    if missing:
        raise AttributeError(
            f"{type(obj).__name__} has no {missing}: update kvpool.testing.mutants"
        )


def _wrap(obj: Any, name: str, make: Callable[[Any], Callable[..., Any]]) -> None:
    """Replace ``obj.name`` (bound) by ``make(original)`` on this instance only."""
    _need(obj, name)
    setattr(obj, name, make(getattr(obj, name)))


def _during(obj: Any, name: str, replacement: Callable[..., Any], call: Callable[[], Any]) -> Any:
    """Run ``call()`` with ``obj.name`` temporarily replaced."""
    saved = obj.__dict__.get(name)
    setattr(obj, name, replacement)
    try:
        return call()
    finally:
        if saved is None:
            delattr(obj, name)
        else:
            setattr(obj, name, saved)


# ----------------------------------------------------------------------- allocator bugs
def _paged_free_no_dedup(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    shift = alloc.page_size.bit_length() - 1

    _need(alloc, "_return_pages", "free_pages")

    def return_pages(slots: torch.Tensor) -> None:
        pages = torch.sort(slots >> shift).values  # sorted, but not unique
        if alloc.need_sort:
            alloc.release_pages = torch.cat((alloc.release_pages, pages))
        else:
            alloc.free_pages = torch.cat((pages, alloc.free_pages))

    alloc._return_pages = return_pages


def _group_frees_separately(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    _need(alloc, "_pending_free", "_in_free_group", "_return_pages")

    def make(_orig: Any) -> Callable[[], None]:
        def free_group_end() -> None:
            pending, alloc._pending_free, alloc._in_free_group = alloc._pending_free, [], False
            for slots in pending:  # one free per buffered call instead of one for the group
                alloc._return_pages(slots)

        return free_group_end

    _wrap(alloc, "free_group_end", make)


def _slot0_allocatable(mm: Any) -> None:
    def make(orig: Any) -> Callable[[int], torch.Tensor | None]:
        def take_pages(n: int) -> torch.Tensor | None:
            pages = orig(n)
            if pages is not None and pages.numel() and int(pages[0]) == 1:
                pages = pages.clone()
                pages[0] = RESERVED_INDEX  # page 1 leaks, page 0 is handed out
            return pages  # type: ignore[no-any-return]

        return take_pages

    _wrap(mm.token_to_kv_pool_allocator, "_take_pages", make)


def _failed_alloc_consumes(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def check_capacity(*args: Any, **kwargs: Any) -> None:
            try:
                orig(*args, **kwargs)
            except Exception:
                alloc = mm.token_to_kv_pool_allocator
                alloc.free_pages = alloc.free_pages[1:]  # the failed attempt kept a page
                raise

        return check_capacity

    _wrap(mm, "_check_capacity", make)


def _extend_partial_write(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., torch.Tensor | None]:
        def alloc_extend(*args: Any) -> torch.Tensor | None:
            out = orig(*args)
            if out is not None and out.numel() > 1:
                out[out.numel() // 2 + 1 :] = RESERVED_INDEX  # the kernel stopped half way
            return out  # type: ignore[no-any-return]

        return alloc_extend

    _wrap(mm.token_to_kv_pool_allocator, "alloc_extend", make)


def _decode_no_new_page(mm: Any) -> None:
    def alloc_decode(seq_lens: Any, seq_lens_cpu: Any, last_loc: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(last_loc, dtype=torch.int64) + 1  # never opens a page

    mm.token_to_kv_pool_allocator.alloc_decode = alloc_decode


def _order_swapped(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    shift = alloc.page_size.bit_length() - 1

    _need(alloc, "_return_pages", "free_pages")

    def return_pages(slots: torch.Tensor) -> None:
        pages = torch.unique(slots >> shift)
        if alloc.page_size == 1:
            alloc.free_pages = torch.cat((slots, alloc.free_pages))  # LIFO instead of FIFO
        else:
            alloc.free_pages = torch.cat((alloc.free_pages, pages))  # FIFO instead of LIFO

    alloc._return_pages = return_pages


# ----------------------------------------------------------------------- lifecycle bugs
def _finish_frees_twice(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def release(req: Any, is_insert: bool = True) -> None:
            row, start, stop = req.req_pool_idx, req.cache_protected_len, req.kv_committed_len
            slots = mm.req_to_token_pool.read(row, start, stop).clone()
            orig(req, is_insert)
            if not is_insert and slots.numel():
                mm.token_to_kv_pool_allocator.free(slots)  # the non-insert path frees again

        return release

    _wrap(mm, "release_kv_cache", make)


def _leak_partial_tail(mm: Any) -> None:
    tree, alloc = mm.tree_cache, mm.token_to_kv_pool_allocator
    ps = mm.page_size

    def make(orig: Any) -> Callable[..., None]:
        def cache_finished(req: Any, is_insert: bool = True) -> None:
            committed = req.kv_committed_len
            aligned = floor_align(committed, ps)
            if not is_insert or aligned == committed:
                return orig(req, is_insert)  # type: ignore[no-any-return]
            tail = set(mm.req_to_token_pool.read(req.req_pool_idx, aligned, committed).tolist())
            free = alloc.free

            def free_but_tail(slots: Any) -> None:
                kept = [s for s in torch.as_tensor(slots).tolist() if s not in tail]
                free(torch.tensor(kept, dtype=torch.int64))

            return _during(alloc, "free", free_but_tail, lambda: orig(req, is_insert))  # type: ignore[no-any-return]

        return cache_finished

    _wrap(tree, "cache_finished_req", make)


def _leak_spec_overalloc(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def release(req: Any, is_insert: bool = True) -> None:
            # forgets the speculative columns: they are never freed
            req.kv_allocated_len = min(
                req.kv_allocated_len, ceil_align(req.kv_committed_len, mm.page_size)
            )
            orig(req, is_insert)

        return release

    _wrap(mm, "release_kv_cache", make)


def _chunked_row_reused(mm: Any) -> None:
    pool = mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., list[int] | None]:
        def alloc(reqs: Any) -> list[int] | None:
            fresh = [i for i, r in enumerate(reqs) if r.req_pool_idx is None]
            rows = orig(reqs)
            busy = [
                r.req_pool_idx
                for r in mm.reqs.values()
                if r.is_chunked and r.req_pool_idx is not None and r not in reqs
            ]
            if rows is not None and fresh and busy:
                i = fresh[0]
                pool.free_slots.append(rows[i])  # the fresh row goes back...
                rows[i] = reqs[i].req_pool_idx = busy[0]  # ...and the chunked one is shared
            return rows  # type: ignore[no-any-return]

        return alloc

    _wrap(pool, "alloc", make)


def _generation_not_bumped(mm: Any) -> None:
    pool = mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., list[int] | None]:
        def alloc(reqs: Any) -> list[int] | None:
            saved = list(pool.req_generation)
            rows = orig(reqs)
            pool.req_generation[:] = saved
            return rows  # type: ignore[no-any-return]

        return alloc

    _wrap(pool, "alloc", make)


def _row_not_rewritten(mm: Any) -> None:
    tree, pool = mm.tree_cache, mm.req_to_token_pool

    def make(orig: Any) -> Callable[..., None]:
        def cache_unfinished(req: Any, chunked: bool = False) -> None:
            _during(pool, "write", lambda index, values: None, lambda: orig(req, chunked))

        return cache_unfinished

    _wrap(tree, "cache_unfinished_req", make)


def _session_extra_lock(mm: Any) -> None:
    def make(orig: Any) -> Callable[[str], None]:
        def open_session(session_id: str) -> None:
            orig(session_id)
            slot = mm.sessions[session_id]

            def make_restore(restore: Any) -> Callable[..., None]:
                def restore_into(req: Any, *args: Any) -> None:
                    restore(req, *args)
                    if req.last_node is not None and req.last_node is not mm.tree_cache.root_node:
                        mm.tree_cache.inc_lock_ref(req.last_node)  # nobody releases this one

                return restore_into

            _wrap(slot, "restore_into", make_restore)

        return open_session

    _wrap(mm, "open_session", make)


# ----------------------------------------------------------------------- tree bugs
def _lock_wrong_node(mm: Any) -> None:
    tree = mm.tree_cache

    def make(orig: Any) -> Callable[[Any], int]:
        def inc_lock_ref(node: Any) -> int:
            parent = getattr(node, "parent", None)
            target = parent if parent is not None and parent is not tree.root_node else node
            return orig(target)  # type: ignore[no-any-return]

        return inc_lock_ref

    _wrap(tree, "inc_lock_ref", make)


def _lock_lost_on_split(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., Any]:
        def split(child: Any, at: int) -> Any:
            upper = orig(child, at)
            upper.lock_ref = 0  # the new upper node forgets the locks it inherited
            return upper

        return split

    _wrap(mm.tree_cache, "_split", make)


def _sizes_drift(mm: Any) -> None:
    tree = mm.tree_cache
    _need(tree, "evictable_size_")

    def make(orig: Any) -> Callable[[Any], int]:
        def dec_lock_ref(node: Any) -> int:
            delta: int = orig(node)
            if delta > 0:
                tree.evictable_size_ -= 1  # out by one token less than it came in
            return delta

        return dec_lock_ref

    _wrap(tree, "dec_lock_ref", make)


def _evict_locked(mm: Any) -> None:
    tree = mm.tree_cache
    _need(tree, "root_node", "_push")

    def make(orig: Any) -> Callable[[int], int]:
        def evict(num_tokens: int) -> int:
            # The candidate filter forgets lock_ref: locked leaves look evictable.
            stack, locked = [tree.root_node], []
            while stack:
                node = stack.pop()
                stack.extend(node.children.values())
                if node is not tree.root_node and not node.children and node.lock_ref > 0:
                    locked.append((node, node.lock_ref))
            for node, _ in locked:
                node.lock_ref = 0
                tree._push(node)
            try:
                return orig(num_tokens)  # type: ignore[no-any-return]
            finally:
                for node, count in locked:
                    node.lock_ref = count

        return evict

    _wrap(tree, "evict", make)


_RADIX = {"disable_radix_cache": False}
_ROOMY = {"disable_radix_cache": False, "size": 48, "req_pool_size": 6}
_PREFILL = ("new_req", "twin_req", "extend", "extend", "finish")
_SPLITS = ("new_req", "match_prefix", "extend", "extend", "decode", "finish")
_SPEC = ("new_req", "extend", "spec_step", "spec_step", "finish", "abort", "retract")
_FINISH = ("new_req", "extend", "decode", "spec_step", "finish", "finish")
_SESSIONS = ("session_turn", "session_turn", "extend", "extend", "finish")

MUTANTS: tuple[Mutant, ...] = (
    Mutant("paged-free-no-dedup", "double free through pages named twice in one free",
           ("INV-NO-DOUBLE-FREE",), _paged_free_no_dedup, (2, 4)),
    Mutant("group-frees-separately", "free group not performed as one free",
           ("lockstep-diff",), _group_frees_separately, (2, 4), {}, _FINISH),
    Mutant("finish-frees-twice", "a finish path that frees twice",
           ("INV-NO-DOUBLE-FREE",), _finish_frees_twice, (1,)),
    Mutant("leak-partial-tail", "leak of a partial page",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), _leak_partial_tail, (2, 4), _RADIX,
           _FINISH),
    Mutant("leak-spec-overalloc", "leak of speculative slots",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), _leak_spec_overalloc, (1, 2), {},
           _SPEC),
    Mutant("chunked-row-reused", "a row handed to another request while a chunked one uses it",
           ("INV-ROW-OWNERS", "INV-ROW-ACCOUNTING", "INV-PAGE-CONTIGUITY"), _chunked_row_reused,
           (1, 2, 4)),
    Mutant("lock-wrong-node", "lock counts walked from the wrong node",
           ("INV-LOCKS",), _lock_wrong_node, (1, 2), _ROOMY, _SPLITS),
    Mutant("lock-lost-on-split", "lock count lost on a node split",
           ("INV-LOCKS",), _lock_lost_on_split, (1, 2), _ROOMY, _SPLITS),
    Mutant("sizes-drift", "evictable/protected sizes updated by different amounts",
           ("INV-LOCKS", "INV-POOL-ACCOUNTING"), _sizes_drift, (1, 2), _RADIX),
    Mutant("row-not-rewritten", "duplicates freed but the row not rewritten (use after free)",
           ("INV-ROW-SLOTS", "INV-ONE-OWNER", "INV-KV-INTEGRITY"), _row_not_rewritten,
           (1,), _ROOMY, _PREFILL),
    Mutant("slot0-allocatable", "index 0 made allocatable",
           ("INV-RESERVED-ZERO",), _slot0_allocatable, (1, 2, 4)),
    Mutant("failed-alloc-consumes", "a failed allocation that consumed pages",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), _failed_alloc_consumes, (1, 2, 4)),
    Mutant("extend-partial-write", "extend kernel writes part of its output, takes all pages",
           ("INV-RESERVED-ZERO", "INV-ROW-SLOTS", "lockstep-diff"), _extend_partial_write, (2, 4)),
    Mutant("session-extra-lock", "session restore takes a lock nobody releases",
           ("INV-LOCKS", "INV-IDLE"), _session_extra_lock, (1, 2), _ROOMY, _SESSIONS),
    Mutant("free-order-swapped", "LIFO/FIFO free order swapped",
           ("lockstep-diff",), _order_swapped, (1, 2, 4)),
    Mutant("evict-locked-node", "eviction evicts a locked node",
           ("INV-LOCKS", "INV-TREE-SHAPE", "INV-ROW-SLOTS", "INV-ONE-OWNER"), _evict_locked,
           (1, 2), _RADIX),
    Mutant("generation-not-bumped", "row generation not bumped on hand-out",
           ("INV-GENERATION-MONOTONIC", "lockstep-diff"), _generation_not_bumped, (1,)),
    Mutant("decode-no-new-page", "decode does not open a new page at a page boundary",
           ("INV-ROW-SLOTS", "INV-ONE-OWNER", "INV-POOL-ACCOUNTING"), _decode_no_new_page,
           (2, 4)),
)  # fmt: skip
"""Every seeded bug of the quality suite."""


@dataclass
class HuntResult:
    """How one mutant fared: caught or not, by which detector, after how many examples and
    steps, the shrunk trace length (steps) and the time taken (seconds)."""

    name: str
    kind: str
    expected: tuple[str, ...]
    caught: bool
    detector: str | None
    examples: int
    steps: int
    shrunk_steps: int | None
    seconds: float
    report: str = ""

    @property
    def as_expected(self) -> bool:
        return self.caught and self.detector in self.expected


def hunt(
    mutant: Mutant, test_settings: settings, base: Factory | None = None, shrink_s: float = 5.0
) -> HuntResult:
    """Run reference vs ``mutant`` under ``test_settings``; shrink the failure found."""
    factory_b = mutant.factory(base)
    machine = make_lockstep_machine(
        reference_factory,
        factory_b,
        mutant.config_drawer(),
        ("reference", mutant.name),
        kinds=mutant.kinds,
    )
    start = time.monotonic()
    failure: LockstepFailure | None = None
    try:
        run_state_machine_as_test(machine, settings=test_settings)
    except LockstepFailure as found:
        failure = found
    shrunk: int | None = None
    pair = machine.last_pair
    if failure is not None and pair is not None:
        ops, final = shrink(
            reference_factory, factory_b, pair.config, pair.ops, failure.detector,
            ("reference", mutant.name), shrink_s,
        )  # fmt: skip
        shrunk = len(ops)
        failure = final or failure
    return HuntResult(
        mutant.name, mutant.kind, mutant.expected, failure is not None,
        failure.detector if failure else None, machine.examples, machine.steps, shrunk,
        time.monotonic() - start, str(failure) if failure else "",
    )  # fmt: skip


def format_table(results: list[HuntResult]) -> str:
    """The quality-suite table (one row per mutant) and the kill rate."""
    head = f"{'mutant':<24} {'caught by':<22} {'expected':<4} {'examples':>8} {'steps':>6} "
    head += f"{'shrunk':>6} {'s':>5}"
    lines = [head, "-" * len(head)]
    for r in results:
        shrunk = "-" if r.shrunk_steps is None else str(r.shrunk_steps)
        caught_by = r.detector or "NOT CAUGHT"
        lines.append(
            f"{r.name:<24} {caught_by:<22} {'yes' if r.as_expected else 'no':<4} "
            f"{r.examples:>8} {r.steps:>6} {shrunk:>6} {r.seconds:>5.1f}"
        )
    killed = sum(r.caught for r in results)
    rate = 100.0 * killed / max(len(results), 1)
    lines.append(f"kill rate: {killed}/{len(results)} ({rate:.0f}%)")
    return "\n".join(lines)
