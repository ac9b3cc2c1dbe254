"""The twin's argument checks of the host tier: index arguments as tensors, checked as the
reference checks them (:mod:`kvpool.reference.hicache.args`).

An index argument is first read by :func:`~kvpool.optimized.index_args.index_tensor` (a 1-D
integer tensor, array or list: metadata, both modes). Host slots live in host memory, so their
range and ownership are checked in both modes. Device slots given as a tensor are checked for
range and ownership only in checked mode (a device read, README "Checked mode"); given as a
list, their values are host values, so their range is checked in both modes.
"""

from __future__ import annotations

import numpy as np
import torch

from kvpool.errors import InvalidArgumentError
from kvpool.optimized.index_args import index_tensor
from kvpool.reference.hicache.args import check_device_range, check_device_slots, check_host_slots


def not_held(slots: torch.Tensor, allocator: object) -> list[int] | None:
    """The ``slots`` on a free page of the twin's ``allocator``, from its free-page mask (one
    gather, checked mode); None for an allocator without one (the reference's
    :func:`~kvpool.reference.hicache.args.slots_not_held` then asks it)."""
    mask = getattr(allocator, "_free_mask", None)
    if not isinstance(mask, torch.Tensor):
        return None
    if not slots.numel():
        return []
    if slots.is_cpu and mask.is_cpu:  # the same gather through NumPy views
        host = slots.numpy()
        host_pages = host // getattr(allocator, "page_size", 1)
        within = (host_pages >= 0) & (host_pages < mask.numel())
        free = np.zeros(host.shape, dtype=bool)
        free[within] = mask.numpy()[host_pages[within]]
        return [int(s) for s in host[free].tolist()]
    pages = slots // getattr(allocator, "page_size", 1)
    inside = (pages >= 0) & (pages < mask.numel())  # the range check names the others
    loose = torch.zeros_like(inside)
    loose[inside] = mask[pages[inside]]
    return [int(s) for s in slots[loose].tolist()]


def host_slot_arg(name: str, value: object, host: object) -> torch.Tensor:
    """``value`` as a CPU int64 tensor of host slots inside ``host``, held, each once
    (:func:`~kvpool.reference.hicache.args.check_host_slots`)."""
    slots = index_tensor(name, value, "cpu")
    check_host_slots(name, slots.tolist(), host)
    return slots


def device_slot_arg(
    name: str, value: object, allocator: object, device: torch.device, checked: bool
) -> torch.Tensor:
    """``value`` as an int64 tensor of device slots on ``device``: checked mode, inside the
    pool, held and each once (a device read); else, when given as host values (a list), inside
    the pool."""
    slots = index_tensor(name, value, device)
    if checked:
        check_device_slots(name, slots.tolist(), allocator, not_held(slots, allocator))
    elif not isinstance(value, torch.Tensor | np.ndarray):
        check_device_range(name, slots.tolist(), allocator)
    return slots


def check_row_read_index(row_read: object, need: int, device: torch.device) -> None:
    """A caller's read of a request's row (None: no read): a 1-D integer index of at least
    ``need`` slots (InvalidArgumentError; as
    :func:`~kvpool.reference.hicache.args.check_row_read`)."""
    if row_read is not None and index_tensor("row_read", row_read, device).numel() < need:
        raise InvalidArgumentError(f"row_read holds fewer than {need} slots")


def insert_slot_arg(
    value: object,
    key_len: int,
    held_len: int,
    allocator: object | None,
    device: torch.device,
    checked: bool,
) -> torch.Tensor:
    """An explicit ``value`` of ``insert`` as an int64 tensor of device slots on ``device``: at
    least one per token of a ``key_len``-token key (InvalidArgumentError); given
    ``allocator`` (a cache that is not disabled), its first ``held_len`` slots (the
    page-aligned key) inside the pool, held and each once in checked mode (a device read), else
    inside the pool when given as host values (a list)."""
    slots = index_tensor("value", value, device)
    if slots.shape[0] < key_len:
        raise InvalidArgumentError(f"{len(slots)} slots for a key of {key_len} tokens")
    if allocator is not None:
        head = slots[:held_len]
        if checked:  # a device read
            check_device_slots("value", head.tolist(), allocator, not_held(head, allocator))
        elif not isinstance(value, torch.Tensor | np.ndarray):  # host values
            check_device_range("value", head.tolist(), allocator)
    return slots


__all__ = [
    "check_row_read_index",
    "device_slot_arg",
    "host_slot_arg",
    "insert_slot_arg",
    "not_held",
]
