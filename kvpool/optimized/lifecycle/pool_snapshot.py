"""The optimized memory manager's whole-state snapshot (:class:`kvpool.snapshot.PoolSnapshot`).

Mirrors :mod:`kvpool.reference.lifecycle.pool_snapshot`: requests in the manager's table order,
sessions in opening order, rows read up to ``kv_allocated_len``, KV tags of every committed token
beside what they must be. Everything is converted to plain Python ints. A snapshot is a
verification read, not a hot path: each state tensor is read to the host once (a numpy view on
the CPU, :mod:`kvpool.optimized.host_view`), then sliced there, with the manager's own internal
readers (the public ones' argument checks are for callers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt
import torch

from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
from kvpool.optimized.hicache.tree_view import host_tier_snapshot
from kvpool.optimized.lifecycle.mamba_hooks import MambaHooks
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.req import Req
from kvpool.protocols.pools import ReqToTokenPoolProtocol, TokenAllocatorProtocol
from kvpool.records import filled_record
from kvpool.snapshot import (
    AllocatorSnapshot,
    HostTierSnapshot,
    MambaTreeSnapshot,
    PoolSnapshot,
    ReqSnapshot,
    SessionSnapshot,
    TreeSnapshot,
)
from kvpool.tags import kv_tags


class _Snapshots(Protocol):
    """A component that snapshots itself (the tree cache, radix or chunk)."""

    def snapshot(self) -> TreeSnapshot | MambaTreeSnapshot: ...


class _TagReader(Protocol):
    """The KV cache as the snapshot reads it: the tag stored at each slot."""

    def read_tags(self, loc: Sequence[int]) -> list[int]: ...


class SnapshotHost(Protocol):
    """What :func:`build_pool_snapshot` reads of a memory manager (nothing is written)."""

    @property
    def req_to_token_pool(self) -> ReqToTokenPoolProtocol[torch.Tensor]: ...
    @property
    def token_to_kv_pool_allocator(self) -> TokenAllocatorProtocol[torch.Tensor]: ...
    @property
    def tree_cache(self) -> _Snapshots: ...
    @property
    def kv_cache(self) -> _TagReader: ...
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
    with tokens); others leave those fields 0.

    The table is read once (:meth:`ReqToTokenPool._read_held`: every request's and session's
    row, with :meth:`ReqToTokenPool.read`'s checks), the KV tags of every committed slot in one
    gather (the cache's ``_snapshot_tags`` where it has one, else ``read_tags``), and each piece
    is converted to Python ints once."""
    pool = mm.req_to_token_pool
    all_reqs = list(mm.reqs.values())
    all_sessions = list(mm.sessions.values())
    held = [r for r in all_reqs if r.req_pool_idx is not None]
    held_rows = [(r.req_pool_idx, r.kv_allocated_len) for r in held]
    held_rows += [
        (s.req_pool_idx, s.kv_allocated_len) for s in all_sessions if s.req_pool_idx is not None
    ]
    pairs = cast("list[tuple[int, int]]", held_rows)  # rows are set: filtered above
    arrays = _read_rows(pool, pairs)
    row_values = [tuple(a.tolist()) for a in arrays]
    stored = _committed_tags(
        mm.kv_cache, [a[: r.kv_committed_len] for a, r in zip(arrays, held, strict=False)]
    )
    # rows come back in ``pairs`` order: held requests in table order, then held sessions
    next_row = iter(row_values).__next__
    reqs: list[ReqSnapshot] = []
    start = 0
    for req in all_reqs:
        row: tuple[int, ...] = ()
        tags: tuple[int, ...] = ()
        expected: tuple[int, ...] = ()
        committed = req.kv_committed_len
        if req.req_pool_idx is not None:
            row = next_row()
            count = len(row[:committed])
            tags = tuple(stored[start : start + count])
            start += count
            expected = _expected_tags(req, committed)
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
                    "prefix_len": req._prefix_len(),
                    "kv_committed_len": committed,
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
    for s in all_sessions:
        srow = () if s.req_pool_idx is None else next_row()
        last = s.last_node
        sessions.append(
            filled_record(
                SessionSnapshot,
                {
                    "session_id": s.session_id,
                    "req_pool_idx": s.req_pool_idx,
                    "kv_committed_len": s.kv_committed_len,
                    "kv_allocated_len": s.kv_allocated_len,
                    "cache_protected_len": s.cache_protected_len,
                    "last_node_id": None if last is None else last.node_id,
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
    allocator = mm.token_to_kv_pool_allocator
    if isinstance(pool, ReqToTokenPool):  # the rows read above, not a second read
        table = pool._snapshot_of([(p[0], v) for p, v in zip(pairs, row_values, strict=True)])
    else:
        table = pool.snapshot(pairs)
    device = allocator.snapshot()
    hooks = mm.mamba_hooks
    return filled_record(
        PoolSnapshot,
        {
            "allocator": device,
            "req_to_token": table,
            "tree": tree if mamba_tree is None else mamba_tree.as_tree_snapshot(),
            "reqs": tuple(reqs),
            "sessions": tuple(sessions),
            "max_total_num_tokens": allocator.size,
            "extra": {"capacity_refusals": mm.capacity_refusals},
            "mamba": None
            if hooks is None
            else hooks._snapshot_of(all_reqs, all_sessions, mamba_tree),
            "swa": None,
            "host": _host_snapshot(mm.tree_cache, tree, allocator, device),
        },
    )


def _read_rows(
    pool: ReqToTokenPoolProtocol[torch.Tensor], pairs: list[tuple[int, int]]
) -> list[npt.NDArray[np.int64] | npt.NDArray[np.int32]]:
    """Columns ``0:stop`` of each ``(row, stop)`` pair as host arrays (``read``'s checks):
    one read of the twin's table, else one ``read`` per pair."""
    if isinstance(pool, ReqToTokenPool):
        return list(pool._read_held(pairs))
    return [np.asarray(pool.read(row, 0, stop).tolist(), dtype=np.int64) for row, stop in pairs]


def _committed_tags(
    kv: _TagReader, parts: list[npt.NDArray[np.int64] | npt.NDArray[np.int32]]
) -> list[int]:
    """The stored tag of every slot of ``parts`` (in order) in one read: the cache's
    ``_snapshot_tags`` (a host read) where it has one, else ``read_tags`` of the list."""
    if not parts:
        return []
    # one part (a single request, the common case) needs no concatenation
    slots = (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.int64, copy=False)
    if not slots.size:
        return []
    fast = getattr(kv, "_snapshot_tags", None)
    if fast is None:
        return kv.read_tags(slots.tolist())
    tags: list[int] = fast(slots)
    return tags


def _expected_tags(req: Req, committed: int) -> tuple[int, ...]:
    """``kv_tags(all_token_ids[:committed], extra_key)``: the request's cached running tags
    (:meth:`Req.kv_tags_upto`, equal by contract) for a count within its tokens."""
    if type(committed) is int and 0 <= committed <= req.seq_len():
        return tuple(req.kv_tags_upto(committed).tolist())
    return tuple(kv_tags(req.all_token_ids[:committed], req.extra_key))


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
    snap: HostTierSnapshot
    if getattr(tree, "host_snapshot_takes_parts", False):  # an adapter reading no part twice
        same = getattr(tree, "allocator", None) is allocator
        snap = take(tree_snap, device if same else None)
    else:
        snap = take()
    return snap


__all__ = ["SnapshotHost", "build_pool_snapshot"]
