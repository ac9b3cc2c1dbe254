"""Data several invariants derive from one snapshot part, built once per part (not once per
invariant).

Snapshots are frozen dataclasses whose fields are ints, strings, tuples and nested frozen
snapshots, so what is derived from one snapshot object never changes while that object lives.
:func:`identity_memo` keeps the last few ``(part, derived)`` pairs by object identity; it holds
a strong reference to each part it remembers, so an identity it looks up can never be reused by
a new object. Within one lockstep step the invariants see the same part objects (both
the snapshot and its previous one), so each derived value is built once per step and side.
Callers must treat what these return as read-only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import chain, repeat
from operator import add, floordiv, mod
from typing import TypeVar

from kvpool.snapshot import AllocatorSnapshot, NodeSnapshot, TreeSnapshot

K = TypeVar("K")
V = TypeVar("V")


IdentityMemo = Callable[[K], V]
"""What :func:`identity_memo` returns: ``part -> fn(part)``, remembered by identity."""


def identity_memo(fn: Callable[[K], V], size: int = 4) -> IdentityMemo[K, V]:
    """``fn(part)`` remembered for the last ``size`` parts built, by identity (``is``, not
    ``==``: equal but distinct parts are rebuilt, which only costs time). The oldest part built
    is forgotten first. A plain function over one dict (not an object with ``__call__``): a
    hit, the common case, is one call and one dict lookup."""
    # id(part) -> (part, fn(part)), oldest first. Every part remembered is held here, so no
    # other live object can have its id: an id found names this very part.
    entries: dict[int, tuple[K, V]] = {}
    get = entries.get

    def lookup(part: K) -> V:
        found = get(id(part))
        if found is not None:
            return found[1]
        value = fn(part)
        entries[id(part)] = (part, value)
        if len(entries) > size:
            del entries[next(iter(entries))]
        return value

    return lookup


def _build_by_id(tree: TreeSnapshot) -> dict[int, NodeSnapshot]:
    return {n.node_id: n for n in tree.nodes}


by_id: IdentityMemo[TreeSnapshot, dict[int, NodeSnapshot]] = identity_memo(_build_by_id)
"""Node id -> node of a tree snapshot (read-only)."""


def _build_free_listed(alloc: AllocatorSnapshot) -> frozenset[int]:
    return frozenset(chain(alloc.free_pages, alloc.release_pages))


free_listed: IdentityMemo[AllocatorSnapshot, frozenset[int]] = identity_memo(_build_free_listed)
"""Pages on the free or the release list."""


def _build_pending_pages(alloc: AllocatorSnapshot) -> tuple[int, ...]:
    return tuple(page_of(alloc.pending_free, alloc.page_size))


pending_pages: IdentityMemo[AllocatorSnapshot, tuple[int, ...]] = identity_memo(
    _build_pending_pages
)
"""The page of each slot pending free (one entry per slot, in order)."""


def _build_free_pages(alloc: AllocatorSnapshot) -> frozenset[int]:
    listed = free_listed(alloc)
    if not alloc.pending_free:  # (the common case: the listed pages, no pending ones to add)
        return listed
    return listed.union(pending_pages(alloc))


free_pages: IdentityMemo[AllocatorSnapshot, frozenset[int]] = identity_memo(_build_free_pages)
"""Pages nobody owns: the free and release lists and the pages of the pending frees."""


def page_of(slots: Iterable[int], page_size: int) -> Iterable[int]:
    """``slot // page_size`` for each slot, in order (in C: ``map`` of ``floordiv``; the slots
    themselves at page size 1)."""
    return slots if page_size == 1 else map(floordiv, slots, repeat(page_size))


class PathSlots:
    """Slots of the root -> node path of one tree (the concatenated values, as
    :func:`kvpool.invariants.tree.path_values` gives them, as a tuple), each path built once."""

    __slots__ = ("_by_id", "_paths")

    def __init__(self, tree: TreeSnapshot) -> None:
        self._by_id = by_id(tree)
        self._paths: dict[int, tuple[int, ...] | None] = {}

    def __call__(self, node_id: int) -> tuple[int, ...] | None:
        """The path's slots; None if ``node_id`` is not in the tree."""
        if node_id in self._paths:
            return self._paths[node_id]
        parts: list[tuple[int, ...]] = []
        cur = self._by_id.get(node_id)
        path: tuple[int, ...] | None = None
        if cur is not None:
            while cur is not None and cur.parent_id is not None:
                parts.append(cur.value)
                cur = self._by_id.get(cur.parent_id)
            path = tuple(chain.from_iterable(reversed(parts)))
        self._paths[node_id] = path
        return path


path_slots: IdentityMemo[TreeSnapshot, PathSlots] = identity_memo(PathSlots)
"""The :class:`PathSlots` of a tree snapshot."""


_CONTIGUOUS: dict[tuple[int, tuple[int, ...]], bool] = {}
"""Verdicts of :func:`page_contiguous` by ``(page_size, slots)`` for tuple rows (a pure
function of the values: a row kept between steps, or read by two checks, is decided once)."""

_CONTIGUOUS_MAX = 1024  # (rows remembered before the memo starts over: bounds memory)


_SEEN: dict[int, tuple[tuple[int, ...], int, bool]] = {}
"""``id(slots) -> (slots, page_size, verdict)`` of the tuple rows decided lately: one row
object is read by several checks in a step (its owner's, the table's), and a lookup by
identity skips hashing it. Every row remembered is held here, so an id found names it."""


def page_contiguous(slots: Sequence[int], page_size: int) -> bool:
    """:func:`_page_contiguous`, remembered by identity, then by value, for tuple rows."""
    if page_size == 1 or not slots:
        return True
    if type(slots) is not tuple:
        return _page_contiguous(slots, page_size)
    seen = _SEEN.get(id(slots))
    if seen is not None and seen[1] == page_size:
        return seen[2]
    key = (page_size, slots)
    verdict = _CONTIGUOUS.get(key)
    if verdict is None:
        verdict = _page_contiguous(slots, page_size)
        if len(_CONTIGUOUS) >= _CONTIGUOUS_MAX:
            _CONTIGUOUS.clear()
        _CONTIGUOUS[key] = verdict
    if len(_SEEN) >= _SEEN_MAX:
        _SEEN.clear()
    _SEEN[id(slots)] = (slots, page_size, verdict)
    return verdict


_SEEN_MAX = 64  # (a few steps' rows: bounds the rows held)


def _page_contiguous(slots: Sequence[int], page_size: int) -> bool:
    """Whether ``slots`` (one row's, by column) keep the paged layout: in each column block
    ``[k * ps, (k + 1) * ps)`` the slots are consecutive from a page-aligned first slot. The
    verdict of :func:`kvpool.invariants.req_to_token.contiguity_violations` (no violation),
    computed with C-level ``map``/``chain`` instead of a loop per column. False for a page size
    below 1 (a broken snapshot), so that callers fall back to their scans."""
    if page_size == 1 or not slots:
        return True
    if page_size < 1:
        return False  # (no verdict here: the callers' own scans decide, as they always did)
    bases = slots[::page_size]
    sizes = repeat(page_size)
    if any(map(mod, bases, sizes)):  # a block starting off a page boundary
        return False
    ends = map(add, bases, sizes)
    laid_out = tuple(chain.from_iterable(map(range, bases, ends)))
    return laid_out[: len(slots)] == tuple(slots)


__all__ = [
    "IdentityMemo",
    "PathSlots",
    "by_id",
    "free_listed",
    "free_pages",
    "identity_memo",
    "page_contiguous",
    "page_of",
    "path_slots",
    "pending_pages",
]
