"""Lifecycle steps of a request on a hybrid sliding-window model (optimized twin of
:mod:`kvpool.reference.swa.lifecycle`: the same functions, written out again so that the lockstep
harness compares two implementations).

Units: tokens. ``row`` is the request's row of the request table (its full slots, one per token:
a 1-D int64 tensor, sliced as a view). ``swa_evicted_seqlen`` counts the request's leading
tokens whose SWA slots are gone (released by the window, or never its own to release): it only
grows.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvpool.constants import ceil_align, floor_align
from kvpool.errors import InvalidArgumentError


class WindowAllocator(Protocol):
    """What the window release uses of an SWA allocator: free the SWA slots mapped from these
    full slots."""

    def free_swa(self, free_index: torch.Tensor) -> None: ...


class SegmentAllocator(Protocol):
    """What SGLang 0.5.23's window slide and row release use of an SWA allocator: segment
    frees of a request's row columns starting at ``start_pos`` (SWA side, full side, both)."""

    def free_swa_segment(self, free_index: torch.Tensor, start_pos: int = 0) -> None: ...

    def free_full_segment(self, free_index: torch.Tensor, start_pos: int = 0) -> None: ...

    def free_segment(self, free_index: torch.Tensor, start_pos: int = 0) -> None: ...


class DeficitAllocator(Protocol):
    """What the eviction before an allocation reads of an SWA allocator (tokens)."""

    def full_available_size(self) -> int: ...

    def swa_available_size(self) -> int: ...


class SWAEvictor(Protocol):
    """What the eviction before an allocation uses of an SWA tree cache: evict full and SWA
    tokens, returning (full, SWA) tokens freed."""

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]: ...


def free_swa_out_of_window_slots(
    row: torch.Tensor,
    swa_evicted_seqlen: int,
    pre_len: int,
    cache_protected_len: int,
    sliding_window_size: int,
    page_size: int,
    allocator: WindowAllocator,
    is_chunk_cache: bool = False,
    swa_evict_floor: int = 0,
) -> int:
    """Release the SWA slots of the request's tokens that left the window before it computes
    token ``pre_len``; returns the new ``swa_evicted_seqlen``.

    Tokens below ``max(cache_protected_len, swa_evict_floor)`` are never released here (the tree
    owns the protected prefix; the floor shields a prompt); a floor above the protected prefix
    is rounded up to a page. The window keeps ``sliding_window_size`` tokens (a chunk cache) or
    ``max(sliding_window_size, page_size)`` (a radix cache: the last page a later insert makes a
    leaf keeps its SWA slots); the frontier is rounded down to a page, so only whole pages go,
    through ``allocator.free_swa``. InvalidArgumentError for a protected prefix that is not
    page-aligned or a row shorter than ``pre_len``."""
    if cache_protected_len % page_size:
        raise InvalidArgumentError(f"cache_protected_len {cache_protected_len} is not aligned")
    if row.numel() < pre_len:
        raise InvalidArgumentError(f"row of {row.numel()} slots for pre_len {pre_len}")
    floor = max(cache_protected_len, swa_evict_floor)
    if page_size > 1 and floor > cache_protected_len:
        floor = ceil_align(floor, page_size)
    evicted = max(swa_evicted_seqlen, floor)
    keep = sliding_window_size if is_chunk_cache else max(sliding_window_size, page_size)
    frontier = floor_align(max(evicted, pre_len - keep), page_size)
    if frontier <= evicted:
        return evicted
    allocator.free_swa(row[evicted:frontier])
    return frontier


def slide_swa_window(
    row: torch.Tensor,
    swa_evicted_seqlen: int,
    pre_len: int,
    cache_protected_len: int,
    sliding_window_size: int,
    page_size: int,
    allocator: SegmentAllocator,
    prefix_sharing: bool,
) -> int:
    """SGLang 0.5.23's window slide (``Rules.swa_window_release == "scheduler"``) before the
    request computes token ``pre_len``; returns the new ``swa_evicted_seqlen``.

    Nothing changes unless more than ``sliding_window_size`` tokens lie past the cursor
    (``pre_len - sliding_window_size > swa_evicted_seqlen``). Otherwise the cursor first rises
    to ``cache_protected_len`` (the tree owns that prefix), then to the frontier: ``pre_len -
    sliding_window_size`` without prefix sharing (the chunk cache), ``pre_len -
    ceil_align(max(sliding_window_size, page_size), page_size)`` with it (a radix cache),
    rounded down to a page; the columns between the two go back with one
    ``allocator.free_swa_segment`` at the old cursor. InvalidArgumentError for a protected
    prefix that is not page-aligned or a row shorter than the frontier."""
    if cache_protected_len % page_size:
        raise InvalidArgumentError(f"cache_protected_len {cache_protected_len} is not aligned")
    if pre_len - sliding_window_size < swa_evicted_seqlen + 1:
        return swa_evicted_seqlen
    evicted = max(swa_evicted_seqlen, cache_protected_len)
    if prefix_sharing:
        threshold = pre_len - ceil_align(max(sliding_window_size, page_size), page_size)
    else:
        threshold = pre_len - sliding_window_size
    frontier = floor_align(max(evicted, threshold), page_size)
    if frontier <= evicted:
        return evicted
    if row.numel() < frontier:
        raise InvalidArgumentError(f"row of {row.numel()} slots for a frontier at {frontier}")
    allocator.free_swa_segment(row[evicted:frontier], evicted)
    return frontier


def free_kv_row_segment(
    slots: torch.Tensor,
    start: int,
    swa_evicted_seqlen: int,
    cache_protected_len: int,
    allocator: SegmentAllocator,
) -> None:
    """SGLang 0.5.23's ``free_kv_row_segments`` of one segment: the row columns ``[start,
    start + len(slots))`` holding ``slots``. The window-dead columns ``[cache_protected_len,
    max(swa_evicted_seqlen, cache_protected_len))`` inside it go back full-side only
    (``free_full_segment``: their SWA slots are gone), then the rest with ``free_segment``
    (each live piece at its first column)."""
    stop = start + slots.numel()
    lo = min(max(cache_protected_len, start), stop)
    hi = min(max(swa_evicted_seqlen, cache_protected_len, start), stop)
    if hi > lo:
        allocator.free_full_segment(slots[lo - start : hi - start], lo)
    alive = [(start, lo), (hi, stop)] if hi > lo else [(start, stop)]
    for a, b in alive:
        if b > a:
            allocator.free_segment(slots[a - start : b - start], a)


def evict_for_swa_alloc(
    tree_cache: SWAEvictor, allocator: DeficitAllocator, num_tokens: int
) -> tuple[int, int]:
    """Before allocating ``num_tokens`` tokens in both pools: evict the full and SWA deficits
    (``num_tokens`` minus each pool's free tokens, at least 0) from ``tree_cache`` when either is
    positive; returns (full, SWA) tokens freed. A chunk cache (``disable``) evicts nothing."""
    if num_tokens < 0:
        raise InvalidArgumentError(f"num_tokens must be >= 0, got {num_tokens}")
    if getattr(tree_cache, "disable", False):
        return 0, 0
    full_short = max(0, num_tokens - allocator.full_available_size())
    swa_short = max(0, num_tokens - allocator.swa_available_size())
    if not full_short and not swa_short:
        return 0, 0
    freed: tuple[int, int] = tree_cache.evict(full_short, swa_short)
    return freed


__all__ = [
    "DeficitAllocator",
    "SWAEvictor",
    "SegmentAllocator",
    "WindowAllocator",
    "evict_for_swa_alloc",
    "free_kv_row_segment",
    "free_swa_out_of_window_slots",
    "slide_swa_window",
]
