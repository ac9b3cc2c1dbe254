"""Launch boilerplate shared by the Triton kernels of :mod:`kvpool.kernels`.

Every kernel module imports ``tl`` from here (``None`` without triton: the kernel sources stay
importable, only their launch needs triton) and launches through :func:`launch`, which skips
empty batches and sizes the 1-D grid, and hands it its inputs laid out as it addresses them
(:func:`dense`). :func:`exclusive_cumsum` is the device-side prefix sum
the kernels take as input so that their programs are independent.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.constants import ceil_div

try:
    import triton.language as tl
except ImportError:  # the kernel sources stay importable; only their launch needs triton
    tl = None

__all__ = ["dense", "exclusive_cumsum", "launch", "tl"]


def launch(kernel: Any, bs: int, per_program: int, *args: object, **constexprs: object) -> None:
    """Run ``kernel[grid](*args, **constexprs)`` with one program per ``per_program`` requests
    (``grid = ceil(bs / per_program)``); nothing for an empty batch (``bs == 0``), whose zero
    programs could not write anything and whose empty operands may be refused at launch."""
    if bs == 0:
        return
    kernel[(ceil_div(bs, per_program),)](*args, **constexprs)


def exclusive_cumsum(x: torch.Tensor) -> torch.Tensor:
    """int64 exclusive prefix sum of 1-D ``x`` on its device: ``out[b] = sum(x[:b])``."""
    x = x.to(torch.int64)
    return torch.cumsum(x, 0) - x


def dense(t: torch.Tensor) -> torch.Tensor:
    """Input ``t`` laid out as the kernels address it (entry ``i`` at ``ptr + i``; a table's
    column ``j`` at ``row + j``, any row stride): ``t`` itself, or a contiguous copy of a
    strided view. Only for inputs; outputs are written in place and must already be laid out
    so (the wrappers check it, :mod:`kvpool.kernels.checks`)."""
    if t.dim() == 2:
        return t if t.shape[1] <= 1 or t.stride(1) == 1 else t.contiguous()
    return t if t.is_contiguous() else t.contiguous()
