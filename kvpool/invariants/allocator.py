"""Invariants of a token allocator's free lists (scope ``"allocator"``).

Units: page ids (equal to slot ids at page size 1); ``pending_free`` holds slot ids. A check gets
the snapshot and, when the caller knows it, the set of pages held by someone (requests, sessions,
the tree, a test's model); pages named by ``pending_free`` count as still held.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from functools import lru_cache

import kvpool.invariants.derived as derived
from kvpool.constants import RESERVED_INDEX, is_power_of_two
from kvpool.errors import InvariantViolation
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import invariant, run_scope
from kvpool.snapshot import AllocatorSnapshot


def _free_listed(snap: AllocatorSnapshot) -> list[int]:
    return list(snap.free_pages) + list(snap.release_pages)


def _pending_pages(snap: AllocatorSnapshot) -> list[int]:
    return [slot // snap.page_size for slot in snap.pending_free]


@invariant(
    "INV-ALLOCATOR-SHAPE",
    "page_size is a power of two and size == num_pages * page_size tokens",
    scope="allocator",
)
def check_shape(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    if not is_power_of_two(snap.page_size) or snap.num_pages < 0:
        raise InvariantViolation(
            "INV-ALLOCATOR-SHAPE", f"bad page_size {snap.page_size} / num_pages {snap.num_pages}"
        )
    if snap.size != snap.num_pages * snap.page_size:
        raise InvariantViolation(
            "INV-ALLOCATOR-SHAPE",
            f"size {snap.size} != num_pages {snap.num_pages} * page_size {snap.page_size}",
        )


@invariant(
    "INV-RESERVED-ZERO",
    "index 0 (page 0 / row 0) is never free-listed, pending or held",
    scope="allocator",
)
def check_reserved_page(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    # membership tests in the shared page sets; the one offender there can be is the
    # reserved page itself
    named = RESERVED_INDEX in derived.free_pages(snap) or RESERVED_INDEX in (held_pages or ())
    if named:
        fail("INV-RESERVED-ZERO", "reserved page is free-listed, pending or held", [RESERVED_INDEX])


@invariant(
    "INV-PAGE-RANGE",
    "every free, release, pending and held page id lies in 1..num_pages",
    scope="allocator",
)
def check_page_range(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    # all in range (min and max of the shared page sets run in C; the scan names offenders)
    free, held, num_pages = derived.free_pages(snap), held_pages or (), snap.num_pages
    if (not free or (min(free) > RESERVED_INDEX and max(free) <= num_pages)) and (
        not held or (min(held) > RESERVED_INDEX and max(held) <= num_pages)
    ):
        return
    named = _free_listed(snap) + _pending_pages(snap) + list(held_pages or ())
    fail(
        "INV-PAGE-RANGE",
        f"page ids outside 1..{snap.num_pages}",
        [p for p in named if not RESERVED_INDEX < p <= snap.num_pages],
    )


@invariant(
    "INV-NO-DOUBLE-FREE",
    "no page twice in free_pages + release_pages; no pending-free page already free "
    "(nor, at page size 1, a slot pending twice)",
    scope="allocator",
)
def check_no_double_free(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    listed = derived.free_listed(snap)
    if len(listed) < len(snap.free_pages) + len(snap.release_pages):  # a repeat: name them
        counts = Counter(_free_listed(snap))
        fail(
            "INV-NO-DOUBLE-FREE", "pages free-listed twice", [p for p, n in counts.items() if n > 1]
        )
    if not snap.pending_free:
        return  # nothing pending: the checks below name nothing
    fail(
        "INV-NO-DOUBLE-FREE",
        "pages pending free in the open group are already free",
        [p for p in derived.pending_pages(snap) if p in listed],
    )
    if snap.page_size == 1:
        pending = Counter(snap.pending_free)
        fail(
            "INV-NO-DOUBLE-FREE",
            "slots pending free twice",
            [s for s, n in pending.items() if n > 1],
        )


@invariant(
    "INV-FREE-GROUP",
    "pending_free is empty outside an open free group",
    scope="allocator",
)
def check_free_group(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    if snap.pending_free and not snap.in_free_group:  # (nothing pending: nothing to name)
        fail("INV-FREE-GROUP", "slots pending free with no open group", snap.pending_free)


@invariant(
    "INV-TOKEN-ACCOUNTING",
    "free + held pages == num_pages exactly: no leaked page (neither free nor held) and no "
    "page both free and held (use after free)",
    scope="allocator",
)
def check_token_accounting(snap: AllocatorSnapshot, held_pages: frozenset[int] | None) -> None:
    listed = len(snap.free_pages) + len(snap.release_pages)
    if listed > snap.num_pages:
        raise InvariantViolation(
            "INV-TOKEN-ACCOUNTING",
            f"{listed} free-listed pages but only {snap.num_pages} exist",
        )
    if held_pages is None:
        return
    free = derived.free_listed(snap)
    fail(
        "INV-TOKEN-ACCOUNTING",
        "pages both free and held (use after free)",
        free & held_pages,
    )
    fail(
        "INV-TOKEN-ACCOUNTING",
        "pages leaked (neither free nor held)",
        all_pages(snap.num_pages) - free - held_pages,
    )


@lru_cache(maxsize=64)
def all_pages(num_pages: int) -> frozenset[int]:
    """Pages ``1..num_pages`` (built once per pool size: the accounting runs every step)."""
    return frozenset(range(RESERVED_INDEX + 1, num_pages + 1))


def check_allocator(snap: AllocatorSnapshot, held_pages: Iterable[int] | None = None) -> int:
    """Every ``"allocator"`` invariant on ``snap``. ``held_pages`` (page ids owned by someone,
    pending-free pages included) enables the exact accounting (leaks, use after free)."""
    held = None if held_pages is None else frozenset(held_pages)
    return run_scope("allocator", snap, held)


__all__ = [
    "all_pages",
    "check_allocator",
    "check_free_group",
    "check_no_double_free",
    "check_page_range",
    "check_reserved_page",
    "check_shape",
    "check_token_accounting",
]
