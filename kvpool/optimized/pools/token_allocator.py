"""``TokenToKVPoolAllocator`` (optimized twin): the slot allocator for page size 1.

Units: ``size`` tokens, each its own page: slot ids and page ids coincide (``1..size``; slot 0 is
reserved), held as int64 tensors on ``device``. ``alloc`` takes slots from the head of
``free_pages``; ``free`` appends them to its tail (FIFO reuse), or stages them at the tail of
``release_pages`` under ``need_sort``. Everything else comes from
:class:`~kvpool.optimized.pools.allocator.BaseTokenToKVPoolAllocator` (twin of
:mod:`kvpool.reference.pools.token_allocator`; same methods and results).
"""

from __future__ import annotations

import torch

from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.rules import Rules


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Page size 1: every slot is a page. ``alloc`` takes from the head of ``free_pages`` and
    ``free`` appends (FIFO reuse), or appends to ``release_pages`` under ``need_sort``. Naming a
    slot twice in one call or one free group is a double free (checked mode)."""

    _dedup_pages = False
    _appends_freed = True

    def __init__(
        self,
        size: int,
        need_sort: bool = False,
        *,
        rules: Rules | None = None,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(
            size,
            1,
            need_sort,
            rules=rules,
            options=options,
        )

    def _extend_merge_bound(self, extend_num_tokens: int, batch_size: int) -> int:
        """Page size 1: ``alloc(extend_num_tokens)``'s pre-test (see the reference)."""
        return extend_num_tokens

    def _return_pages(self, slots: torch.Tensor) -> None:
        if self._free_mask is not None:
            self._set_free(slots, True)
        if self.need_sort:  # a copy: the slots may be the caller's tensor
            self._free_list.stage(slots.clone(), True)
        else:  # into the free list's spare tail: no copy of the whole list
            self._free_list.append(slots, slots is self._owned)


__all__ = ["TokenToKVPoolAllocator"]
