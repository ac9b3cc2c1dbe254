"""Speculative decoding in the lifecycle: EAGLE v2 over-allocation and EAGLE v1 draft borrowing.

Units: tokens for lengths, slots for results.

- v2 (:func:`spec_step`): before a step every request's allocation grows to
  ``ceil_align(kv_committed_len + 2 * reserve, page_size)`` (never shrinking); the accepted tokens
  (at most ``2 * reserve``) are appended and their KV computed in the pre-allocated slots; the
  slots ahead stay allocated across steps and are freed only on release
  (``[ceil_align(committed), allocated)``, see ``MemoryManager.release_kv_cache``).
- v1 (:func:`spec_draft_v1`): evict the shortfall, ``backup_state``, allocate the draft slots for
  columns ``[allocated, allocated + num_draft)`` (``alloc_extend`` from ``last_loc`` when paged),
  write the draft tags, ``restore_state``: the slots stay officially free, and the row is not
  written. Draft tag of column ``c``: ``kv_tags(tokens[:committed] + [0] * (c + 1 - committed))``
  at ``c`` (token 0 stands for the unknown draft tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from kvpool.config import PoolConfig
from kvpool.constants import ceil_align
from kvpool.errors import ContextOverflowError, InvalidArgumentError
from kvpool.host_checks import as_int, token_list
from kvpool.protocols.pools import ReqToTokenPoolProtocol, TokenAllocatorProtocol
from kvpool.reference.req import Req
from kvpool.tags import kv_tags


class TagWriter(Protocol):
    """The KV cache as the draft step uses it: write the tags of draft tokens into slots."""

    def write_tags(self, loc: Sequence[int], tags: Sequence[int]) -> None: ...


class SpecDecodeHost(Protocol):
    """What the speculative steps use of the memory manager that runs them (its pools and
    lifecycle helpers; see :class:`kvpool.reference.lifecycle.primitives.LifecyclePrimitives`)."""

    @property
    def config(self) -> PoolConfig: ...
    @property
    def page_size(self) -> int: ...
    @property
    def req_to_token_pool(self) -> ReqToTokenPoolProtocol[list[int]]: ...
    @property
    def token_to_kv_pool_allocator(self) -> TokenAllocatorProtocol[list[int]]: ...
    @property
    def kv_cache(self) -> TagWriter: ...
    def _running_full(self, rids: Sequence[str]) -> list[Req]: ...
    def _last_loc(self, req: Req, col: int) -> int: ...
    def _evict_for_alloc(self, prefix_lens: list[int], seq_lens: list[int]) -> None: ...
    def _alloc_slots(
        self, prefix_lens: list[int], seq_lens: list[int], last_locs: list[int], evict: bool = True
    ) -> list[int]: ...
    def write_kv(self, req: Req, start: int, stop: int) -> None: ...


SpecPrepare = Callable[[list[Req], list[int], list[int]], None]
"""A step's preparation before its allocation, called with (the batch's requests, the grown
requests' first new columns, their new allocated lengths): SGLang 0.5.23's
``eagle_prepare_for_decode`` slides sliding windows there (``SWAMemoryManager``). It checks
capacity before changing anything, so a refused step still changes nothing."""


def spec_step(
    mm: SpecDecodeHost,
    rids: Sequence[str],
    accepted: Sequence[Sequence[int]],
    reserve: int,
    prepare: SpecPrepare | None = None,
) -> list[int]:
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
    last = [mm._last_loc(r, s) for (r, _), s in zip(grow, starts, strict=True)]
    out = mm._alloc_slots(starts, ends, last) if grow else []
    pos = 0
    for (req, end), start in zip(grow, starts, strict=True):
        assert req.req_pool_idx is not None
        mm.req_to_token_pool.write(
            (req.req_pool_idx, slice(start, end)), out[pos : pos + end - start]
        )
        pos += end - start
        req.kv_allocated_len = end
    for req, acc in zip(reqs, accepted, strict=True):
        if not acc:
            continue
        start = req.kv_committed_len
        req.output_ids.extend(acc)
        mm.write_kv(req, start, start + len(acc))
        req.kv_committed_len = start + len(acc)
    return out


def spec_draft_v1(mm: SpecDecodeHost, rids: Sequence[str], num_draft: int) -> list[int]:
    """Borrow ``num_draft`` slots per request (see the module docstring); returns them in batch
    order. Only the eviction of the shortfall (if any) changes the pools."""
    reqs = mm._running_full(rids)
    num_draft = as_int("num_draft", num_draft)
    if num_draft < 0:
        raise InvalidArgumentError(f"num_draft must be >= 0, got {num_draft}")
    if num_draft == 0 or not reqs:
        return []
    starts = [r.kv_allocated_len for r in reqs]
    ends = [s + num_draft for s in starts]
    last = [mm._last_loc(r, s) for r, s in zip(reqs, starts, strict=True)]
    # Evict once, before the backup: pages a tree eviction frees inside the backup window
    # would be thrown away by the restore (a leak).
    mm._evict_for_alloc(starts, ends)
    alloc = mm.token_to_kv_pool_allocator
    state = alloc.backup_state()
    out = mm._alloc_slots(starts, ends, last, evict=False)
    pos = 0
    for req, start, end in zip(reqs, starts, ends, strict=True):
        committed = req.kv_committed_len
        padded = req.all_token_ids[:committed] + [0] * (end - committed)
        tags = kv_tags(padded, req.extra_key)[start:end]
        mm.kv_cache.write_tags(out[pos : pos + num_draft], tags)
        pos += num_draft
    alloc.restore_state(state)
    return out


__all__ = ["SpecDecodeHost", "SpecPrepare", "TagWriter", "spec_draft_v1", "spec_step"]
