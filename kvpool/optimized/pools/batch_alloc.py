"""SGLang's batch allocations, ``alloc_extend`` and ``alloc_decode`` (optimized twin).

A mixin of :class:`~kvpool.optimized.pools.allocator.BaseTokenToKVPoolAllocator`, which provides the
free lists, the ``need_sort`` merge and the page taking. Units: lengths are tokens, results are
int64 slot tensors. The page counts come from the host copies of the lengths and the work runs
:func:`kvpool.kernels.alloc_extend` / ``alloc_decode``: no device-to-host sync unless checked
(see :mod:`kvpool.optimized.pools.allocator`). They run through the kernels' unchecked entries
(``*_unchecked``): what the kernels need of the metadata is established here (lengths made 1-D
on the device by ``_as_index``, integer dtypes and one batch size for them and their host copies
checked, the allocator's own pages and int64 output), so the hot path does not pay for the
wrappers' checks too.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvpool.errors import InvalidArgumentError
from kvpool.kernels.alloc_decode import alloc_decode_unchecked, next_slots_if_torch
from kvpool.kernels.alloc_extend import alloc_extend_unchecked
from kvpool.kernels.host import HostLens
from kvpool.optimized.pools.paged_ops import (
    check_decode_host,
    check_extend_args,
    check_extend_host,
    check_host_copy,
    check_integer_tensors,
    check_prefix_pages_held,
    extend_new_pages_host,
)
from kvpool.optimized.pools.segment_free import IndexLike


class BatchAllocs:
    """``alloc_extend`` / ``alloc_decode`` over the allocator's state."""

    page_size: int
    need_sort: bool
    device: torch.device
    kernel_backend: str | None
    free_pages: torch.Tensor
    _free_mask: torch.Tensor | None
    # provided by the allocator (annotations only, so that the allocator's methods are used)
    _as_index: Callable[[IndexLike], torch.Tensor]
    _merge_before_take: Callable[[bool, int], None]
    _take_pages: Callable[[int], torch.Tensor | None]
    _extend_merge_bound: Callable[[int, int], int]

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        prefix_lens_cpu: HostLens,
        seq_lens: torch.Tensor,
        seq_lens_cpu: HostLens,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots (int64, length ``extend_num_tokens``) for tokens ``[P_i, S_i)`` of every
        request, in batch order, or ``None`` (no change) when the new pages do not fit. The page
        count comes from the host copies; capacity is checked before the kernel is launched.
        Checked mode raises the reference's errors for a bad batch."""
        prefix_lens, seq_lens = self._as_index(prefix_lens), self._as_index(seq_lens)
        last_loc = self._as_index(last_loc)
        if self._free_mask is not None:  # device reads first: the reference's order of checks
            check_integer_tensors(prefix_lens=prefix_lens, seq_lens=seq_lens, last_loc=last_loc)
            p = check_host_copy("prefix_lens", prefix_lens, prefix_lens_cpu)
            s = check_host_copy("seq_lens", seq_lens, seq_lens_cpu)
            loc = last_loc.to(torch.int64)
            check_extend_args(p, s, loc, extend_num_tokens, self.page_size)
            check_prefix_pages_held(p, loc, self._free_mask, self.page_size)
        host_p, host_s = check_extend_host(
            prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens
        )
        num_new = extend_new_pages_host(host_p, host_s, self.page_size)
        bound = self._extend_merge_bound(extend_num_tokens, len(seq_lens_cpu))
        self._merge_before_take(bound > self.free_pages.numel(), num_new)
        pages = self._take_pages(num_new)
        if pages is None:
            return None
        out = torch.empty(extend_num_tokens, dtype=torch.int64, device=self.device)
        alloc_extend_unchecked(
            prefix_lens,
            seq_lens,
            last_loc,
            pages,
            out,
            self.page_size,
            self.kernel_backend,
            prefix_lens_cpu=prefix_lens_cpu,
            seq_lens_cpu=seq_lens_cpu,
        )
        return out

    def alloc_decode(
        self, seq_lens: torch.Tensor, seq_lens_cpu: HostLens, last_loc: torch.Tensor
    ) -> torch.Tensor | None:
        """One slot per request (int64) for token ``S_i - 1``: the first slot of the next free
        page when ``(S_i - 1) % page_size == 0``, else ``last_loc_i + 1``; ``None`` (no change)
        if the new pages do not fit. Checked mode raises the reference's errors."""
        seq_lens, last_loc = self._as_index(seq_lens), self._as_index(last_loc)
        if self._free_mask is not None:  # device reads first: the reference's order of checks
            check_integer_tensors(seq_lens=seq_lens, last_loc=last_loc)
            s = check_host_copy("seq_lens", seq_lens, seq_lens_cpu)
            loc = last_loc.to(torch.int64)
            if bool((s < 1).any()):
                raise InvalidArgumentError(
                    f"alloc_decode needs every seq_len >= 1, got {s.tolist()}"
                )
            check_extend_args(s - 1, s, loc, s.numel(), self.page_size)
            check_prefix_pages_held(s - 1, loc, self._free_mask, self.page_size)
        host_s = check_decode_host(seq_lens, seq_lens_cpu, last_loc)  # the checked host copy
        if self.page_size == 1:
            # Every request opens a page: its slot is the next free page, in batch order, so the
            # slots are the taken pages themselves (a view of the free list, as alloc returns).
            bs = int(host_s.size)
            if self.need_sort:
                self._merge_before_take(bs > self.free_pages.numel(), bs)
            return self._take_pages(bs)
        # page_opening_requests on the checked host copy, inline: (S - 1) % ps == 0
        opens = ((host_s & (self.page_size - 1)) == 1).nonzero()[0]
        num_new = int(opens.size)
        bs = int(host_s.size)
        if self.need_sort:
            self._merge_before_take(bs > self.free_pages.numel(), num_new)
        if num_new:
            pages = self._take_pages(num_new)
            if pages is None:
                return None
        else:  # no request opens a page (most decode steps): the free list stays as it is
            quick = next_slots_if_torch(last_loc, self.kernel_backend)
            if quick is not None:
                return quick
            pages = self.free_pages
        out = torch.empty(bs, dtype=torch.int64, device=self.device)
        alloc_decode_unchecked(
            seq_lens,
            last_loc,
            pages,
            out,
            self.page_size,
            self.kernel_backend,
            seq_lens_cpu=seq_lens_cpu,
            opens_cpu=opens,
        )
        return out


__all__ = ["BatchAllocs"]
