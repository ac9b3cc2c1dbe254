"""Host-side helpers of :mod:`kvpool.kernels`: host copies of lengths for the torch fallbacks,
and the ``.tolist()`` / write-back steps of the python backend.

The torch fallbacks plan their output on the host when they have host copies of the
per-request lengths (:data:`HostLens`); CPU tensors are their own host copies
(:func:`host_copy`). The python backend runs each kernel's pure reference over lists: it reads
only the batch's rows of a request table (:func:`batch_rows`) and writes results back in place
(:func:`copy_back`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import torch

HostLens = torch.Tensor | Sequence[int]
"""A host copy of per-request lengths: a CPU tensor or a list of ints (tokens)."""

Int64Array = npt.NDArray[np.int64]
"""A 1-D host plan array (slots, positions or request indices)."""


def host_copy(tensor: torch.Tensor, given: HostLens | None) -> HostLens | None:
    """The host copy of ``tensor``'s lengths: ``given``, else ``tensor`` itself when it lives on
    the CPU, else None (only the device has them)."""
    if given is None and tensor.device.type == "cpu":
        return tensor
    return given


def host_array(values: HostLens | Int64Array) -> Int64Array:
    """``values`` as a 1-D int64 numpy array (a view, no copy, of a CPU int64 tensor or of an
    int64 array)."""
    if isinstance(values, torch.Tensor):
        if values.dtype is not torch.int64 or values.device.type != "cpu":
            values = values.to("cpu", torch.int64)
        # an int64 tensor never requires grad: numpy() needs no detach()
        return values.numpy() if values.dim() == 1 else values.numpy().reshape(-1)
    return np.asarray(values, dtype=np.int64).reshape(-1)


def page_opening_requests(seq_lens_cpu: HostLens | Int64Array, page_size: int) -> Int64Array:
    """Indices (batch order) of the requests whose new token, at position ``S - 1``, opens a
    page: ``(S - 1) % page_size == 0``, i.e. ``S & (ps - 1) == 1 & (ps - 1)`` for a power of two
    ``page_size`` (every request when ``page_size == 1``). From host copies: no device read."""
    mask = page_size - 1
    opens: Int64Array = np.nonzero((host_array(seq_lens_cpu) & mask) == (1 & mask))[0]
    return opens


def to_device(a: Int64Array, device: torch.device) -> torch.Tensor:
    """A host plan array as a tensor on ``device`` (shared memory on the CPU)."""
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)


def batch_rows(req_to_token: torch.Tensor, rows: Sequence[int]) -> dict[int, list[int]]:
    """Row id -> that row of ``req_to_token`` as a list of slots, for the batch's ``rows`` only
    (no need to copy the whole table to the host)."""
    return {r: req_to_token[r].tolist() for r in set(rows)}


def optional_list(t: torch.Tensor | None) -> list[int] | None:
    """``t.tolist()``, or None for an absent optional operand (``kv_start_idx``)."""
    return None if t is None else t.tolist()


def copy_back(out: torch.Tensor, values: list[int] | list[list[int]]) -> None:
    """Overwrite all of ``out`` with host ``values`` (same number of entries, any shape)."""
    out.copy_(torch.tensor(values, dtype=out.dtype).reshape(out.shape))
