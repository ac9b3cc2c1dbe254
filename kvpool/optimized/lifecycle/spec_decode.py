"""Speculative decoding in the optimized lifecycle: EAGLE v2 over-allocation, EAGLE v1 borrowing.

Mirrors :mod:`kvpool.reference.lifecycle.spec_decode` exactly (see there for the rules); results are
int64 slot tensors. Units: tokens for lengths, slots for results.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import torch

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.errors import ContextOverflowError, InvalidArgumentError
from kvpool.host_checks import as_int, token_list
from kvpool.optimized.lifecycle.batch_table import device_ints, rows_of, scatter_columns
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.req import Req
from kvpool.protocols.pools import ReqToTokenPoolProtocol, TokenAllocatorProtocol
from kvpool.tags import kv_tags


class TagWriter(Protocol):
    """The KV cache as the draft step uses it: write the tags of draft tokens into slots."""

    def write_tags(self, loc: torch.Tensor, tags: torch.Tensor) -> None: ...


class SpecDecodeHost(Protocol):
    """What the speculative steps use of the memory manager that runs them (its pools and
    lifecycle helpers; see :class:`kvpool.optimized.lifecycle.primitives.LifecyclePrimitives`)."""

    @property
    def config(self) -> PoolConfig: ...
    @property
    def page_size(self) -> int: ...
    @property
    def req_to_token_pool(self) -> ReqToTokenPoolProtocol[torch.Tensor]: ...
    @property
    def token_to_kv_pool_allocator(self) -> TokenAllocatorProtocol[torch.Tensor]: ...
    @property
    def kv_cache(self) -> TagWriter: ...
    @property
    def device(self) -> torch.device: ...
    @property
    def _empty(self) -> torch.Tensor: ...
    @property
    def options(self) -> TwinOptions: ...
    def _running_full(self, rids: Sequence[str]) -> list[Req]: ...
    def _row_last_locs(self, reqs: Sequence[Req], cols: Sequence[int]) -> torch.Tensor: ...
    def _evict_for_alloc(self, prefix_lens: list[int], seq_lens: list[int]) -> None: ...
    def _alloc_slots(
        self,
        prefix_lens: list[int],
        seq_lens: list[int],
        last_loc: torch.Tensor,
        evict: bool = True,
    ) -> torch.Tensor: ...
    def _write_kv_batch(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        stops: Sequence[int],
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


SpecPrepare = Callable[[list[Req], list[int], list[int]], None]
"""A step's preparation before its allocation (see the reference's)."""


def spec_step(
    mm: SpecDecodeHost,
    rids: Sequence[str],
    accepted: Sequence[Sequence[int]],
    reserve: int,
    prepare: SpecPrepare | None = None,
) -> torch.Tensor:
    """Grow each allocation to ``ceil_align(committed + 2 * reserve)``, then commit
    ``accepted[i]``. Returns the newly allocated slots (batch order). OutOfMemoryError /
    ContextOverflowError / InvalidArgumentError leave everything unchanged. ``prepare`` (if
    given) runs after every other check, before the allocation (:data:`SpecPrepare`)."""
    reqs = mm._running_full(rids)
    reserve = as_int("reserve", reserve)
    if reserve < 0:
        raise InvalidArgumentError(f"reserve must be >= 0, got {reserve}")
    if isinstance(accepted, str | bytes) or not isinstance(accepted, Iterable):
        raise InvalidArgumentError(f"accepted must be a sequence of token lists, got {accepted!r}")
    # token ids as decode takes them (vocabulary ids), every list before anything changes
    accepted = [token_list("accepted token ids", acc) for acc in accepted]
    if len(accepted) != len(reqs):
        raise InvalidArgumentError(f"{len(accepted)} accepted lists for {len(reqs)} requests")
    too_many = [r.rid for r, acc in zip(reqs, accepted, strict=True) if len(acc) > 2 * reserve]
    if too_many:
        raise InvalidArgumentError(f"requests {too_many} accept more than 2 * reserve tokens")
    targets = [
        max(r.kv_allocated_len, ceil_align(r.kv_committed_len + 2 * reserve, mm.page_size))
        for r in reqs
    ]
    over = [r.rid for r, t in zip(reqs, targets, strict=True) if t > mm.config.max_context_len]
    if over:
        raise ContextOverflowError(f"requests {over} would allocate past max_context_len")
    grow = [(r, t) for r, t in zip(reqs, targets, strict=True) if t > r.kv_allocated_len]
    starts = [r.kv_allocated_len for r, _ in grow]
    ends = [t for _, t in grow]
    if prepare is not None:
        prepare(reqs, starts, ends)
    grown = [r for r, _ in grow]
    out = mm._alloc_slots(starts, ends, mm._row_last_locs(grown, starts)) if grow else mm._empty
    if grow:
        rows = rows_of(grown)
        scatter_columns(mm.req_to_token_pool, rows, starts, ends, out, mm.options.checked)
    for req, end in grow:
        req.kv_allocated_len = end
    taking = [(r, acc) for r, acc in zip(reqs, accepted, strict=True) if acc]
    commits = [r.kv_committed_len for r, _ in taking]
    for req, acc in taking:
        req.output_ids.extend(acc)
    if taking:
        stops = [c + len(acc) for (_, acc), c in zip(taking, commits, strict=True)]
        mm._write_kv_batch([r for r, _ in taking], commits, stops)
        for (req, _), stop in zip(taking, stops, strict=True):
            req.kv_committed_len = stop
    return out


def spec_draft_v1(mm: SpecDecodeHost, rids: Sequence[str], num_draft: int) -> torch.Tensor:
    """Borrow ``num_draft`` slots per request (see the reference); returns them in batch order.
    Only the eviction of the shortfall (if any) changes the pools."""
    reqs = mm._running_full(rids)
    num_draft = as_int("num_draft", num_draft)
    if num_draft < 0:
        raise InvalidArgumentError(f"num_draft must be >= 0, got {num_draft}")
    if num_draft == 0 or not reqs:
        return mm._empty
    starts = [r.kv_allocated_len for r in reqs]
    ends = [s + num_draft for s in starts]
    last = mm._row_last_locs(reqs, starts)
    # Evict once, before the backup: pages a tree eviction frees inside the backup window
    # would be thrown away by the restore (a leak).
    mm._evict_for_alloc(starts, ends)
    alloc = mm.token_to_kv_pool_allocator
    state = alloc.backup_state()
    out = mm._alloc_slots(starts, ends, last, evict=False)
    tags: list[int] = []
    for req, start, end in zip(reqs, starts, ends, strict=True):
        committed = req.kv_committed_len
        padded = req.all_token_ids[:committed] + [0] * (end - committed)
        tags += kv_tags(padded, req.extra_key)[start:end]
    mm.kv_cache.write_tags(out, device_ints(tags, mm.device))
    alloc.restore_state(state)
    return out


__all__ = ["SpecDecodeHost", "SpecPrepare", "TagWriter", "spec_draft_v1", "spec_step"]
