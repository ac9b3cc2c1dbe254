"""A candidate whose allocator runs a module-level ``@triton.jit`` kernel (compiled at import,
as users write them): it runs on a CPU only when ``TRITON_INTERPRET=1`` is set before the
import, which ``kvpool verify --interpret`` does in its workers."""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

from kvpool.config import PoolConfig
from kvpool.testing.bundle import Implementation
from kvpool.testing.implementations import reference_implementation


@triton.jit  # type: ignore[untyped-decorator]
def _expand_pages(pages, out, PAGE_SIZE: tl.constexpr):  # type: ignore[no-untyped-def]
    i = tl.program_id(0)
    page = tl.load(pages + i)
    offs = tl.arange(0, PAGE_SIZE)
    tl.store(out + i * PAGE_SIZE + offs, page * PAGE_SIZE + offs)


class _KernelAlloc:
    """The reference allocator; ``alloc`` expands its pages to slots with the kernel."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def alloc(self, need_size: int) -> Any:
        slots = self._inner.alloc(need_size)
        if not slots:
            return slots
        ps = self._inner.page_size
        pages = torch.tensor([s // ps for s in slots[::ps]], dtype=torch.int64)
        out = torch.empty(len(slots), dtype=torch.int64)
        _expand_pages[(pages.numel(),)](pages, out, PAGE_SIZE=ps)
        return out.tolist()


def kernel_candidate() -> Implementation:
    make = reference_implementation().allocator
    assert make is not None

    def allocator(config: PoolConfig) -> Any:
        return _KernelAlloc(make(config))

    return Implementation("triton-candidate", allocator=allocator)
