"""Deliberately broken memory managers for the harness's own tests (importable as
``tests.harness.buggy_impl:FACTORY`` by ``kvpool verify --impl`` and by subprocesses)."""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.config import PoolConfig
from kvpool.reference.lifecycle.memory_manager import MemoryManager


def leaky_factory(config: PoolConfig) -> MemoryManager:
    """The reference, except that every free of several slots forgets its last slot."""
    manager = MemoryManager(config)
    allocator = manager.token_to_kv_pool_allocator
    original = allocator.free

    def free(slots: Sequence[int]) -> None:
        kept = list(slots)
        original(kept[:-1] if len(kept) > 1 else kept)

    allocator.free = free  # type: ignore[method-assign, assignment]
    return manager


def reference_copy(config: PoolConfig) -> MemoryManager:
    """A correct third-party implementation (the reference itself)."""
    return MemoryManager(config)
