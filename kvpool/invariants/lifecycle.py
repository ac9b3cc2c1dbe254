"""Lifecycle invariants over a :class:`~kvpool.snapshot.PoolSnapshot` (scope ``"pool"``).

Owners of pages: the tree (node values), a request holding a row (its private range
``row[cache_protected_len:kv_allocated_len]``, whose last page runs to
``ceil_align(kv_allocated_len)``), a session holding a row (same range), or nobody (the free
lists and the pending frees of an open free group). Units: tokens for sizes and lengths, page ids
for pages, slot ids for slots.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from itertools import chain

import kvpool.invariants.derived as derived
from kvpool.constants import RESERVED_INDEX, ceil_align
from kvpool.errors import InvariantViolation
from kvpool.invariants.allocator import all_pages
from kvpool.invariants.derived import page_contiguous, page_of
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant
from kvpool.invariants.tree import lock_holders, nodes_by_id, tree_pages
from kvpool.snapshot import PoolSnapshot, ReqSnapshot, SessionSnapshot

RowOwner = tuple[str, int | None, int, int, int, tuple[int, ...], int | None]
"""``(name, row, protected, committed, allocated, row contents, last_node_id)``."""


def row_owners(snap: PoolSnapshot) -> list[RowOwner]:
    """Every request and session holding a row (built once per ``(reqs, sessions)`` pair and
    shared: read-only)."""
    reqs, sessions = snap.reqs, snap.sessions
    found = _OWNERS_GET(id(reqs))
    if found is not None and found[1] is sessions:
        return found[2]
    owners = _build_row_owners(snap)
    # (holding the tuples keeps their identities from being reused while remembered)
    _OWNERS.pop(id(reqs), None)
    _OWNERS[id(reqs)] = (reqs, sessions, owners)
    if len(_OWNERS) > 4:
        del _OWNERS[next(iter(_OWNERS))]
    return owners


_OWNERS: dict[int, tuple[tuple[ReqSnapshot, ...], tuple[SessionSnapshot, ...], list[RowOwner]]] = {}
"""The last few :func:`row_owners` results (oldest first) by the identity of the request tuple,
with the session tuple they were built with (snapshots are immutable; a lockstep step asks for
the same pair many times). A request tuple remembered is held here, so an id found names it."""
_OWNERS_GET = _OWNERS.get


def _build_row_owners(snap: PoolSnapshot) -> list[RowOwner]:
    out: list[RowOwner] = [
        (
            f"req {r.rid}",
            r.req_pool_idx,
            r.cache_protected_len,
            r.kv_committed_len,
            r.kv_allocated_len,
            r.row,
            r.last_node_id,
        )
        for r in snap.reqs
        if r.req_pool_idx is not None
    ]
    out += [
        (
            f"session {s.session_id}",
            s.req_pool_idx,
            s.cache_protected_len,
            s.kv_committed_len,
            s.kv_allocated_len,
            s.row,
            s.last_node_id,
        )
        for s in snap.sessions
        if s.req_pool_idx is not None
    ]
    return out


def _pages(slots: Sequence[int], page_size: int) -> set[int]:
    return set(page_of(slots, page_size))


def page_owner_counts(snap: PoolSnapshot) -> Counter[int]:
    """Owners per page: tree nodes, private ranges, free lists and pending frees (each counted
    once per owner)."""
    alloc = snap.allocator
    counts = tree_pages(snap.tree)
    for _, _, protected, _, allocated, row, _ in row_owners(snap):
        counts.update(_pages(row[protected:allocated], alloc.page_size))
    counts.update(alloc.free_pages)
    counts.update(alloc.release_pages)
    counts.update(_pages(alloc.pending_free, alloc.page_size))
    return counts


def _owned_once(snap: PoolSnapshot) -> bool:
    """A sufficient condition for :func:`_ownership_errors` to name nothing, decided from the
    owners' slots without a set per owner: every owner's pages listed as they come (a tree
    node's and a private range's first slot per column block when the values are
    page-contiguous, hence each block within one page) are ``num_pages`` entries covering
    exactly 1..num_pages. Then no owner names a page twice, so the per-owner page sets are
    these very entries. False means undecided (the exact count decides)."""
    alloc = snap.allocator
    num_pages, ps = alloc.num_pages, alloc.page_size
    tree_ps = snap.tree.page_size
    owned: list[int] = []
    if tree_ps == 1:
        for n in snap.tree.nodes:
            owned += n.value
    elif tree_ps > 1:
        firsts: list[int] = []
        for n in snap.tree.nodes:
            value = n.value
            if not page_contiguous(value, tree_ps):
                return False
            firsts += value[::tree_ps]
        owned += page_of(firsts, tree_ps)
    else:
        return False
    if ps == 1:
        for _, _, p, _, a, row, _ in row_owners(snap):
            owned += row[p:a]
    elif ps > 1:
        firsts = []
        for _, _, p, _, a, row, _ in row_owners(snap):
            # (a private range from a page-aligned column of a page-contiguous row keeps the
            # row's column blocks)
            if p < 0 or p % ps or not page_contiguous(row, ps):
                return False
            firsts += row[p:a:ps]
        owned += page_of(firsts, ps)
    else:
        return False
    owned += alloc.free_pages
    owned += alloc.release_pages
    if alloc.pending_free:
        owned += _pages(alloc.pending_free, ps)
    return len(owned) == num_pages and all_pages(num_pages) == set(owned)


def _ownership_errors(snap: PoolSnapshot) -> list[int]:
    if _owned_once(snap):
        return []
    alloc = snap.allocator
    num_pages, ps = alloc.num_pages, alloc.page_size
    # The common verdict without a Counter or a loop per page: the owners' pages (each owner's
    # counted once, as page_owner_counts counts them) are num_pages entries covering exactly
    # the pages 1..num_pages, so each page is named once.
    values = (n.value for n in snap.tree.nodes)
    tree_ps = snap.tree.page_size  # (tree_pages counts the tree's pages by its own page size)
    parts = [map(set, values) if tree_ps == 1 else (_pages(v, tree_ps) for v in values)]
    parts.append(_pages(row[p:a], ps) for _, _, p, _, a, row, _ in row_owners(snap))
    owned = list(chain.from_iterable(chain.from_iterable(parts)))
    owned += alloc.free_pages
    owned += alloc.release_pages
    owned += _pages(alloc.pending_free, ps)
    if len(owned) == num_pages and all_pages(num_pages) == set(owned):
        return []
    counts = page_owner_counts(snap)
    pages = range(RESERVED_INDEX + 1, num_pages + 1)
    leaked = [p for p in pages if counts[p] == 0]
    doubly = [p for p, c in counts.items() if c > 1 or not RESERVED_INDEX < p <= num_pages]
    return leaked + doubly


@invariant(
    "INV-POOL-ACCOUNTING",
    "available + evictable + protected + session-held + sum over requests holding rows of "
    "(ceil_align(kv_allocated_len) - cache_protected_len) == size, in tokens",
    scope="pool",
)
def check_pool_accounting(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    alloc, ps = snap.allocator, snap.allocator.page_size
    pending = len(_pages(alloc.pending_free, ps)) * ps if alloc.pending_free else 0
    held = sum(ceil_align(a, ps) - p for _, _, p, _, a, _, _ in row_owners(snap))
    tree = snap.tree.evictable_size + snap.tree.protected_size
    total = alloc.available_size() + pending + tree + held
    size = snap.max_total_num_tokens or alloc.size
    if total != size:
        raise InvariantViolation(
            "INV-POOL-ACCOUNTING",
            f"available {alloc.available_size()} + pending {pending} + tree {tree} + held "
            f"{held} = {total} != size {size} (leaked or doubly owned pages listed)",
            _ownership_errors(snap),
        )


@invariant(
    "INV-ROW-OWNERS",
    "free rows + rows held by requests + session rows == req pool size; no row held twice or "
    "both held and free",
    scope="pool",
)
def check_row_owners(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    table = snap.req_to_token
    held = [owner[1] for owner in row_owners(snap) if owner[1] is not None]
    distinct = set(held)
    if len(distinct) < len(held):  # a repeat: name the rows
        counts = Counter(held)
        fail("INV-ROW-OWNERS", "rows held twice", [r for r, c in counts.items() if c > 1])
    if not distinct.isdisjoint(table.free_slots):  # (decided in C; the set names the rows)
        fail("INV-ROW-OWNERS", "rows held and free", distinct.intersection(table.free_slots))
    if len(table.free_slots) + len(held) != table.size:
        missing = set(range(RESERVED_INDEX + 1, table.size + 1)) - set(held) - set(table.free_slots)
        raise InvariantViolation(
            "INV-ROW-OWNERS",
            f"{len(table.free_slots)} free + {len(held)} held != {table.size} rows",
            sorted(missing),
        )


@invariant(
    "INV-ONE-OWNER",
    "every allocatable page is owned by exactly one of: a tree node, a request's private range, "
    "a session's private range, the free lists (or pending frees)",
    scope="pool",
)
def check_one_owner(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    if _owned_once(snap):
        return  # (the common verdict, without the call that would decide it again)
    fail("INV-ONE-OWNER", "pages with no owner or several", _ownership_errors(snap))


@invariant(
    "INV-ROW-SLOTS",
    "held rows name only allocated slots, page-contiguously; row[:cache_protected_len] equals "
    "the slots of the tree path to the holder's last node",
    scope="pool",
)
def check_row_slots(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    alloc, ps = snap.allocator, snap.allocator.page_size
    free = derived.free_pages(alloc)
    by_id = derived.by_id(snap.tree)
    paths: derived.PathSlots | None = None  # (asked for only when a row has a tree prefix)
    num_pages = alloc.num_pages
    tree_on = not snap.tree.disabled
    for name, _, protected, _, _, row, last in row_owners(snap):
        contiguous = page_contiguous(row, ps)
        # A page-contiguous row's first slot of each column block names all its pages; the
        # scans below only name the offenders. The row's pages are not collected: at page
        # size 1 a slot is its page, and slot // ps is monotone for ps >= 1, so the least and
        # greatest page are those of the least and greatest slot (min, max and isdisjoint in
        # C; a page size below 1 keeps the set, as every such snapshot always did).
        if ps == 1:
            broken = bool(row) and (
                not free.isdisjoint(row) or min(row) <= RESERVED_INDEX or max(row) > num_pages
            )
        elif ps > 1:
            firsts = row[::ps] if contiguous else row
            broken = bool(firsts) and (
                not free.isdisjoint(page_of(firsts, ps))
                or min(firsts) // ps <= RESERVED_INDEX
                or max(firsts) // ps > num_pages
            )
        else:
            pages = _pages(row if not contiguous else row[::ps], ps)
            broken = bool(pages) and (
                not free.isdisjoint(pages) or min(pages) <= RESERVED_INDEX or max(pages) > num_pages
            )
        if broken:
            fail(
                "INV-ROW-SLOTS",
                f"{name} names free or out-of-range slots",
                [
                    s
                    for s in row
                    if s // ps in free or not RESERVED_INDEX < s // ps <= alloc.num_pages
                ],
            )
        if not contiguous:
            fail(
                "INV-ROW-SLOTS",
                f"{name}'s row is not page-contiguous (columns listed)",
                [
                    c
                    for c in range(len(row))
                    if row[c] % ps != c % ps or (c % ps and row[c] != row[c - 1] + 1)
                ],
            )
        if protected and tree_on:
            if paths is None:
                paths = derived.path_slots(snap.tree)
            path = paths(last) if last is not None and last in by_id else None
            if path is None or tuple(row[:protected]) != path:
                raise InvariantViolation(
                    "INV-ROW-SLOTS",
                    f"{name}: row[:{protected}] differs from the tree path to node {last}",
                    list(row[:protected]),
                )


@invariant(
    "INV-LENGTHS",
    "cache_protected_len <= committed <= allocated <= max_context_len; protected page-aligned; "
    "a held row has allocated columns; waiting requests hold no row and no lengths",
    scope="pool",
)
def check_lengths(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    ps, width = snap.allocator.page_size, snap.req_to_token.max_context_len
    bad: list[int] = []
    for i, (_, row, protected, committed, allocated, contents, _) in enumerate(row_owners(snap)):
        ordered = 0 <= protected <= committed <= allocated <= width
        if not ordered or protected % ps or len(contents) != allocated or row is None:
            bad.append(i)
    if bad:
        fail("INV-LENGTHS", "owners (index in row_owners order) with bad lengths", bad)
    bad = []
    for i, r in enumerate(snap.reqs):
        if r.req_pool_idx is None and (r.kv_allocated_len or r.kv_committed_len):
            bad.append(i)
        if r.kv_committed_len > r.input_len + r.output_len:
            bad.append(i)
        if r.is_chunked and r.state != "running":
            bad.append(i)
    if bad:
        fail("INV-LENGTHS", "requests (index in snapshot order) with bad lengths or state", bad)


@invariant(
    "INV-IDLE",
    "with no request holding a row or a lock: only session paths are locked and every row is "
    "free except session rows",
    scope="pool",
)
def check_idle(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    for r in snap.reqs:  # (a loop, not any() over a generator: most steps return here)
        if r.req_pool_idx is not None or r.last_node_id is not None:
            return
    session_rows = {s.req_pool_idx for s in snap.sessions if s.req_pool_idx is not None}
    table = snap.req_to_token
    fail(
        "INV-IDLE",
        "idle, yet rows neither free nor held by a session",
        # (rows 1..size: the shared range, built once per size)
        all_pages(table.size).difference(table.free_slots, session_rows),
    )
    by_id = nodes_by_id(snap.tree)
    on_session_paths: set[int] = set()
    for h in lock_holders(snap):
        cur = by_id.get(h)
        while cur is not None and cur.parent_id is not None:
            on_session_paths.add(cur.node_id)
            cur = by_id.get(cur.parent_id)
    fail(
        "INV-IDLE",
        "idle, yet nodes locked off every session path",
        [
            n.node_id
            for n in snap.tree.nodes[1:]
            if n.lock_ref > 0 and n.node_id not in on_session_paths
        ],
    )


@invariant(
    "INV-KV-INTEGRITY",
    "every committed token's KV tag equals kv_tags(tokens, extra_key) at its position",
    scope="pool",
)
def check_kv_integrity(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    for r in snap.reqs:
        if len(r.kv_tags) != len(r.expected_tags) or len(r.kv_tags) != r.kv_committed_len:
            raise InvariantViolation(
                "INV-KV-INTEGRITY", f"req {r.rid}: tag lists do not cover the committed tokens"
            )
        if r.kv_tags == r.expected_tags:  # (one C comparison; the scan names the offenders)
            continue
        fail(
            "INV-KV-INTEGRITY",
            f"req {r.rid}: slots hold another token's KV",
            [
                r.row[p]
                for p, (got, want) in enumerate(zip(r.kv_tags, r.expected_tags, strict=True))
                if got != want
            ],
        )


__all__ = ["page_owner_counts", "row_owners"]
