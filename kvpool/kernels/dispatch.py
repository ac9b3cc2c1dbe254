"""Backend selection for :mod:`kvpool.kernels`.

Every kernel exists four ways, named by backend:

- ``"triton"``: the Triton kernel, compiled (needs triton and CUDA tensors);
- ``"interpret"``: the *same* kernel source run by Triton's interpreter on the host (needs triton,
  not a GPU). The process need not be started with ``TRITON_INTERPRET=1``: kernels are kept as
  plain Python functions and wrapped on demand, once per backend;
- ``"torch"``: a vectorised torch fallback (any device, no device-to-host sync beyond sizes);
- ``"python"``: the pure-Python reference over ``.tolist()``, results written back.

``backend=None`` picks ``"triton"`` for CUDA tensors, else ``$KVPOOL_KERNEL_BACKEND`` when set,
else ``"torch"``. Extra Triton-kernel backends (a checked interpreter, for example) can be added
with :func:`register_kernel_backend`: they receive the kernel's plain function and return an
object launched as ``obj[grid](*args)``, exactly like a ``triton.jit`` kernel.

Importing this module never imports triton; a backend that cannot run raises
:class:`kvpool.errors.KernelError` saying why.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvpool.constants import is_power_of_two
from kvpool.errors import KernelError, PageSizeError

ENV_VAR = "KVPOOL_KERNEL_BACKEND"
"""Environment variable naming the default backend for tensors that are not on CUDA."""

BACKENDS: tuple[str, ...] = ("triton", "interpret", "torch", "python")
"""The built-in backends, fastest first."""

KernelFactory = Callable[[Callable[..., None]], Any]
"""Turns a kernel's plain Python function into a launchable ``obj[grid](*args)`` object."""

_EXTRA_FACTORIES: dict[str, KernelFactory] = {}
_KERNEL_CACHE: dict[tuple[str, Callable[..., None]], Any] = {}


@functools.cache
def triton_installed() -> bool:
    """True when the ``triton`` package can be imported (it is never imported here; looked up
    once per process)."""
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):  # a broken or deliberately blocked installation
        return False


def available_backends() -> tuple[str, ...]:
    """Backends that can run in this process, in :data:`BACKENDS` order, then registered ones."""
    found: list[str] = []
    if triton_installed() and torch.cuda.is_available():
        found.append("triton")
    if triton_installed():
        found.append("interpret")
    found += ["torch", "python"]
    return (*found, *sorted(_EXTRA_FACTORIES))


def register_kernel_backend(name: str, factory: KernelFactory) -> None:
    """Add (or replace) a Triton-kernel backend called ``name``: ``factory(fn)`` must return an
    object launched like a ``triton.jit`` kernel. The built-in names cannot be replaced."""
    if name in BACKENDS:
        raise KernelError(f"backend {name!r} is built in and cannot be replaced")
    _EXTRA_FACTORIES[name] = factory
    for key in [k for k in _KERNEL_CACHE if k[0] == name]:
        del _KERNEL_CACHE[key]


def unregister_kernel_backend(name: str) -> None:
    """Remove a backend added by :func:`register_kernel_backend` (no-op when absent)."""
    _EXTRA_FACTORIES.pop(name, None)
    for key in [k for k in _KERNEL_CACHE if k[0] == name]:
        del _KERNEL_CACHE[key]


def is_kernel_backend(backend: str) -> bool:
    """True when ``backend`` runs the Triton kernel source (compiled, interpreted or registered)."""
    return backend in ("triton", "interpret") or backend in _EXTRA_FACTORIES


def resolve_backend(backend: str | None, *tensors: torch.Tensor) -> str:
    """The backend to run: ``backend`` itself after checking it can run on ``tensors``, or the
    default for ``None`` (see the module docstring). Raises :class:`KernelError` otherwise."""
    if backend is None:
        for t in tensors:
            if t.is_cuda:
                if triton_installed():
                    return "triton"
                break
        backend = os.environ.get(ENV_VAR) or "torch"
        if backend == "torch":
            return backend  # runs on any device
    if backend not in BACKENDS and backend not in _EXTRA_FACTORIES:
        raise KernelError(
            f"unknown kernel backend {backend!r}; known: {(*BACKENDS, *sorted(_EXTRA_FACTORIES))}"
        )
    if backend in ("triton", "interpret") and not triton_installed():
        raise KernelError(f"backend {backend!r} needs the triton package, which is not installed")
    if backend == "triton" and not all(t.is_cuda for t in tensors):
        raise KernelError(
            "backend 'triton' compiles for the GPU and needs CUDA tensors; "
            "use backend='interpret' to run the same kernel on the host"
        )
    return backend


def run_backend(
    backend: str | None,
    args: Sequence[object],
    *,
    kernel: Callable[..., None],
    launch: Callable[..., None],
    torch_impl: Callable[..., None],
    python_impl: Callable[..., None],
) -> None:
    """Run one kernel call on the backend :func:`resolve_backend` picks for the tensors among
    ``args``: ``launch(get_kernel(kernel, name), *args)`` for a Triton-kernel backend, else
    ``torch_impl(*args)`` or ``python_impl(*args)``. Every public kernel function ends here."""
    name = resolve_backend(backend, *(a for a in args if isinstance(a, torch.Tensor)))
    if is_kernel_backend(name):
        launch(get_kernel(kernel, name), *args)
    elif name == "torch":
        torch_impl(*args)
    else:
        python_impl(*args)


def _interpreted(fn: Callable[..., None]) -> Any:
    """Wrap ``fn`` for Triton's interpreter without requiring ``TRITON_INTERPRET=1`` at start."""
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # older or newer layouts: let triton.jit pick the interpreter itself
        import triton

        previous = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            return triton.jit(fn)
        finally:
            if previous is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = previous
    return InterpretedFunction(fn)


def _compiled(fn: Callable[..., None]) -> Any:
    import triton

    previous = os.environ.pop("TRITON_INTERPRET", None)  # a compiled kernel must not interpret
    try:
        return triton.jit(fn)
    finally:
        if previous is not None:
            os.environ["TRITON_INTERPRET"] = previous


def get_kernel(fn: Callable[..., None], backend: str) -> Any:
    """The launchable kernel object for plain kernel function ``fn`` under ``backend`` (cached)."""
    key = (backend, fn)
    if key not in _KERNEL_CACHE:
        if backend == "triton":
            _KERNEL_CACHE[key] = _compiled(fn)
        elif backend == "interpret":
            _KERNEL_CACHE[key] = _interpreted(fn)
        elif backend in _EXTRA_FACTORIES:
            _KERNEL_CACHE[key] = _EXTRA_FACTORIES[backend](fn)
        else:
            raise KernelError(f"backend {backend!r} does not run Triton kernels")
    return _KERNEL_CACHE[key]


def check_page_size(page_size: int) -> None:
    """Kernels tile pages with ``tl.arange(0, page_size)``: it must be a power of two."""
    if not is_power_of_two(page_size):
        raise PageSizeError(f"page_size must be a positive power of two, got {page_size}")


def block_for(page_size: int, minimum: int = 128) -> int:
    """Tokens one loop iteration of a kernel handles: whole pages, at least ``minimum``."""
    return max(page_size, minimum)


def write_back(out: torch.Tensor, values: list[int]) -> None:
    """Copy host ``values`` into the head of 1-D ``out`` (the python backend's last step)."""
    if values:
        out[: len(values)].copy_(torch.tensor(values, dtype=out.dtype))


def nonempty(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a one-element stand-in when ``t`` is empty: the kernels never touch an empty
    operand (every access is masked), but a null pointer may be refused at launch."""
    return t if t.numel() else torch.zeros(1, dtype=t.dtype, device=t.device)
