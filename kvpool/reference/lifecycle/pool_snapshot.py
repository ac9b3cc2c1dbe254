"""The memory manager's whole-state snapshot (:class:`kvpool.snapshot.PoolSnapshot`).

Requests are listed in the manager's table order (registration order; finished and aborted
requests have left the table), sessions in opening order. Rows are read up to
``kv_allocated_len``; KV tags are read for every committed token (``kv_tags``) next to what they
must be (``expected_tags``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from kvpool.protocols.pools import ReqToTokenPoolProtocol, TokenAllocatorProtocol
from kvpool.records import filled_record
from kvpool.reference.hicache.hiradix_cache import HiRadixCache
from kvpool.reference.hicache.tree_view import host_tier_snapshot
from kvpool.reference.kv.kv_cache import TagReader, snapshot_tags
from kvpool.reference.lifecycle.mamba_hooks import MambaHooks
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.req import Req
from kvpool.snapshot import (
    AllocatorSnapshot,
    HostTierSnapshot,
    MambaTreeSnapshot,
    PoolSnapshot,
    ReqSnapshot,
    SessionSnapshot,
    TreeSnapshot,
)
from kvpool.tags import kv_tags_tuple


class _Snapshots(Protocol):
    """A component that snapshots itself (the tree cache, radix or chunk)."""

    def snapshot(self) -> TreeSnapshot | MambaTreeSnapshot: ...


class SnapshotHost(Protocol):
    """What :func:`build_pool_snapshot` reads of a memory manager (nothing is written)."""

    @property
    def req_to_token_pool(self) -> ReqToTokenPoolProtocol[list[int]]: ...
    @property
    def token_to_kv_pool_allocator(self) -> TokenAllocatorProtocol[list[int]]: ...
    @property
    def tree_cache(self) -> _Snapshots: ...
    @property
    def kv_cache(self) -> TagReader: ...
    @property
    def mamba_hooks(self) -> MambaHooks | None: ...
    @property
    def reqs(self) -> Mapping[str, Req]: ...
    @property
    def sessions(self) -> Mapping[str, SessionSlot]: ...
    @property
    def capacity_refusals(self) -> int: ...


def build_pool_snapshot(
    mm: SnapshotHost,
    *,
    req_swa: Callable[[str], int] | None = None,
    session_swa: Mapping[str, int] | None = None,
) -> PoolSnapshot:
    """Snapshot every pool, request and session of ``mm``. SWA managers give ``req_swa`` (a
    request id's ``swa_evicted_seqlen``) and ``session_swa`` (a session's, when it holds a row
    with tokens); others leave those fields 0."""
    pool = mm.req_to_token_pool
    held_rows: list[tuple[int, int]] = []
    contents: list[tuple[int, tuple[int, ...]]] = []  # (row, values) as read, for the table
    reqs: list[ReqSnapshot] = []
    live = list(mm.reqs.values())
    rows: list[tuple[int, ...]] = []
    committed_slots: list[int] = []
    for req in live:
        row: tuple[int, ...] = ()
        if req.req_pool_idx is not None:
            held_rows.append((req.req_pool_idx, req.kv_allocated_len))
            row = tuple(pool.read(req.req_pool_idx, 0, req.kv_allocated_len))
            contents.append((req.req_pool_idx, row))
            committed_slots += row[: req.kv_committed_len]
        rows.append(row)
    # every committed slot's tag in one read (tags are per slot: the same as one read per
    # request, without a KV-cache call per request)
    stored = tuple(snapshot_tags(mm.kv_cache, committed_slots)) if committed_slots else ()
    start = 0
    for req, row in zip(live, rows, strict=True):
        tags: tuple[int, ...] = ()
        expected: tuple[int, ...] = ()
        if req.req_pool_idx is not None:
            committed = req.kv_committed_len
            end = start + min(committed, len(row))  # (len(row[:committed]))
            tags = stored[start:end]
            start = end
            expected = kv_tags_tuple(req.all_token_ids[:committed], req.extra_key)
        last = req.last_node
        reqs.append(
            filled_record(
                ReqSnapshot,
                {
                    "rid": req.rid,
                    "state": req.state,
                    "req_pool_idx": req.req_pool_idx,
                    "input_len": len(req.origin_input_ids),
                    "output_len": len(req.output_ids),
                    "prefix_len": len(req.prefix_indices),
                    "kv_committed_len": req.kv_committed_len,
                    "kv_allocated_len": req.kv_allocated_len,
                    "cache_protected_len": req.cache_protected_len,
                    "is_chunked": req.is_chunked,
                    "last_node_id": None if last is None else last.node_id,
                    "session_id": req.session_id,
                    "extra_key": req.extra_key,
                    "row": row,
                    "kv_tags": tags,
                    "expected_tags": expected,
                    "swa_evicted_seqlen": 0 if req_swa is None else req_swa(req.rid),
                },
            )
        )
    sessions: list[SessionSnapshot] = []
    for s in mm.sessions.values():
        srow: tuple[int, ...] = ()
        if s.req_pool_idx is not None:
            held_rows.append((s.req_pool_idx, s.kv_allocated_len))
            srow = tuple(pool.read(s.req_pool_idx, 0, s.kv_allocated_len))
            contents.append((s.req_pool_idx, srow))
        sessions.append(
            filled_record(
                SessionSnapshot,
                {
                    "session_id": s.session_id,
                    "req_pool_idx": s.req_pool_idx,
                    "kv_committed_len": s.kv_committed_len,
                    "kv_allocated_len": s.kv_allocated_len,
                    "cache_protected_len": s.cache_protected_len,
                    "last_node_id": None if s.last_node is None else s.last_node.node_id,
                    "row": srow,
                    "busy_with": s.busy_with,
                    "swa_evicted_seqlen": (
                        session_swa.get(s.session_id, 0) if session_swa is not None and srow else 0
                    ),
                },
            )
        )
    tree = mm.tree_cache.snapshot()
    mamba_tree = tree if isinstance(tree, MambaTreeSnapshot) else None
    allocator = mm.token_to_kv_pool_allocator.snapshot()
    if isinstance(pool, ReqToTokenPool):  # the rows read above (read's checks), not again
        table = pool._snapshot_of(contents)
    else:
        table = pool.snapshot(held_rows)
    return filled_record(
        PoolSnapshot,
        {
            "allocator": allocator,
            "req_to_token": table,
            "tree": tree.as_tree_snapshot() if isinstance(tree, MambaTreeSnapshot) else tree,
            "reqs": tuple(reqs),
            "sessions": tuple(sessions),
            "max_total_num_tokens": mm.token_to_kv_pool_allocator.size,
            "extra": {"capacity_refusals": mm.capacity_refusals},
            "mamba": None
            if mm.mamba_hooks is None
            else mm.mamba_hooks.snapshot(mm.reqs.values(), mm.sessions.values(), mamba_tree),
            "swa": None,
            "host": _host_snapshot(mm.tree_cache, tree, mm.token_to_kv_pool_allocator, allocator),
        },
    )


def _host_snapshot(
    tree: object, tree_snap: object, allocator: object, device: AllocatorSnapshot
) -> HostTierSnapshot | None:
    """The host tier's snapshot when the tree cache has one (a ``HiRadixCache``), given
    ``tree_snap`` (the tree's snapshot just taken) and ``device`` (``allocator``'s, when it is
    the tree's) instead of taking them again."""
    if isinstance(tree, HiRadixCache) and isinstance(tree_snap, TreeSnapshot):
        same = tree.token_to_kv_pool_allocator is allocator
        return host_tier_snapshot(tree, tree_snap, device if same else None)
    take = getattr(tree, "host_snapshot", None)
    if take is None:
        return None
    snap: HostTierSnapshot = take()
    return snap


__all__ = ["SnapshotHost", "build_pool_snapshot"]
