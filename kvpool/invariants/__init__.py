"""Named invariants over plain snapshots (:mod:`kvpool.snapshot`); imports neither twin.

Each invariant has a stable id (``INV-...``), a one-line description and a check per scope
(:mod:`kvpool.invariants.registry`); a violation raises
:class:`~kvpool.errors.InvariantViolation` naming the id and the offending indices. Entry points:
:func:`check_allocator`, :func:`check_req_to_token` (component scope) and :func:`check_all`
(a whole :class:`~kvpool.snapshot.PoolSnapshot`). Each returns how many checks it ran.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Iterable

from kvpool.invariants import allocator as _allocator  # noqa: F401  (registers its checks)
from kvpool.invariants import req_to_token as _req_to_token  # noqa: F401
from kvpool.invariants.registry import (
    INVARIANTS,
    SCOPES,
    InvariantRecord,
    RowContext,
    checks_for,
    invariant,
    run_scope,
)
from kvpool.snapshot import (
    AllocatorSnapshot,
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
    "kvpool.invariants.swa",
    "kvpool.invariants.host",
)
for _name in _OPTIONAL_MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as _exc:
        if _exc.name != _name:
            raise


def check_allocator(snap: AllocatorSnapshot, held_pages: Iterable[int] | None = None) -> int:
    """Every ``"allocator"`` invariant on ``snap``. ``held_pages`` (page ids owned by someone,
    pending-free pages included) enables the exact accounting (leaks, use after free)."""
    held = None if held_pages is None else frozenset(held_pages)
    return run_scope("allocator", snap, held)


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
    extra = [(r.req_pool_idx, r.row) for r in snap.reqs if r.req_pool_idx is not None and r.row]
    extra += [
        (s.req_pool_idx, s.row) for s in snap.sessions if s.req_pool_idx is not None and s.row
    ]
    return dataclasses.replace(snap.req_to_token, rows=snap.req_to_token.rows + tuple(extra))


def check_all(snapshot: PoolSnapshot, previous: PoolSnapshot | None = None) -> int:
    """Component checks on the pool's allocator and table (without held sets: the pool-scope
    accounting invariants derive those from requests, sessions and the tree), then every
    ``"pool"`` invariant. Returns the number of checks run."""
    count = check_allocator(snapshot.allocator)
    count += check_req_to_token(
        _with_owner_rows(snapshot),
        previous=None if previous is None else previous.req_to_token,
        page_size=snapshot.allocator.page_size,
    )
    return count + run_scope("pool", snapshot, previous)


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
