"""Triton kernels of the memory pool, each beside a torch fallback and a pure-Python reference
with the same contract (see specs/kernels.md and DEVELOPERS.md "Kernel API").

Every function writes into preallocated outputs (``get_last_loc`` returns a new tensor) and
takes ``backend``: ``"triton"`` (compiled, CUDA tensors), ``"interpret"`` (the same kernel
through Triton's interpreter on the host), ``"torch"`` (vectorised fallback), ``"python"`` (the
pure reference), or a name added with :func:`register_kernel_backend`. ``None`` picks triton
for CUDA tensors, else ``$KVPOOL_KERNEL_BACKEND``, else torch. Every public function refuses bad
metadata (shapes, dtypes, lengths, devices) before any backend runs
(:mod:`~kvpool.kernels.checks`; InvalidArgumentError, KernelError for devices); values (ranges,
fits) are assumed valid: the callers (the allocators, the lifecycle) check them before launching.

Each kernel module exposes the same layers, for harnesses that test a part in isolation:
``_<name>_kernel`` (the plain kernel function, wrapped per backend), ``<name>_kernel_launch``
(launch of any wrapped form), ``<name>_torch`` and the pure reference. :data:`KERNEL_FUNCTIONS`
maps each public name to its plain kernel function. The plumbing they share lives in
:mod:`~kvpool.kernels.checks` (the metadata contract), :mod:`~kvpool.kernels.dispatch` (backend
choice; ``run_backend`` runs one call), :mod:`~kvpool.kernels.launch` (grid, empty batches,
dense inputs, ``tl``) and :mod:`~kvpool.kernels.host` (host copies of lengths, the python
backend's lists and write-back).
"""

from __future__ import annotations

from collections.abc import Callable

from kvpool.kernels.alloc_decode import _alloc_decode_kernel, alloc_decode
from kvpool.kernels.alloc_extend import _alloc_extend_kernel, alloc_extend
from kvpool.kernels.dispatch import (
    BACKENDS,
    available_backends,
    register_kernel_backend,
    resolve_backend,
    unregister_kernel_backend,
)
from kvpool.kernels.flashinfer_indices import (
    _flashinfer_kv_indices_kernel,
    create_flashinfer_kv_indices,
)
from kvpool.kernels.flashmla_indices import (
    _flashmla_kv_indices_kernel,
    create_flashmla_kv_indices,
    create_flashmla_kv_indices_v2p,
)
from kvpool.kernels.last_loc import _get_last_loc_kernel, get_last_loc
from kvpool.kernels.write_req_to_token import _write_req_to_token_kernel, write_req_to_token

KERNEL_FUNCTIONS: dict[str, Callable[..., None]] = {
    "alloc_extend": _alloc_extend_kernel,
    "alloc_decode": _alloc_decode_kernel,
    "write_req_to_token": _write_req_to_token_kernel,
    "get_last_loc": _get_last_loc_kernel,
    "create_flashinfer_kv_indices": _flashinfer_kv_indices_kernel,
    "create_flashmla_kv_indices": _flashmla_kv_indices_kernel,
    "create_flashmla_kv_indices_v2p": _flashmla_kv_indices_kernel,
}
"""Public kernel name -> its plain (undecorated) Triton kernel function."""

__all__ = [
    "BACKENDS",
    "KERNEL_FUNCTIONS",
    "alloc_decode",
    "alloc_extend",
    "available_backends",
    "create_flashinfer_kv_indices",
    "create_flashmla_kv_indices",
    "create_flashmla_kv_indices_v2p",
    "get_last_loc",
    "register_kernel_backend",
    "resolve_backend",
    "unregister_kernel_backend",
    "write_req_to_token",
]
