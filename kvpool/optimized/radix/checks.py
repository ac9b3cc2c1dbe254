"""The twin's checks on slots a prefix tree will own (a tensor, an array or a list).

:func:`tree_slots` mirrors what the reference's ``insert`` checks
(:func:`kvpool.reference.radix_key.check_tree_slots` and
:func:`kvpool.reference.radix.checks.check_distinct`): a 1-D integer argument (metadata, both
modes), at least one slot per token, every slot inside the pool and not slot 0, no slot named
twice. The range and duplicate checks read the values: they run in checked mode for a tensor
(a device read, README "Checked mode") and always for host values (a list or an array, whose
values the twin reads on the host anyway).
"""

from __future__ import annotations

import torch

from kvpool.errors import DoubleFreeError, InvalidArgumentError
from kvpool.optimized.index_args import has_repeats, index_tensor
from kvpool.optimized.radix_key import check_tree_range
from kvpool.reference.radix.checks import check_row_read_len


def check_distinct_slots(slots: torch.Tensor) -> None:
    """No slot named twice (DoubleFreeError naming the repeated slots): a tree owning one slot
    in two places frees it twice at eviction. Reads the values (checked mode)."""
    if slots.numel() < 2:
        return
    host = slots.is_cpu and slots.dtype in (torch.int64, torch.int32)  # a NumPy view
    if host and not has_repeats(slots.numpy()):  # no launch when nothing repeats
        return
    values, counts = torch.unique(slots, return_counts=True)
    if int(counts.max()) > 1:
        raise DoubleFreeError("slots named twice in one insert", values[counts > 1].tolist())


def check_slots_held(alloc: object, slots: torch.Tensor) -> None:
    """Checked mode (a device read of the allocator's free-page mask): every slot allocated,
    as :func:`kvpool.reference.radix.checks.check_held` (InvalidArgumentError). An allocator
    without a mask (unchecked, or a stub) is not asked."""
    mask = getattr(alloc, "_free_mask", None)
    if mask is None or not slots.numel():
        return
    if mask.is_cpu and slots.is_cpu and slots.dtype in (torch.int64, torch.int32):
        # the same gather through NumPy views (an index outside the mask raises IndexError)
        pages = slots.numpy() // getattr(alloc, "page_size", 1)
        if not mask.numpy()[pages].any():
            return
    loose = mask[slots // getattr(alloc, "page_size", 1)]
    if bool(loose.any()):
        raise InvalidArgumentError(f"slots not allocated: {slots[loose][:8].tolist()}")


def tree_slots(
    value: object, num_tokens: int, device: torch.device, checked: bool, limit: int | None
) -> torch.Tensor:
    """``value`` as an int64 tensor on ``device``, checked as the module docstring says for
    a key of ``num_tokens`` tokens (InvalidArgumentError for fewer slots than tokens)."""
    host = not isinstance(value, torch.Tensor)
    if isinstance(value, torch.Tensor) and value.dim() == 1 and value.numel() == 0:
        slots = torch.empty(0, dtype=torch.int64, device=device)  # no slot: any dtype will do
    else:
        slots = index_tensor("value", value, device)
    if slots.shape[0] < num_tokens:
        raise InvalidArgumentError(f"{slots.shape[0]} slots for a key of {num_tokens} tokens")
    if checked or host:
        owned = slots[:num_tokens]
        check_tree_range(owned, limit)
        check_distinct_slots(owned)
    return slots


def row_read_arg(row_read: object, stop: int, device: torch.device) -> torch.Tensor | None:
    """A caller's read of a request's row (None: no read): a 1-D integer index argument of
    ``stop`` columns (slots; metadata, both modes), as an int64 tensor on ``device``."""
    if row_read is None:
        return None
    if isinstance(row_read, torch.Tensor) and row_read.dtype is torch.int64 and row_read.dim() == 1:
        kv = row_read  # the lifecycle's batch read: taken as it is (a view, no launch)
    else:
        kv = index_tensor("row_read", row_read, device)
    check_row_read_len(kv.shape[0], stop)
    return kv


__all__ = ["check_distinct_slots", "check_slots_held", "row_read_arg", "tree_slots"]
