"""SGLang's host KV pool allocator (``HostKVCache``) behind kvpool's host-pool interface.

:class:`SGLangHostPool` runs SGLang's own ``clear`` / ``alloc`` / ``free`` / ``available_size``
(``mem_cache/pool_host/base.py``) on the CPU, so that they can be compared with kvpool's
``HostKVCache`` (same slots in the same order, same sizes). What is not SGLang's:

- construction: SGLang's ``__init__`` sizes the pool from the device pool and then allocates the
  host buffers (and checks free RAM with psutil); the adapter builds the object without it, from
  a concrete subclass whose buffer methods are empty, and sets ``size``, ``page_size``,
  ``device`` ("cpu"), ``dcp_size`` (1: 0.5.23's decode context parallelism off) and the lock
  itself, then calls SGLang's ``clear``. The sizing formula is kvpool's restatement
  (:func:`kvpool.reference.hicache.memory_pool_host.host_pool_size`), not exercised here;
- errors: SGLang asserts; the adapter turns an ``AssertionError`` of ``alloc`` (a size not a page
  multiple) into :class:`~kvpool.errors.AlignmentError` and of ``free`` (a double free) into
  :class:`~kvpool.errors.DoubleFreeError`; both asserts come before any change (a slot named
  twice in one ``free`` passes SGLang's check, unlike kvpool's, which refuses it);
- content: the adapter holds no tags (its snapshot's ``tags`` is empty).
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from kvpool.errors import AlignmentError, DoubleFreeError
from kvpool.sglang.loader import SGLangModules
from kvpool.snapshot import HostPoolSnapshot

_HOST = "sglang.srt.mem_cache.pool_host.base"


def _concrete(cls: type) -> type:
    """A subclass of SGLang's abstract ``HostKVCache`` whose abstract (buffer) methods are
    empty: the allocator under test never calls them."""
    names: frozenset[str] = getattr(cls, "__abstractmethods__", frozenset())
    return type(f"Kvpool{cls.__name__}", (cls,), {n: lambda *a, **k: None for n in names})


class SGLangHostPool:
    """SGLang's ``HostKVCache`` allocator over ``size`` host slots in pages of ``page_size``."""

    def __init__(self, modules: SGLangModules, size: int, page_size: int) -> None:
        cls = modules.attr(_HOST, "HostKVCache")
        impl: Any = object.__new__(_concrete(cls))
        impl.size, impl.page_size, impl.device, impl.dcp_size = size, page_size, "cpu", 1
        impl.lock = threading.RLock()
        impl.clear()
        self.impl = impl
        self.size, self.page_size = size, page_size

    def clear(self) -> None:
        self.impl.clear()

    def available_size(self) -> int:
        return int(self.impl.available_size())

    def alloc(self, need_size: int) -> torch.Tensor | None:
        try:
            got: torch.Tensor | None = self.impl.alloc(need_size)
        except AssertionError as exc:
            raise AlignmentError(str(exc)) from None
        return got

    def free(self, indices: Any) -> int:
        slots = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        try:
            return int(self.impl.free(slots))
        except AssertionError as exc:
            raise DoubleFreeError(str(exc)) from None

    def snapshot(self) -> HostPoolSnapshot:
        """Free list and released chunks as SGLang holds them (no tags)."""
        released = [int(s) for chunk in self.impl.release_slots for s in chunk.tolist()]
        free = tuple(int(s) for s in self.impl.free_slots.tolist())
        return HostPoolSnapshot(self.size, self.page_size, free, tuple(released))


__all__ = ["SGLangHostPool"]
