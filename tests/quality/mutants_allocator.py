"""Seeded allocator bugs: page free lists, free groups, reserved slot 0, allocation kernels.

Each function patches one optimized twin in place (see :mod:`kvpool.testing.quality.mutant`);
:mod:`tests.quality.mutants` registers them with the detectors that must catch them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.constants import RESERVED_INDEX
from kvpool.testing.quality import need, wrap


def paged_free_no_dedup(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    shift = alloc.page_size.bit_length() - 1

    need(alloc, "_return_pages", "_mark_free", "free_pages", "release_pages")

    def return_pages(slots: torch.Tensor) -> None:
        # The real code minus the dedup: same marking, same prepend to either list.
        pages = torch.sort(slots >> shift).values  # sorted, but not unique
        alloc._mark_free(pages)
        if alloc.need_sort:
            alloc.release_pages = torch.cat((pages, alloc.release_pages))
        else:
            alloc.free_pages = torch.cat((pages, alloc.free_pages))

    alloc._return_pages = return_pages


def group_frees_separately(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    need(alloc, "_pending_free", "_in_free_group", "_buffer_as_is", "_return_pages")

    def make(_orig: Any) -> Callable[[], None]:
        def free_group_end() -> None:
            pending, alloc._pending_free, alloc._in_free_group = alloc._pending_free, [], False
            alloc._buffer_as_is = None
            for slots in pending:  # one free per buffered call instead of one for the group
                alloc._return_pages(slots)

        return free_group_end

    wrap(alloc, "free_group_end", make)


def slot0_allocatable(mm: Any) -> None:
    def make(orig: Any) -> Callable[[int], torch.Tensor | None]:
        def take_pages(n: int) -> torch.Tensor | None:
            pages = orig(n)
            if pages is not None and pages.numel() and int(pages[0]) == 1:
                pages = pages.clone()
                pages[0] = RESERVED_INDEX  # page 1 leaks, page 0 is handed out
            return pages  # type: ignore[no-any-return]

        return take_pages

    wrap(mm.token_to_kv_pool_allocator, "_take_pages", make)


def failed_alloc_consumes(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., None]:
        def check_capacity(*args: Any, **kwargs: Any) -> None:
            try:
                orig(*args, **kwargs)
            except Exception:
                alloc = mm.token_to_kv_pool_allocator
                alloc.free_pages = alloc.free_pages[1:]  # the failed attempt kept a page
                raise

        return check_capacity

    wrap(mm, "_check_capacity", make)


def extend_partial_write(mm: Any) -> None:
    def make(orig: Any) -> Callable[..., torch.Tensor | None]:
        def alloc_extend(*args: Any) -> torch.Tensor | None:
            out = orig(*args)
            if out is not None and out.numel() > 1:
                out[out.numel() // 2 + 1 :] = RESERVED_INDEX  # the kernel stopped half way
            return out  # type: ignore[no-any-return]

        return alloc_extend

    wrap(mm.token_to_kv_pool_allocator, "alloc_extend", make)


def decode_no_new_page(mm: Any) -> None:
    def alloc_decode(seq_lens: Any, seq_lens_cpu: Any, last_loc: torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(last_loc, dtype=torch.int64) + 1  # never opens a page

    mm.token_to_kv_pool_allocator.alloc_decode = alloc_decode


def order_swapped(mm: Any) -> None:
    alloc = mm.token_to_kv_pool_allocator
    shift = alloc.page_size.bit_length() - 1

    need(alloc, "_return_pages", "free_pages")

    def return_pages(slots: torch.Tensor) -> None:
        pages = torch.unique(slots >> shift)
        if alloc.page_size == 1:
            alloc.free_pages = torch.cat((slots, alloc.free_pages))  # LIFO instead of FIFO
        else:
            alloc.free_pages = torch.cat((alloc.free_pages, pages))  # FIFO instead of LIFO

    alloc._return_pages = return_pages
