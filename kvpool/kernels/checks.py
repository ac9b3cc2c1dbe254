"""The metadata contract of :mod:`kvpool.kernels`: what every public wrapper checks before any
backend runs (torch, python, Triton's interpreter, compiled Triton, registered ones).

Checked here, from tensor metadata only (shape, dtype, device, strides; never a device read,
never a sync, no ``.item()`` / ``.tolist()``):

- each tensor argument is a ``torch.Tensor`` with the kernel's number of dimensions and one of
  its integer dtypes (:data:`INDEX_DTYPES`: int32 or int64, whatever the size; ``int64`` alone
  for the slots ``alloc_*`` write); an output is laid out as the kernels store into it (1-D:
  contiguous; 2-D: column stride 1, its row stride is passed in). Strided inputs are fine: the
  Triton launches copy them dense first (:func:`kvpool.kernels.launch.dense`);
- every tensor argument lives on one device, and not on ``meta`` (no data to read or write);
- the length relations between arguments that follow from the batch size ``bs`` alone (one
  entry per request, ``bs + 1`` for ``kv_indptr``, at least ``bs`` rows of a block table, empty
  outputs for an empty batch, a table with rows for a non-empty batch), and the lengths of the
  host copies ``prefix_lens_cpu`` / ``seq_lens_cpu``.

Errors: :class:`~kvpool.errors.InvalidArgumentError` for a shape, dtype, layout or length,
naming the kernel, the argument and what it got; :class:`~kvpool.errors.KernelError` for a
device mismatch or a ``meta`` tensor (the kernel cannot run on them, as for a backend that
cannot run). Raised before anything is written. Values (ranges of lengths and row ids, whether
the outputs and ``free_pages`` are long enough for ``sum(S - P)`` tokens, ``v2p`` coverage)
are not read: they stay the caller's job (the allocator and the lifecycle check them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvpool.errors import InvalidArgumentError, KernelError
from kvpool.kernels.host import HostLens, Int64Array

INDEX_DTYPES: frozenset[torch.dtype] = frozenset((torch.int32, torch.int64))
"""Dtypes of lengths, row ids, offsets, slots read, page ids and request tables."""

SLOT_DTYPES: frozenset[torch.dtype] = frozenset((torch.int64,))
"""Dtype of the slots ``alloc_extend`` / ``alloc_decode`` write."""


def _dtypes_text(dtypes: frozenset[torch.dtype]) -> str:
    return " or ".join(sorted(str(d).removeprefix("torch.") for d in dtypes))


def vector(
    op: str,
    name: str,
    t: object,
    dtypes: frozenset[torch.dtype] = INDEX_DTYPES,
    *,
    output: bool = False,
) -> torch.Tensor:
    """``t`` after checking it is a 1-D tensor of ``dtypes``, contiguous when it is an
    ``output`` (InvalidArgumentError naming ``op``, ``name`` and what was given)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1:
        raise InvalidArgumentError(
            f"{op}: {name} must be 1-D (one entry per item), got shape {tuple(t.shape)}"
        )
    if t.dtype not in dtypes:
        raise InvalidArgumentError(
            f"{op}: {name} must have dtype {_dtypes_text(dtypes)}, got {t.dtype}"
        )
    if output and not t.is_contiguous():  # the kernels store entry i at pointer + i
        raise InvalidArgumentError(f"{op}: {name} must be contiguous, got stride {t.stride()}")
    return t


def table(
    op: str,
    name: str,
    t: object,
    dtypes: frozenset[torch.dtype] = INDEX_DTYPES,
    *,
    output: bool = False,
) -> torch.Tensor:
    """``t`` after checking it is a 2-D tensor of ``dtypes``; when it is an ``output``, its
    columns must be adjacent (column stride 1 when it has more than one column; any row
    stride)."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 2:
        raise InvalidArgumentError(
            f"{op}: {name} must be 2-D (rows, columns), got shape {tuple(t.shape)}"
        )
    if t.dtype not in dtypes:
        raise InvalidArgumentError(
            f"{op}: {name} must have dtype {_dtypes_text(dtypes)}, got {t.dtype}"
        )
    if output and t.shape[1] > 1 and t.stride(1) != 1:  # the kernels store column j at row + j
        raise InvalidArgumentError(
            f"{op}: {name} must have column stride 1, got strides {t.stride()}"
        )
    return t


def length(op: str, name: str, t: torch.Tensor, expected: int, what: str) -> None:
    """InvalidArgumentError unless 1-D ``t`` has ``expected`` entries (``what``: why)."""
    if t.shape[0] != expected:
        raise InvalidArgumentError(
            f"{op}: {name} has {t.shape[0]} entries, expected {expected} ({what})"
        )


def batch_lengths(op: str, bs_name: str, bs: int, **tensors: torch.Tensor) -> None:
    """InvalidArgumentError unless every 1-D tensor has ``bs`` entries, as ``bs_name``."""
    for name, t in tensors.items():
        if t.numel() != bs:  # 1-D: numel() is the length, and cheaper than shape[0]
            raise InvalidArgumentError(
                f"{op}: {name} has {t.shape[0]} entries but {bs_name} has {bs} (one per request)"
            )


def empty_with_batch(op: str, bs: int, **tensors: torch.Tensor) -> None:
    """An empty batch writes and reads nothing: its flat per-token tensors must be empty."""
    if bs == 0:
        for name, t in tensors.items():
            if t.numel():
                raise InvalidArgumentError(
                    f"{op}: the batch is empty but {name} has {t.numel()} entries "
                    f"(its length is the batch's token total, 0)"
                )


def table_rows(op: str, name: str, t: torch.Tensor, bs: int) -> None:
    """A non-empty batch reads or writes rows of ``t``: it must have some."""
    if bs and t.shape[0] == 0:
        raise InvalidArgumentError(
            f"{op}: {name} has shape {tuple(t.shape)}, no row for a batch of {bs} requests"
        )


def same_device(op: str, **tensors: torch.Tensor | None) -> None:
    """KernelError unless every given tensor (None: absent optional operand) is on one device,
    and that device holds data (not ``meta``)."""
    for t in tensors.values():
        if t is not None and not t.is_cpu:
            break
    else:  # all on the CPU: the common host case, without comparing torch.device objects
        return
    first_name = ""
    first: torch.device | None = None
    for name, t in tensors.items():
        if t is None:
            continue
        d = t.device
        if first is None:
            first_name, first = name, d
        elif d != first:
            raise KernelError(
                f"{op}: tensors on different devices: {first_name} on {first}, {name} on {d}"
            )
    if first is not None and first.type == "meta":
        raise KernelError(f"{op}: tensors on the meta device hold no data to run on")


def host_lens(op: str, name: str, values: HostLens | None, bs: int) -> None:
    """A host copy of per-request lengths (None: not given): a 1-D integer CPU tensor or a
    sequence, with ``bs`` entries. Only its metadata and ``len`` are read."""
    if values is None:
        return
    if type(values) is list:  # the common case first: an ABC isinstance costs a microsecond
        n = len(values)
    elif isinstance(values, torch.Tensor):
        if not values.is_cpu:
            raise InvalidArgumentError(
                f"{op}: {name} is a host copy and must be on the CPU, got device {values.device}"
            )
        n = vector(op, name, values).numel()
    elif isinstance(values, Sequence | np.ndarray):
        n = len(values)
    else:
        raise InvalidArgumentError(
            f"{op}: {name} must be a CPU tensor or a sequence of ints, got {type(values).__name__}"
        )
    if n != bs:
        raise InvalidArgumentError(
            f"{op}: {name} has {n} entries but the batch has {bs} (one per request)"
        )


def page_indices(op: str, name: str, values: Int64Array | None, bs: int) -> None:
    """``opens_cpu``-like host indices (None: not given): a 1-D integer numpy array of at most
    ``bs`` entries."""
    if values is None:
        return
    if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "iu":
        shape = getattr(values, "shape", None)
        raise InvalidArgumentError(
            f"{op}: {name} must be a 1-D integer numpy array, got {type(values).__name__} "
            f"of shape {shape}"
        )
    if values.size > bs:
        raise InvalidArgumentError(
            f"{op}: {name} has {values.size} entries, more than the batch's {bs} requests"
        )
