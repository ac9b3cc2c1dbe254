"""Invariants of the Mamba state of a hybrid model (scope ``"mamba"``).

Units: Mamba slots ``1..size`` (slot 0 reserved). A check gets a
:class:`~kvpool.snapshot.HybridReqToTokenSnapshot` and a :class:`MambaContext`: what the caller
knows of the owners of slots (live requests, the prefix cache's checkpoints) and of the state
tags each should hold. Owners a caller does not know about (``owners_known=False``) switch the
exact accounting off; the other checks still run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from kvpool.constants import RESERVED_INDEX
from kvpool.invariants.allocator import all_pages
from kvpool.invariants.derived import IdentityMemo, identity_memo
from kvpool.invariants.failure import fail
from kvpool.invariants.registry import INVARIANTS, invariant, run_scope
from kvpool.records import fast_record
from kvpool.snapshot import (
    HybridReqToTokenSnapshot,
    HybridStateSnapshot,
    MambaNodeSnapshot,
    MambaTreeSnapshot,
    PoolSnapshot,
)
from kvpool.tags import mamba_state_tag


@dataclass(frozen=True)
class MambaReqView:
    """A live hybrid request as the invariants see it: its name (for messages), its row (None:
    waiting), its running Mamba slot and track-buffer slots, and the state tag its slot must
    hold (None: not known now, e.g. a clear or copy is still pending)."""

    name: str
    row: int | None
    slot: int | None
    track: tuple[int, ...] = ()
    expected_tag: int | None = None


@dataclass(frozen=True)
class MambaContext:
    """``reqs``: the live requests; ``checkpoints``: ``(slot, tag)`` of every state the prefix
    cache holds, with the tag it had when the cache took it; ``owners_known``: no other owner
    exists (enables the exact accounting)."""

    reqs: tuple[MambaReqView, ...] = ()
    checkpoints: tuple[tuple[int, int], ...] = ()
    owners_known: bool = True


def _build_held(ctx: MambaContext) -> list[int]:
    slots = [s for r in ctx.reqs for s in ((r.slot,) if r.slot is not None else ()) + r.track]
    return slots + [s for s, _ in ctx.checkpoints]


_held: IdentityMemo[MambaContext, list[int]] = identity_memo(_build_held)
"""Every slot named by an owner, once per owner naming it (built once per context, shared by
the checks: read-only)."""


@invariant(
    "INV-MAMBA-ONE-OWNER",
    "no Mamba slot is free twice, both free and held, held by two owners (two requests, or a "
    "request and the prefix cache), or reserved slot 0",
    scope="mamba",
)
def check_one_owner(snap: HybridReqToTokenSnapshot, ctx: MambaContext) -> None:
    alloc = snap.mamba_allocator
    free = list(alloc.free_slots) + list(alloc.group_slots)
    free_set = set(free)
    if len(free_set) < len(free):  # a repeat: name the slots (no Counter in the clean case)
        fail("INV-MAMBA-ONE-OWNER", "Mamba slots free twice",
             [s for s, n in Counter(free).items() if n > 1])  # fmt: skip
    held = _held(ctx)
    held_set = set(held)
    if len(held_set) < len(held):
        fail("INV-MAMBA-ONE-OWNER", "Mamba slots held by two owners",
             [s for s, n in Counter(held).items() if n > 1])  # fmt: skip
    if not free_set.isdisjoint(held_set):  # (decided in C; the intersection names the slots)
        fail("INV-MAMBA-ONE-OWNER", "Mamba slots both free and held", free_set & held_set)
    if RESERVED_INDEX in free_set or RESERVED_INDEX in held_set:
        fail("INV-MAMBA-ONE-OWNER", "reserved Mamba slot free-listed or held", [RESERVED_INDEX])


@invariant(
    "INV-MAMBA-ACCOUNTING",
    "free Mamba slots + slots held by requests + slots held by the prefix cache == size, all "
    "in 1..size (no leaked slot)",
    scope="mamba",
)
def check_accounting(snap: HybridReqToTokenSnapshot, ctx: MambaContext) -> None:
    alloc = snap.mamba_allocator
    named = list(alloc.free_slots) + list(alloc.group_slots) + _held(ctx)
    # (all in range by min and max, in C; the scan names the offenders)
    if named and (min(named) <= RESERVED_INDEX or max(named) > alloc.size):
        fail("INV-MAMBA-ACCOUNTING", f"Mamba slots outside 1..{alloc.size}",
             [s for s in named if not RESERVED_INDEX < s <= alloc.size])  # fmt: skip
    if not ctx.owners_known:
        return
    # (slots 1..size: the allocator's shared page range, built once per size)
    fail("INV-MAMBA-ACCOUNTING", "Mamba slots leaked (neither free nor held)",
         all_pages(alloc.size).difference(named))  # fmt: skip


@invariant(
    "INV-MAMBA-REQ-SLOT",
    "every live request holding a row holds exactly one running Mamba slot, and the row maps to "
    "it (and to its track buffers)",
    scope="mamba",
)
def check_req_slot(snap: HybridReqToTokenSnapshot, ctx: MambaContext) -> None:
    rows = [r.row for r in ctx.reqs if r.row is not None]
    fail("INV-MAMBA-REQ-SLOT", "running requests without a Mamba slot",
         [r.row for r in ctx.reqs if r.row is not None and r.slot is None])  # fmt: skip
    mapping = snap.mamba_mapping
    fail("INV-MAMBA-REQ-SLOT", "rows mapped to another Mamba slot than their request's",
         [r.row for r in ctx.reqs if r.row is not None and r.slot is not None
          and (r.row >= len(mapping) or mapping[r.row] != r.slot)])  # fmt: skip
    if snap.track_mapping and any(snap.track_mapping):
        fail("INV-MAMBA-REQ-SLOT", "rows mapped to other track buffers than their request's",
             [r.row for r in ctx.reqs if r.row is not None and r.track
              and snap.track_mapping[r.row] != r.track])  # fmt: skip
    if len(set(rows)) < len(rows):  # a repeat: name the rows
        fail("INV-MAMBA-REQ-SLOT", "rows held by two requests",
             [r for r, n in Counter(rows).items() if n > 1])  # fmt: skip


@invariant(
    "INV-MAMBA-CHECKPOINT",
    "a state checkpoint held by the prefix cache is never written in place: its tag is the one "
    "it had when the cache took it",
    scope="mamba",
)
def check_checkpoint(snap: HybridReqToTokenSnapshot, ctx: MambaContext) -> None:
    pool = snap.mamba_pool
    bad = [s for s, tag in ctx.checkpoints if 0 < s <= pool.size and pool.state_tag(s) != tag]
    if bad:
        fail("INV-MAMBA-CHECKPOINT", "cached Mamba states overwritten", bad)


@invariant(
    "INV-MAMBA-STATE-INTEGRITY",
    "a request's Mamba slot holds the state its own token history produced, the same in every "
    "layer's conv and temporal state",
    scope="mamba",
)
def check_state_integrity(snap: HybridReqToTokenSnapshot, ctx: MambaContext) -> None:
    pool = snap.mamba_pool
    fail("INV-MAMBA-STATE-INTEGRITY", "Mamba slots whose state is not their request's",
         [r.slot for r in ctx.reqs if r.slot is not None and r.expected_tag is not None
          and 0 < r.slot <= pool.size and pool.state_tag(r.slot) != r.expected_tag])  # fmt: skip


def tree_checkpoints(tree: MambaTreeSnapshot) -> tuple[tuple[int, int], ...]:
    """``(slot, tag)`` of every state a Mamba radix cache holds, the tag being the state after
    the node's path from the root (a checkpoint is the state after its last token)."""
    by_id = {n.node_id: n for n in tree.nodes}
    out: list[tuple[int, int]] = []
    for node in tree.nodes:
        if node.mamba_value is None:
            continue
        parts: list[tuple[int, ...]] = []
        cur: MambaNodeSnapshot | None = node
        while cur is not None and cur.parent_id is not None:
            parts.append(cur.key)
            cur = by_id.get(cur.parent_id)
        tokens = [t for part in reversed(parts) for t in part]
        out.append((node.mamba_value, mamba_state_tag(tokens, node.extra_key)))
    return tuple(out)


def _pool_scope(check: Callable[[HybridReqToTokenSnapshot, MambaContext], None]) -> Callable[
    [PoolSnapshot, PoolSnapshot | None], None
]:  # fmt: skip
    """``check`` at pool scope: on a hybrid manager's snapshot, with the live requests and the
    Mamba radix cache's checkpoints (when the radix cache is on) as the owners."""

    def run(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
        if snap.mamba is None:
            return
        check(snap.mamba.pool, _pool_context(snap.mamba))

    return run


def _build_pool_context(mamba: HybridStateSnapshot) -> MambaContext:
    """The owners a hybrid manager's snapshot names: its live requests and the Mamba radix
    cache's checkpoints (when the radix cache is on)."""
    views = tuple([_req_view(name=r.rid, row=r.row, slot=r.slot, track=r.track,
                             expected_tag=r.expected_tag) for r in mamba.reqs])  # fmt: skip
    tree = mamba.tree
    checkpoints = () if tree is None else tree_checkpoints(tree)
    return _context(reqs=views, checkpoints=checkpoints, owners_known=True)


# (built every step: fast_record fills the records without their generated __init__)
_req_view = fast_record(MambaReqView)
_context = fast_record(MambaContext)


# built once per snapshot for the five pool-scope checks (a pure function of the snapshot)
_pool_context: IdentityMemo[HybridStateSnapshot, MambaContext] = identity_memo(_build_pool_context)


for _id, _check in (
    ("INV-MAMBA-ONE-OWNER", check_one_owner),
    ("INV-MAMBA-ACCOUNTING", check_accounting),
    ("INV-MAMBA-REQ-SLOT", check_req_slot),
    ("INV-MAMBA-STATE-INTEGRITY", check_state_integrity),
    ("INV-MAMBA-CHECKPOINT", check_checkpoint),
):
    invariant(_id, INVARIANTS[_id].description, scope="pool")(_pool_scope(_check))


def check_mamba(snap: HybridReqToTokenSnapshot, ctx: MambaContext | None = None) -> int:
    """Every ``"mamba"`` invariant on ``snap`` (``ctx`` None: no owners known, so only the
    free-list checks bite). Returns the number of checks run."""
    return run_scope("mamba", snap, ctx or MambaContext(owners_known=False))


__all__ = ["MambaContext", "MambaReqView", "check_mamba", "tree_checkpoints"]
