"""Invariants of a sliding-window (SWA) hybrid allocator (scope ``"swa"``).

A check gets an :class:`~kvpool.snapshot.SWAAllocatorSnapshot` and an :class:`SWAContext` (what
the caller knows besides it). Units: ``full_to_swa`` is indexed by full slot and holds SWA slots
(0: none, the sentinel; the last entry is the -1 tail); free lists hold page ids; a slot is
*released* when its page is free-listed or pending in an open free group. The pools' own
allocator invariants run on ``snap.full`` and ``snap.swa`` after these
(:func:`check_swa_allocator`).

A pure-SWA snapshot (``pure``: one pool, the identity mapping) only gets the allocator checks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter

import kvpool.invariants.derived as derived
from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX, ceil_align
from kvpool.errors import InvariantViolation
from kvpool.invariants.allocator import all_pages, check_allocator
from kvpool.invariants.derived import IdentityMemo, identity_memo, page_of
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant, run_scope
from kvpool.records import fast_record
from kvpool.snapshot import AllocatorSnapshot, PoolSnapshot, SWAAllocatorSnapshot, TreeSnapshot

_FIRST = itemgetter(0)


@dataclass(frozen=True)
class SWAContext:
    """What an SWA check may know besides the snapshot: the SWA tokens held outside the free
    lists by requests and the tree (None: unknown, the mapped pages stand in for them) and the
    tree, for the tombstone check (None: no tree)."""

    swa_held_tokens: int | None = None
    tree: TreeSnapshot | None = None


def _released_pages(snap: AllocatorSnapshot) -> frozenset[int]:
    return derived.free_pages(snap)  # (free, release and pending pages, built once)


def _live_entries(snap: SWAAllocatorSnapshot) -> list[tuple[int, int]]:
    """(full slot, SWA slot) of every non-sentinel entry (the tail excluded); built once per
    snapshot and shared (read-only)."""
    return _live(snap)


def _build_live(snap: SWAAllocatorSnapshot) -> list[tuple[int, int]]:
    mapping = snap.full_to_swa
    if type(mapping) is not tuple:
        return _scan_live(mapping)
    # (a mapping is often the previous step's: one hash and compare in C, not a scan)
    found = _LIVE_BY_MAPPING.get(mapping)
    if found is None:
        found = _scan_live(mapping)
        if len(_LIVE_BY_MAPPING) >= 16:
            _LIVE_BY_MAPPING.clear()
        _LIVE_BY_MAPPING[mapping] = found
    return found


def _scan_live(mapping: Sequence[int]) -> list[tuple[int, int]]:
    body = mapping[:-1]
    # (the sentinel RESERVED_INDEX is 0, the one falsy slot: compress keeps the full slots of
    # the others, in C, without a pair per entry)
    full = list(compress(range(len(body)), body))
    return list(zip(full, map(body.__getitem__, full), strict=True))


_LIVE_BY_MAPPING: dict[tuple[int, ...], list[tuple[int, int]]] = {}
""":func:`_scan_live` by mapping value (a pure function of it; shared, read-only)."""


_live: IdentityMemo[SWAAllocatorSnapshot, list[tuple[int, int]]] = identity_memo(_build_live)


def _build_live_values(snap: SWAAllocatorSnapshot) -> list[int]:
    return [s for _, s in _live(snap)]


_live_values: IdentityMemo[SWAAllocatorSnapshot, list[int]] = identity_memo(_build_live_values)
"""The SWA slot of every live entry, in :func:`_live_entries` order (read-only)."""


@invariant(
    "INV-SWA-MAPPING-SHAPE",
    "full_to_swa has size_full + page_size + 1 entries, the last -1, every other 0 or an SWA "
    "slot of an allocatable SWA page; full slot 0 maps to 0",
    scope="swa",
)
def check_mapping_shape(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    if snap.pure:
        return
    full, swa = snap.full, snap.swa
    want = full.size + full.page_size + 1
    if len(snap.full_to_swa) != want or snap.full_to_swa[-1] != NO_LAST_LOC:
        raise InvariantViolation(
            "INV-SWA-MAPPING-SHAPE",
            f"mapping has {len(snap.full_to_swa)} entries (want {want}) ending in "
            f"{snap.full_to_swa[-1] if snap.full_to_swa else None} (want -1)",
        )
    limit = (swa.num_pages + 1) * swa.page_size
    values = _live_values(snap)
    if values and (min(values) < swa.page_size or max(values) >= limit):
        fail(
            "INV-SWA-MAPPING-SHAPE",
            f"entries outside {{0}} and [{swa.page_size}, {limit})",
            [f for f, s in _live_entries(snap) if not swa.page_size <= s < limit],
        )
    if snap.full_to_swa[0]:
        fail("INV-SWA-MAPPING-SHAPE", "full slot 0 is mapped", [0])


@invariant(
    "INV-SWA-FREE-UNMAPPED",
    "the mapping of every released full slot (free or pending free) is 0: a recycled full slot "
    "never carries a stale SWA slot",
    scope="swa",
)
def check_free_unmapped(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    if snap.pure:
        return
    ps = snap.full.page_size
    released = _released_pages(snap.full)
    if snap.resolves_at_group_end:  # pending slots keep their entries until the group ends
        released = derived.free_listed(snap.full)
    entries = _live_entries(snap)
    if released.isdisjoint(page_of(map(_FIRST, entries), ps)):
        return  # (the verdict in C; the scan names the slots)
    fail(
        "INV-SWA-FREE-UNMAPPED",
        "released full slots still mapped",
        [f for f, _ in entries if f // ps in released],
    )


@invariant(
    "INV-SWA-ONE-MAPPING",
    "every held SWA slot is named by at most one live entry, every held SWA page by at least "
    "one (at page size 1: each held slot by exactly one), and no entry names a released SWA page",
    scope="swa",
)
def check_one_mapping(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    if snap.pure:
        return
    swa = snap.swa
    values = _live_values(snap)
    distinct = set(values)
    if len(distinct) < len(values):  # a repeat: name the slots
        counts = Counter(values)
        fail(
            "INV-SWA-ONE-MAPPING", "SWA slots named twice", [s for s, n in counts.items() if n > 1]
        )
    released = _released_pages(swa)
    mapped = set(page_of(distinct, swa.page_size))
    if not released.isdisjoint(mapped):
        fail(
            "INV-SWA-ONE-MAPPING",
            "entries naming released SWA pages (use after free)",
            [s for s in values if s // swa.page_size in released],
        )
    fail(
        "INV-SWA-ONE-MAPPING",
        "held SWA pages nobody maps (leaked)",
        all_pages(swa.num_pages).difference(released, mapped),
    )


@invariant(
    "INV-SWA-NO-DOUBLE-FREE",
    "no SWA page twice in the SWA free lists, none pending that is already free, and (page size "
    "1) no SWA slot pending twice",
    scope="swa",
)
def check_no_double_free(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    swa = snap.swa
    listed = derived.free_listed(swa)
    if len(listed) < len(swa.free_pages) + len(swa.release_pages):  # a repeat: name them
        counts = Counter(list(swa.free_pages) + list(swa.release_pages))
        fail("INV-SWA-NO-DOUBLE-FREE", "SWA pages free twice",
             [p for p, n in counts.items() if n > 1])  # fmt: skip
    if not swa.pending_free:
        return  # nothing pending: the checks below name nothing
    pending = derived.pending_pages(swa)
    fail("INV-SWA-NO-DOUBLE-FREE", "pending SWA pages already free", listed.intersection(pending))
    if swa.page_size == 1:
        twice = Counter(swa.pending_free)
        fail("INV-SWA-NO-DOUBLE-FREE", "SWA slots pending twice", [s for s, n in twice.items()
                                                                     if n > 1])  # fmt: skip


@invariant(
    "INV-SWA-SENTINEL",
    "the sentinel 0 is never freed: SWA page 0 is neither free-listed nor pending",
    scope="swa",
)
def check_sentinel(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    freed = RESERVED_INDEX in derived.free_pages(snap.swa)  # (free, release or pending)
    fail("INV-SWA-SENTINEL", "SWA page 0 freed", [RESERVED_INDEX] if freed else [])


@invariant(
    "INV-SWA-ACCOUNTING",
    "SWA free + pending + held tokens == SWA size (held: requests + tree evictable + tree "
    "protected when the caller knows them, else the pages the mapping names)",
    scope="swa",
)
def check_accounting(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    swa = snap.swa
    released = len(_released_pages(swa)) * swa.page_size
    if ctx.swa_held_tokens is not None:
        held = ctx.swa_held_tokens
    elif snap.pure:
        return
    else:
        held = len(set(page_of(_live_values(snap), swa.page_size))) * swa.page_size
    if released + held != swa.size:
        raise InvariantViolation(
            "INV-SWA-ACCOUNTING",
            f"SWA released {released} + held {held} tokens != size {swa.size}",
        )


@invariant(
    "INV-SWA-TOMBSTONE",
    "a tombstoned tree node holds no SWA slot: every full slot of its value maps to 0",
    scope="swa",
)
def check_tombstone(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    if ctx.tree is None or snap.pure:
        return
    mapping = snap.full_to_swa
    fail(
        "INV-SWA-TOMBSTONE",
        "tombstoned nodes whose slots still map to SWA slots",
        [
            n.node_id
            for n in ctx.tree.nodes
            # (the sentinel RESERVED_INDEX is 0: a mapped slot is a truthy entry)
            if n.swa_tombstone and any(map(mapping.__getitem__, n.value))
        ],
    )


@invariant(
    "INV-SWA-TREE-LOCKS",
    "per node full_lock_ref >= swa_lock_ref >= 0 and a tombstone holds no SWA lock; the full and "
    "SWA evictable/protected sizes equal their sums",
    scope="swa",
)
def check_tree_locks(snap: SWAAllocatorSnapshot, ctx: SWAContext) -> None:
    tree = ctx.tree
    if tree is None:
        return
    # one pass over the non-root nodes gathers what the checks below report, in their order
    disordered: list[int] = []
    tombstones_locked: list[int] = []
    full_evictable = full_protected = swa_evictable = swa_protected = 0  # tokens
    for n in tree.nodes:
        if n.parent_id is None:
            continue
        lock, swa_lock = n.lock_ref, n.swa_lock_ref
        if not lock >= swa_lock >= 0:
            disordered.append(n.node_id)
        # (a tombstone leaf may be unlocked: its request released its window, then its full
        # lock; full eviction deletes it)
        tombstone = n.swa_tombstone
        if tombstone and swa_lock:
            tombstones_locked.append(n.node_id)
        size = len(n.value)
        if lock:
            full_protected += size
        else:
            full_evictable += size
        if not tombstone:
            if swa_lock:
                swa_protected += size
            else:
                swa_evictable += size
    fail("INV-SWA-TREE-LOCKS", "lock counts out of order (full >= swa >= 0)", disordered)
    fail("INV-SWA-TREE-LOCKS", "tombstones with an SWA lock", tombstones_locked)
    sums = (full_evictable, full_protected, swa_evictable, swa_protected)
    kept = (tree.evictable_size, tree.protected_size, tree.swa_evictable_size,
            tree.swa_protected_size)  # fmt: skip
    if sums != kept:
        raise InvariantViolation(
            "INV-SWA-TREE-LOCKS",
            f"(full evictable, full protected, SWA evictable, SWA protected) kept {kept}, "
            f"summed over the tree {sums}",
        )


def _window_breaks(mapping: Sequence[int], row: Sequence[int], own: int, cut: int) -> bool:
    """Whether a row past its tree-owned prefix (``own`` columns) disagrees with its window:
    a column in ``[own, cut)`` mapped to an SWA slot, or one from ``cut`` on mapped to none.
    Columns are looked up in order and the first disagreement ends the scan, as a scan per
    column would (in C; the sentinel RESERVED_INDEX is 0, the one falsy entry)."""
    get = mapping.__getitem__
    return any(map(get, row[own:cut])) or not all(map(get, row[cut:]))


@invariant(
    "INV-SWA-WINDOW",
    "hybrid SWA managers: past the tree-owned prefix (cache_protected_len), a request's tokens "
    "before its swa_evicted_seqlen map to no SWA slot and the rest of its row to one; the SWA pool "
    "holds exactly the requests' remaining window pages and the tree's SWA tokens (then every "
    "INV-SWA-* check on the pools, with the tree)",
    scope="pool",
)
def check_window(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    swa = snap.swa
    if swa is None:
        return
    mapping = swa.full_to_swa
    bad: list[int] = []
    held = 0
    sps = swa.swa.page_size
    for r in snap.reqs:
        if r.req_pool_idx is None:
            continue
        # the tree owns the row's first cache_protected_len tokens (its nodes say what they hold)
        own = r.cache_protected_len
        cut = max(r.swa_evicted_seqlen, own)
        if _window_breaks(mapping, r.row, own, cut):
            bad.append(r.req_pool_idx)
        held += ceil_align(r.kv_allocated_len, sps) - cut
    for s in snap.sessions:
        if s.req_pool_idx is None:
            continue
        own = s.cache_protected_len
        cut = max(s.swa_evicted_seqlen, own)
        if _window_breaks(mapping, s.row, own, cut):
            bad.append(s.req_pool_idx)
        held += ceil_align(s.kv_allocated_len, sps) - cut
    if bad:
        fail("INV-SWA-WINDOW", "rows whose SWA mapping disagrees with their window", bad)
    tree = None if snap.tree.disabled else snap.tree
    if tree is not None:
        held += tree.swa_evictable_size + tree.swa_protected_size
    run_scope("swa", swa, _swa_context(swa_held_tokens=held, tree=tree))


# (built every step: fast_record fills the record without its generated __init__)
_swa_context = fast_record(SWAContext)


def check_swa_allocator(
    snap: SWAAllocatorSnapshot,
    held_full_pages: Iterable[int] | None = None,
    swa_held_tokens: int | None = None,
    tree: TreeSnapshot | None = None,
) -> int:
    """The allocator invariants on both pools (``held_full_pages``: full pages owned by someone,
    for the exact full accounting), then every ``"swa"`` invariant. Returns the checks run."""
    # The SWA checks first: they name the SWA-specific cause (a freed sentinel is also a
    # reserved-page violation of the SWA pool, but INV-SWA-SENTINEL says why).
    count = run_scope("swa", snap, SWAContext(swa_held_tokens, tree))
    count += check_allocator(snap.full, held_full_pages)
    if not snap.pure:
        count += check_allocator(snap.swa)
    return count


__all__ = ["SWAContext", "check_swa_allocator"]
