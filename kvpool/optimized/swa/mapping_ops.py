"""What :class:`~kvpool.optimized.swa.allocator.SWATokenToKVPoolAllocator` computes on its
``full_to_swa_index_mapping`` apart from its own state (optimized twin only: the reference
writes these out in :mod:`kvpool.reference.swa.allocator`).

Units: slots and page ids are int64 tensors on the allocator's device (page ``p`` owns slots
``[p * page_size, (p + 1) * page_size)``); a free mask is a device bool tensor indexed by page
id, True while the page is free (checked mode's). Nothing here changes a tensor it is given:
each function returns a new tensor or raises the reference's typed error
(:class:`~kvpool.errors.KVPoolError`) before the allocator's first change.
"""

from __future__ import annotations

import numpy as np
import torch

from kvpool.constants import NO_LAST_LOC, RESERVED_INDEX
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.pools.paged_ops import check_free_list_shape, check_free_list_state


def slots_of_named_pages(
    slots: torch.Tensor, page_size: int, offsets: torch.Tensor, host: bool
) -> torch.Tensor:
    """Every slot of the pages ``slots`` (int64) name, each page once, in the order the slots
    first name them (page size > 1; ``offsets``: ``arange(page_size)`` on the device). The
    free's resolution, as the reference's: the sentinel mask that follows waits for the device
    anyway, so the ``unique`` adds no sync of its own. ``host``: checked mode, which reads the
    host anyway; with CPU tensors the same order is computed through NumPy views."""
    if host and slots.is_cpu and offsets.is_cpu:
        pages_np = slots.numpy() // page_size
        _, first_at = np.unique(pages_np, return_index=True)  # where each page is first named
        ordered = pages_np[np.sort(first_at)]
        return torch.from_numpy((ordered[:, None] * page_size + offsets.numpy()).reshape(-1))
    named = slots // page_size
    uniq, inverse = torch.unique(named, return_inverse=True)
    where = torch.arange(named.numel(), device=named.device)
    first = torch.full_like(uniq, named.numel()).scatter_reduce_(0, inverse, where, "amin")
    pages: torch.Tensor = uniq[torch.argsort(first)]
    out: torch.Tensor = (pages.unsqueeze(1) * page_size + offsets).reshape(-1)
    return out


def check_full_held(slots: torch.Tensor, free_mask: torch.Tensor | None, page_size: int) -> None:
    """Checked mode (a device read; nothing without ``free_mask``, the full pool's): full
    ``slots`` the caller holds, slot 0 (padding) skipped. InvalidArgumentError for a slot on a
    free page, as the reference. ``slots`` are in range already."""
    if free_mask is None:
        return
    if free_mask.is_cpu and slots.is_cpu and slots.dtype in (torch.int64, torch.int32):
        host = slots.numpy()  # the same gather through NumPy views: no tensor operation
        pages = host[host != RESERVED_INDEX] // page_size
        if not free_mask.numpy()[pages].any():
            return
    named = slots[slots != RESERVED_INDEX]
    loose = free_mask[named // page_size]
    if bool(loose.any()):
        raise InvalidArgumentError(
            f"full slots not allocated: {sorted(set(named[loose].tolist()))}"
        )


def check_swa_state(
    state: object, mapping_shape: torch.Size, num_pages: tuple[int, int], checked: bool
) -> tuple[object, object, torch.Tensor]:
    """A ``(full, swa, mapping)`` backup, checked before a restore and returned as it is:
    InvalidArgumentError for another shape of state, a mapping not of ``mapping_shape`` or
    either free list of the wrong shape (metadata: both modes); ``checked`` (device reads)
    also for a mapping without its -1 tail or free lists not of distinct page ids in
    ``1..num_pages`` (full, SWA)."""
    if not isinstance(state, tuple) or len(state) != 3:
        raise InvalidArgumentError("state must be the (full, swa, mapping) tuple")
    mapping = state[2]
    if not isinstance(mapping, torch.Tensor) or mapping.shape != mapping_shape:
        raise InvalidArgumentError("state holds a mapping of the wrong shape")
    check_free_list_shape(state[0])
    check_free_list_shape(state[1])
    if checked:
        if int(mapping[-1]) != NO_LAST_LOC:
            raise InvalidArgumentError("state holds a mapping without its -1 sentinel")
        check_free_list_state(state[0], num_pages[0])
        check_free_list_state(state[1], num_pages[1])
    return state[0], state[1], mapping


__all__ = ["check_full_held", "check_swa_state", "slots_of_named_pages"]
