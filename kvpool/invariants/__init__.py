"""Named invariants over plain snapshots (:mod:`kvpool.snapshot`); imports neither twin.

Each invariant has a stable id (``INV-...``), a one-line description and a check per scope
(:mod:`kvpool.invariants.registry`); a violation raises
:class:`~kvpool.errors.InvariantViolation` naming the id and the offending indices. Entry points:
:func:`check_allocator`, :func:`check_req_to_token` (component scope) and :func:`check_all`
(a whole :class:`~kvpool.snapshot.PoolSnapshot`). Each returns how many checks it ran.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from itertools import chain

from kvpool.invariants import req_to_token as _req_to_token  # noqa: F401
from kvpool.invariants.allocator import check_allocator  # (importing it registers its checks)
from kvpool.invariants.derived import IdentityMemo, identity_memo
from kvpool.invariants.host import check_host_tier  # (host-scope checks only)
from kvpool.invariants.lifecycle import row_owners  # (registers the tree's, then its, checks)
from kvpool.invariants.registry import (
    INVARIANTS,
    SCOPES,
    InvariantRecord,
    RowContext,
    checks_for,
    invariant,
    run_scope,
)
from kvpool.invariants.tree import device_view
from kvpool.records import fast_record, replaced
from kvpool.snapshot import (
    HostTierSnapshot,
    PoolSnapshot,
    ReqToTokenSnapshot,
    SWAAllocatorSnapshot,
    TreeSnapshot,
)

# Modules other parts of kvpool add (tree and lifecycle invariants); registered when present.
_OPTIONAL_MODULES = (
    "kvpool.invariants.tree",
    "kvpool.invariants.lifecycle",
    "kvpool.invariants.promises",
    "kvpool.invariants.mamba",
    "kvpool.invariants.mamba_tree",
    "kvpool.invariants.unified_mamba_tree",
    "kvpool.invariants.swa",
    "kvpool.invariants.host",
)
for _name in _OPTIONAL_MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as _exc:
        if _exc.name != _name:
            raise


def check_req_to_token(
    snap: ReqToTokenSnapshot,
    held_rows: Iterable[int] | None = None,
    previous: ReqToTokenSnapshot | None = None,
    page_size: int | None = None,
) -> int:
    """Every ``"req_to_token"`` invariant on ``snap``. ``held_rows`` enables the exact row
    accounting, ``previous`` the generation monotonicity, ``page_size`` (tokens) the paged-layout
    check of ``snap.rows``."""
    held = None if held_rows is None else frozenset(held_rows)
    return run_scope("req_to_token", snap, RowContext(held, previous, page_size))


def _with_owner_rows(snap: PoolSnapshot) -> ReqToTokenSnapshot:
    """The table snapshot plus the rows requests and sessions report, for the layout checks."""
    # (the requests, then the sessions, holding a row: the pool checks' shared list)
    extra = [(idx, row) for _, idx, _, _, _, row, _ in row_owners(snap) if row]
    table = snap.req_to_token
    if not extra:
        return table
    # (replaced: dataclasses.replace costs more than the checks it feeds)
    return replaced(table, rows=table.rows + tuple(extra))


def check_all(snapshot: PoolSnapshot, previous: PoolSnapshot | None = None) -> int:
    """Component checks on the pool's allocator and table (without held sets: the pool-scope
    accounting invariants derive those from requests, sessions and the tree), then every
    ``"pool"`` invariant. Returns the number of checks run.

    With the host tier (``snapshot.host``): every ``"host"`` invariant too (the requests' and
    sessions' private pages count as held outside the tree), and the pool invariants see the
    tree without its host-only nodes (:func:`kvpool.invariants.tree.device_view`)."""
    count = 0
    if snapshot.host is not None:
        snapshot, previous, count = _host_tier(snapshot, previous)
    # (what check_allocator and check_req_to_token run, without their argument conversions:
    # no held set here)
    count += run_scope("allocator", snapshot.allocator, None)
    ctx = _row_context(
        held_rows=None,
        previous=None if previous is None else previous.req_to_token,
        page_size=snapshot.allocator.page_size,
    )
    count += run_scope("req_to_token", _with_owner_rows(snapshot), ctx)
    return count + run_scope("pool", snapshot, previous)


_row_context = fast_record(RowContext)
"""Builds a :class:`RowContext` (every field by keyword: :func:`~kvpool.records.fast_record`)."""


def _host_tier(
    snapshot: PoolSnapshot, previous: PoolSnapshot | None
) -> tuple[PoolSnapshot, PoolSnapshot | None, int]:
    """Run the host invariants on ``snapshot.host``; return both snapshots with their trees
    reduced to the on-device nodes, and the number of checks run."""
    assert snapshot.host is not None
    count = check_host_tier(
        _host_with_device_held(snapshot), None if previous is None else previous.host
    )
    snapshot = _device_snapshot(snapshot)
    if previous is not None:
        previous = _device_snapshot(previous)
    return snapshot, previous, count


def _build_host_with_device_held(snapshot: PoolSnapshot) -> HostTierSnapshot:
    """``snapshot.host`` with ``device_held``: the pages of the requests' and sessions' private
    ranges."""
    assert snapshot.host is not None
    ps = snapshot.allocator.page_size
    ranges = (row[p:a] for _, _, p, _, a, row, _ in row_owners(snapshot))
    if ps == 1:  # a slot is its own page: collect them in C
        private = sorted(set(chain.from_iterable(ranges)))
    else:
        private = sorted({s // ps for part in ranges for s in part})
    return replaced(snapshot.host, device_held=tuple(private))


def _build_device_snapshot(snapshot: PoolSnapshot) -> PoolSnapshot:
    """``snapshot`` with its tree reduced to the on-device nodes (itself when none is
    host-only)."""
    tree = device_view(snapshot.tree)
    return snapshot if tree is snapshot.tree else replaced(snapshot, tree=tree)


# Built once per snapshot object: a step's snapshot is the next step's previous one.
_host_with_device_held: IdentityMemo[PoolSnapshot, HostTierSnapshot] = identity_memo(
    _build_host_with_device_held
)
_device_snapshot: IdentityMemo[PoolSnapshot, PoolSnapshot] = identity_memo(_build_device_snapshot)


def check_swa_allocator(
    snap: SWAAllocatorSnapshot,
    held_full_pages: Iterable[int] | None = None,
    swa_held_tokens: int | None = None,
    tree: TreeSnapshot | None = None,
) -> int:
    """Every ``"swa"`` invariant on ``snap``, then the allocator invariants of both pools (see
    :func:`kvpool.invariants.swa.check_swa_allocator`). Returns the number of checks run."""
    from kvpool.invariants import swa

    return swa.check_swa_allocator(snap, held_full_pages, swa_held_tokens, tree)


__all__ = [
    "INVARIANTS",
    "SCOPES",
    "InvariantRecord",
    "RowContext",
    "check_all",
    "check_allocator",
    "check_req_to_token",
    "check_swa_allocator",
    "checks_for",
    "invariant",
]
