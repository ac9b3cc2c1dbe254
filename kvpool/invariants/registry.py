"""The registry of named invariants: stable ids, one-line descriptions, check functions by scope.

An invariant is registered with :func:`invariant` as a decorator. Its id (``INV-...``) is stable:
specs, the quality suite and error messages refer to it. One id may be checked at several scopes
(``INV-RESERVED-ZERO`` holds for the allocator and for the request table); each scope's function
is registered separately under the same id. Checks run in registration order within a scope.

Scopes and the signature of their check functions (each raises
:class:`~kvpool.errors.InvariantViolation` or returns None):

- ``"allocator"``: ``(snap: AllocatorSnapshot, held_pages: frozenset[int] | None)``
- ``"req_to_token"``: ``(snap: ReqToTokenSnapshot, ctx: RowContext)``
- ``"pool"``: ``(snap: PoolSnapshot, previous: PoolSnapshot | None)``
- ``"mamba"``: ``(snap: HybridReqToTokenSnapshot, ctx: kvpool.invariants.mamba.MambaContext)``
- ``"mamba_tree"``: ``(tree: MambaTreeSnapshot)``
- ``"unified_mamba_tree"``: ``(tree: MambaTreeSnapshot)`` (SGLang 0.5.23's FULL + MAMBA tree)
- ``"swa"``: ``(snap: SWAAllocatorSnapshot, ctx: kvpool.invariants.swa.SWAContext)``
- ``"host"``: ``(snap: HostTierSnapshot, previous: HostTierSnapshot | None)``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvpool.snapshot import ReqToTokenSnapshot

SCOPES: tuple[str, ...] = (
    "allocator",
    "req_to_token",
    "pool",
    "mamba",
    "mamba_tree",
    "unified_mamba_tree",
    "swa",
    "host",
)

CheckFn = Callable[..., None]
F = TypeVar("F", bound=CheckFn)


@dataclass(frozen=True)
class RowContext:
    """What a request-table check may know besides the snapshot: the rows held by requests and
    sessions (None: unknown), the previous snapshot (None: first one) and the allocator's page
    size in tokens (None: unknown, page-layout checks are skipped)."""

    held_rows: frozenset[int] | None = None
    previous: ReqToTokenSnapshot | None = None
    page_size: int | None = None


@dataclass
class InvariantRecord:
    """One named invariant: its id, its one-line description and its check per scope."""

    invariant_id: str
    description: str
    checks: dict[str, CheckFn] = field(default_factory=dict)

    @property
    def scopes(self) -> tuple[str, ...]:
        return tuple(self.checks)


INVARIANTS: dict[str, InvariantRecord] = {}
"""Every registered invariant, by id, in registration order (for docs and the quality suite)."""

_BY_SCOPE: dict[str, list[tuple[str, CheckFn]]] = {scope: [] for scope in SCOPES}


def invariant(invariant_id: str, description: str, scope: str) -> Callable[[F], F]:
    """Register the decorated function as ``invariant_id``'s check at ``scope``.

    Registering the same id and scope again replaces the earlier function (a module reload);
    an id must start with ``INV-`` and the scope must be one of :data:`SCOPES`."""
    if not invariant_id.startswith("INV-"):
        raise ValueError(f"invariant ids start with 'INV-', got {invariant_id!r}")
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}; known: {SCOPES}")

    def register(fn: F) -> F:
        record = INVARIANTS.setdefault(invariant_id, InvariantRecord(invariant_id, description))
        record.checks[scope] = fn
        entries = _BY_SCOPE[scope]
        for i, (known_id, _) in enumerate(entries):
            if known_id == invariant_id:
                entries[i] = (invariant_id, fn)
                break
        else:
            entries.append((invariant_id, fn))
        return fn

    return register


def checks_for(scope: str) -> list[tuple[str, CheckFn]]:
    """``(invariant_id, check)`` pairs of ``scope``, in registration order."""
    return list(_BY_SCOPE[scope])


def run_scope(scope: str, *args: Any) -> int:
    """Run every check of ``scope`` on ``args``; returns how many ran (raises on a violation)."""
    # (the registered list itself, not a copy: a run registers nothing; a check that raises
    # ends the run, so the count is the list's length whenever it is returned)
    entries = _BY_SCOPE[scope]
    if len(args) == 2:  # (every scope but the Mamba trees': a plain two-argument call per
        # check, which the interpreter calls faster than one spreading a tuple)
        first, second = args
        for _, check in entries:
            check(first, second)
    else:
        for _, check in entries:
            check(*args)
    return len(entries)


__all__ = [
    "INVARIANTS",
    "SCOPES",
    "InvariantRecord",
    "RowContext",
    "checks_for",
    "invariant",
    "run_scope",
]
