"""The twin's checks on index and length arguments: what an engine passes as a tensor.

An index argument (slots, pages, rows, lengths) is a 1-D tensor of an integer dtype (not
``bool``), a 1-D NumPy integer array, or a sequence of Python integers. Anything else (a float or
bool tensor, a 2-D tensor, ``None``, a number, a string, a list holding floats, bools or ``None``)
is refused with :class:`~kvpool.errors.InvalidArgumentError` naming the argument, before the
caller's first change. These checks read only metadata (dtype, shape) or host values, so they
run in both checked modes; range and ownership checks that read device data stay with checked
mode (README, "Checked mode").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import int_list
from kvpool.optimized.key_match import is_integer_dtype


def index_tensor(name: str, value: object, device: torch.device | str) -> torch.Tensor:
    """``value`` as a 1-D int64 tensor on ``device`` (no copy when it already is one);
    InvalidArgumentError when it is not a 1-D integer index argument (module docstring)."""
    if isinstance(value, torch.Tensor):
        if value.dtype is torch.int64 and value.dim() == 1:  # the usual index: fewer checks
            where = device if isinstance(device, torch.device) else torch.device(device)
            return value if value.device == where else value.to(where, torch.int64)
        if value.dim() != 1 or value.dtype == torch.bool or not is_integer_dtype(value.dtype):
            raise InvalidArgumentError(
                f"{name} must be a 1-D integer tensor, got dtype {value.dtype} and shape "
                f"{tuple(value.shape)}"
            )
        if value.dtype == torch.int64 and value.device == torch.device(device):
            return value
        return value.to(device, torch.int64)
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.dtype.kind not in "iu":
            raise InvalidArgumentError(
                f"{name} must be a 1-D integer array, got dtype {value.dtype} and shape "
                f"{value.shape}"
            )
        return torch.from_numpy(value.astype(np.int64, copy=False)).to(device)
    return torch.tensor(int_list(name, value), dtype=torch.int64, device=device)  # type: ignore[arg-type]


def any_outside(values: torch.Tensor, low: int, high: int) -> bool:
    """Whether any value of the 1-D integer tensor ``values`` lies outside ``[low, high)``:
    read on the host (a view of a CPU tensor, one device read otherwise), as one comparison
    of its extremes instead of several tensor operations."""
    if values.device.type != "cpu":
        return bool(((values < low) | (values >= high)).any())
    if values.numel() <= _SMALL:
        host: list[int] = values.tolist()
        return bool(host) and (min(host) < low or max(host) >= high)
    a = values.numpy()
    return bool(a.size) and (int(a.min()) < low or int(a.max()) >= high)


_SMALL = 64
"""Up to this many values a list's ``min`` / ``max`` (or a set) cost less than NumPy's
reductions (or ``np.unique``)."""


# Any: any integer width (int32 page ids, int64 slots): only equality is read
def has_repeats(values: npt.NDArray[np.integer[Any]]) -> bool:
    """Whether a 1-D host array of integers names some value twice."""
    if values.size <= _SMALL:
        return len(set(values.tolist())) != values.size
    ordered = np.sort(values)  # equal values end up side by side (np.unique's own method)
    return bool((ordered[1:] == ordered[:-1]).any())


def host_ints(name: str, value: object) -> list[int]:
    """``value`` as a list of Python ints (host lengths or columns given as a 1-D integer
    tensor or array, or a sequence of integers); InvalidArgumentError otherwise (the
    module docstring's rules), before the caller's first change. A tensor is read to the host
    (its metadata checked first)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        values: list[int] = index_tensor(name, value, "cpu").tolist()
        return values
    return int_list(name, value)  # type: ignore[arg-type]


__all__ = ["any_outside", "has_repeats", "host_ints", "index_tensor"]
