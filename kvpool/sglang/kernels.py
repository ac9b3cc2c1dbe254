"""How SGLang's paged allocator reaches its allocation kernels on a CPU.

SGLang's ``paged.py`` launches ``alloc_extend_kernel[(bs,)](...)`` and
``alloc_decode_kernel[(bs,)](...)``, module globals of the loaded (private) module. The loader
replaces each with a :class:`KernelSwitch`: launched the same way, it runs the kernel through
Triton's interpreter (:func:`kvpool.testing.kernel_harness.interpreter.interpreted`:
independent of ``TRITON_INTERPRET`` and of whether triton was imported first), or, inside
:func:`naive_extend`, SGLang's own ``alloc_extend_naive`` with the same arguments (the path
SGLang's NPU allocator and, from 0.5.23, ``use_triton_kernels=False`` take). Everything around
the launch (the need_sort merge, the page count, the refusal) stays SGLang's code.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import Any

import torch

_NAIVE = contextvars.ContextVar("kvpool_sglang_naive_extend", default=False)


@contextlib.contextmanager
def naive_extend() -> Iterator[None]:
    """Within this block, extend launches run SGLang's ``alloc_extend_naive``."""
    token = _NAIVE.set(True)
    try:
        yield
    finally:
        _NAIVE.reset(token)


class KernelSwitch:
    """Stands for a Triton kernel in SGLang's module: ``switch[grid](*args)``. ``free_arg`` is
    the position of the ``free_pages`` argument, ``out_arg`` that of the output."""

    def __init__(
        self,
        kernel: Any,
        free_arg: int,
        out_arg: int,
        naive: Callable[..., None] | None = None,
    ) -> None:
        self.kernel = kernel
        self.free_arg = free_arg
        self.out_arg = out_arg
        self.naive = naive

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        if self.naive is not None and _NAIVE.get():
            return self._naive_launch
        launch: Callable[..., None] = self.kernel[grid]

        def padded_launch(*args: Any) -> None:
            # SGLang <= 0.5.22 launches before it checks that enough pages are free and then
            # returns None. On a GPU the kernel's reads past free_pages fetch garbage that is
            # discarded; in the CPU interpreter they would read unmapped memory. Hand the
            # kernel a copy padded with page id 0 (never a free page) past the real entries:
            # every read SGLang keeps is inside the real part, so results are unchanged.
            free = args[self.free_arg]
            pad = args[self.out_arg].numel() + 1  # at most one new page per output slot
            padded = torch.cat((free, free.new_zeros(pad)))
            launch(*args[: self.free_arg], padded, *args[self.free_arg + 1 :])

        return padded_launch

    def _naive_launch(
        self,
        prefix_lens: Any,
        seq_lens: Any,
        last_loc: Any,
        free_pages: Any,
        out_indices: Any,
        bs_upper: int,
        page_size: int,
    ) -> None:
        assert self.naive is not None
        ceil = (seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size
        if int(ceil.sum()) > len(free_pages):
            # SGLang <= 0.5.22 launches before checking the page count and returns None after it;
            # the naive path would index past free_pages here (the NPU allocator checks first),
            # so leave out_indices unwritten: the allocation is refused either way.
            return
        self.naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, "cpu")


def route_naive_extend(impl: Any) -> None:
    """Every ``alloc_extend`` call on ``impl`` (a paged allocator of a release without
    ``use_triton_kernels``) runs inside :func:`naive_extend`: an instance attribute wrapping the
    class's method, so that SGLang's own callers (its scheduler glue, its SWA allocator's
    ``alloc_extend``) take the naive path too, not only kvpool's adapter. Idempotent."""
    bound = impl.alloc_extend
    if getattr(bound, "_kvpool_naive", False):
        return

    def alloc_extend(*args: Any, **kwargs: Any) -> Any:
        with naive_extend():
            return bound(*args, **kwargs)

    alloc_extend._kvpool_naive = True  # type: ignore[attr-defined]
    impl.alloc_extend = alloc_extend


def install_interpreted(module: Any, name: str) -> None:
    """Replace Triton kernel ``name`` of SGLang's loaded ``module`` by its interpreter launch
    (idempotent): ``module.name[grid](*args)`` then runs on CPU tensors."""
    from kvpool.testing.kernel_harness.interpreted import interpreted

    kernel = module.__dict__[name]
    if not getattr(kernel, "_kvpool_interpreted", False):
        launch = interpreted(kernel)
        launch._kvpool_interpreted = True
        module.__dict__[name] = launch


def install_kernel_switches(paged: Any) -> None:
    """Replace the kernels of SGLang's loaded ``paged`` module by switches (idempotent)."""
    from kvpool.testing.kernel_harness.interpreted import interpreted

    naive = paged.__dict__.get("alloc_extend_naive")
    for name, free_arg, fallback in (
        ("alloc_extend_kernel", 3, naive),
        ("alloc_decode_kernel", 2, None),
    ):
        kernel = paged.__dict__.get(name)
        if kernel is not None and not isinstance(kernel, KernelSwitch):
            switch = KernelSwitch(interpreted(kernel), free_arg, free_arg + 1, fallback)
            setattr(paged, name, switch)


__all__ = [
    "KernelSwitch",
    "install_interpreted",
    "install_kernel_switches",
    "naive_extend",
    "route_naive_extend",
]
