"""Invariants of the request-to-token table (scope ``"req_to_token"``).

Units: rows ``1..size``; a snapshot row's contents are slot ids by column (token position). The
context (:class:`~kvpool.invariants.registry.RowContext`) may add the held rows, the previous
snapshot and the allocator's page size in tokens.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from operator import lt

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import InvariantViolation
from kvpool.invariants.derived import page_contiguous
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import RowContext, invariant
from kvpool.snapshot import ReqToTokenSnapshot


@invariant(
    "INV-RESERVED-ZERO",
    "index 0 (page 0 / row 0) is never free-listed, pending or held",
    scope="req_to_token",
)
def check_reserved_row(snap: ReqToTokenSnapshot, ctx: RowContext) -> None:
    named = RESERVED_INDEX in snap.free_slots or RESERVED_INDEX in (ctx.held_rows or ())
    if named:
        fail("INV-RESERVED-ZERO", "reserved row is free-listed or held", [RESERVED_INDEX])
    # A held row never maps a token to the reserved page (slots [0, page_size)).
    first_real_slot = ctx.page_size if ctx.page_size is not None else RESERVED_INDEX + 1
    for row, slots in snap.rows:
        if not slots or min(slots) >= first_real_slot:
            continue  # (min runs in C; the scan names the offenders)
        fail(
            "INV-RESERVED-ZERO",
            f"row {row} maps columns to slots of the reserved page",
            [col for col, slot in enumerate(slots) if 0 <= slot < first_real_slot],
        )


@invariant(
    "INV-ROW-RANGE",
    "every free and held row lies in 1..size, and req_generation has size + 1 entries",
    scope="req_to_token",
)
def check_row_range(snap: ReqToTokenSnapshot, ctx: RowContext) -> None:
    free, held, size = snap.free_slots, ctx.held_rows or (), snap.size
    ids = [r for r, _ in snap.rows]
    # (each part in range by its min and max, in C, without joining them first)
    if (
        (free and (min(free) <= RESERVED_INDEX or max(free) > size))
        or (held and (min(held) <= RESERVED_INDEX or max(held) > size))
        or (ids and (min(ids) <= RESERVED_INDEX or max(ids) > size))
    ):
        named = list(free) + list(held) + ids
        fail(
            "INV-ROW-RANGE",
            f"rows outside 1..{snap.size}",
            [r for r in named if not RESERVED_INDEX < r <= snap.size],
        )
    if len(snap.req_generation) != snap.size + 1:
        raise InvariantViolation(
            "INV-ROW-RANGE",
            f"req_generation has {len(snap.req_generation)} entries, expected {snap.size + 1}",
        )


@invariant(
    "INV-ROW-ACCOUNTING",
    "no row twice in free_slots; free rows + held rows == size exactly (no leaked row, no row "
    "both free and held)",
    scope="req_to_token",
)
def check_row_accounting(snap: ReqToTokenSnapshot, ctx: RowContext) -> None:
    free = set(snap.free_slots)
    if len(free) < len(snap.free_slots):  # a repeat: name the rows
        counts = Counter(snap.free_slots)
        fail("INV-ROW-ACCOUNTING", "rows free twice", [r for r, n in counts.items() if n > 1])
    if ctx.held_rows is None:
        return
    fail("INV-ROW-ACCOUNTING", "rows both free and held", free & ctx.held_rows)
    every = set(range(RESERVED_INDEX + 1, snap.size + 1))
    fail("INV-ROW-ACCOUNTING", "rows leaked (neither free nor held)", every - free - ctx.held_rows)


@invariant(
    "INV-GENERATION-MONOTONIC",
    "no row's req_generation decreases between snapshots; every held row's generation >= 1",
    scope="req_to_token",
)
def check_generation(snap: ReqToTokenSnapshot, ctx: RowContext) -> None:
    gens = snap.req_generation
    if ctx.held_rows is not None:
        fail(
            "INV-GENERATION-MONOTONIC",
            "held rows never handed out (generation 0)",
            [r for r in ctx.held_rows if 0 <= r < len(gens) and gens[r] < 1],
        )
    prev = ctx.previous
    if prev is None or len(prev.req_generation) != len(gens):
        return
    # (an unchanged table, or no entry lower than before, found in C; the scan names rows)
    if prev.req_generation == gens or not any(map(lt, gens, prev.req_generation)):
        return
    fail(
        "INV-GENERATION-MONOTONIC",
        "rows whose generation went backwards",
        [
            r
            for r, (old, new) in enumerate(zip(prev.req_generation, gens, strict=True))
            if new < old
        ],
    )


def contiguity_violations(slots: Sequence[int], page_size: int) -> list[int]:
    """Columns of one row breaking the paged layout: in each column block
    ``[k * ps, (k + 1) * ps)`` the slots must be consecutive within one page, the block's first
    slot at page offset 0 (so column ``c`` sits at page offset ``c % ps``)."""
    bad: list[int] = []
    for start in range(0, len(slots), page_size):
        base = slots[start]
        if base % page_size:
            bad.append(start)
        bad.extend(
            col
            for col in range(start + 1, min(start + page_size, len(slots)))
            if slots[col] != base + (col - start)
        )
    return bad


@invariant(
    "INV-PAGE-CONTIGUITY",
    "in every page-aligned column block of a row the slots are consecutive, in one page, and "
    "at the column's offset within the page",
    scope="req_to_token",
)
def check_page_contiguity(snap: ReqToTokenSnapshot, ctx: RowContext) -> None:
    if ctx.page_size is None or ctx.page_size == 1:
        return  # unknown page size, or every slot is its own page
    for row, slots in snap.rows:
        if page_contiguous(slots, ctx.page_size):
            continue  # (the verdict in C; the scan names the columns)
        fail(
            "INV-PAGE-CONTIGUITY",
            f"row {row} breaks the paged layout (page_size={ctx.page_size}) at columns",
            contiguity_violations(slots, ctx.page_size),
        )


__all__ = [
    "check_generation",
    "check_page_contiguity",
    "check_reserved_row",
    "check_row_accounting",
    "check_row_range",
    "contiguity_violations",
]
