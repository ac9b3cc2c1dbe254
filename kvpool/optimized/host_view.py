"""Host views of the twin's state tensors: snapshot reads, and the stores checked mode makes.

Snapshots are verification reads, not hot paths. Checked mode reads the host anyway, so on a CPU
its stores go through NumPy views too (:func:`store_at`: no tensor operation to dispatch).

A snapshot reads each state tensor once: a CPU tensor of a dtype numpy has is viewed in place
(``Tensor.numpy``: no copy, no torch dispatch per piece), then sliced and gathered in numpy and
converted to Python ints once per piece. A tensor on another device, or of a dtype numpy lacks
(bfloat16, fp8), is gathered on its device and copied to the host once. The views returned alias
the tensor: callers convert them (``.tolist()``) before the state changes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

# Any: a state tensor may be of any dtype (slots int64, tags float, masks bool)
HostArray = npt.NDArray[Any]
"""A numpy array read from a state tensor (a view of a CPU tensor, or a host copy)."""

_NUMPY_DTYPES: frozenset[torch.dtype] = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.float32,
        torch.float64,
    }
)
"""Torch dtypes ``Tensor.numpy`` supports (the others are widened by torch before the read)."""

_EXACT_INT_LIMIT = float(2**53)
"""Below this magnitude a float64 converts to int64 exactly as ``int()`` does (truncation)."""


def host_array(t: torch.Tensor) -> HostArray:
    """``t`` on the host as numpy: a view for a CPU tensor of a numpy dtype, else one copy (a
    dtype numpy lacks is widened to float64 first, exactly: every torch float fits)."""
    if t.is_cpu and t.dtype in _NUMPY_DTYPES:
        return (t.detach() if t.requires_grad else t).numpy()
    if t.dtype not in _NUMPY_DTYPES:
        t = t.to(torch.float64)
    return t.detach().cpu().numpy()


def host_gather(
    t: torch.Tensor, index: npt.NDArray[np.int64], *rest: int | slice, flat: bool = False
) -> HostArray:
    """``t[index, *rest]`` (``index`` along dim 0, in range; ``rest`` ints or slices for the
    next dims; ``flat``: of ``t`` seen as ``(t.shape[0], -1)``, each row flattened) on the
    host: one numpy gather of the view for a CPU tensor of a numpy dtype (no torch op at all),
    else one gather on the device and one copy."""
    if t.is_cpu and t.dtype in _NUMPY_DTYPES:
        view = (t.detach() if t.requires_grad else t).numpy()
        if flat:
            view = view.reshape(view.shape[0], -1)
        where = (index, *rest)
        taken: HostArray = view[where]
        return taken
    if flat:
        t = t.reshape(t.shape[0], -1)
    key = (torch.from_numpy(index).to(t.device), *rest)
    return host_array(t[key])


_SMALL = 64
"""Below this many values a Python loop converts faster than numpy's checks and casts."""


def float_ints(values: HostArray) -> list[int]:
    """``[int(v) for v in values.astype(float64).tolist()]`` (truncation toward zero; ``int``'s
    errors for NaN or infinity), without a Python call per value when there are many, every one
    finite and exactly representable as int64."""
    flat = values.reshape(-1)
    if flat.size < _SMALL:  # every float numpy lists is a Python float of the same value
        return list(map(int, flat.tolist()))
    wide = flat.astype(np.float64, copy=False)
    if bool(np.maximum.reduce(np.abs(wide)) < _EXACT_INT_LIMIT):
        ints: list[int] = wide.astype(np.int64).tolist()
        return ints
    return list(map(int, wide.tolist()))


def store_at(dst: torch.Tensor, index: torch.Tensor, value: torch.Tensor | int | bool) -> None:
    """``dst[index] = value`` (``index`` a 1-D integer tensor, in range): through NumPy views
    when ``dst`` and ``index`` (and a tensor ``value``) live on the CPU in a NumPy dtype, a tensor
    ``value`` of ``dst``'s dtype (the indexed store refuses another), else the indexed store
    itself."""
    if dst.is_cpu and index.is_cpu and dst.dtype in _NUMPY_DTYPES and index.dtype in _NUMPY_DTYPES:
        if not isinstance(value, torch.Tensor):
            dst.numpy()[index.numpy()] = value
            return
        if value.is_cpu and value.dtype is dst.dtype:
            dst.numpy()[index.numpy()] = value.numpy()
            return
    dst[index] = value


def in_bounds(index: npt.NDArray[np.int64], limit: int) -> bool:
    """Whether every value of ``index`` (int64) lies in ``[0, limit)`` (True when empty): one
    reduction, a negative value being a huge one seen as unsigned."""
    if not index.size:
        return True
    if index.dtype != np.int64:
        index = index.astype(np.int64)
    return bool(np.maximum.reduce(index.view(np.uint64)) < limit)


__all__ = ["HostArray", "float_ints", "host_array", "host_gather", "in_bounds", "store_at"]
