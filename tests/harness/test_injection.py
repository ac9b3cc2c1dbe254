"""Both twins' managers take injected components, and every part holds the one object."""

from __future__ import annotations

from typing import Any

import pytest

from kvpool.config import PoolConfig
from kvpool.errors import ConfigError
from kvpool.optimized.lifecycle.memory_manager import MemoryManager as OptimizedManager
from kvpool.reference.lifecycle.memory_manager import MemoryManager as ReferenceManager
from kvpool.testing.implementations import optimized_implementation, reference_implementation

CONFIG = PoolConfig(size=32, page_size=2, req_pool_size=3, max_context_len=16)
TWINS = [(ReferenceManager, reference_implementation), (OptimizedManager, optimized_implementation)]


class Counting:
    """Wraps an allocator and counts the frees that reach it."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.frees = inner, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def free(self, free_index: Any) -> None:
        self.frees += 1
        self.inner.free(free_index)


@pytest.mark.parametrize(("manager", "impl"), TWINS)
def test_injected_allocator_object_is_the_one_every_part_uses(manager: Any, impl: Any) -> None:
    make = impl().allocator
    alloc = Counting(make(CONFIG))
    mm = manager(CONFIG, token_to_kv_pool_allocator=alloc)
    assert mm.token_to_kv_pool_allocator is alloc
    assert mm.tree_cache.token_to_kv_pool_allocator is alloc
    mm.new_req("a", [1, 2, 3, 4, 5])
    mm.extend(["a"])
    mm.finish(["a"])
    assert alloc.frees > 0  # the tree cache freed the unaligned tail through the one object


@pytest.mark.parametrize(("manager", "impl"), TWINS)
def test_factories_are_called_with_the_config_and_the_shared_pools(manager: Any, impl: Any) -> None:
    parts = impl()
    seen: list[tuple[Any, ...]] = []

    def tree(config: PoolConfig, pool: Any, alloc: Any) -> Any:
        seen.append((config, pool, alloc))
        return parts.radix_cache(config, pool, alloc)

    mm = manager(CONFIG, req_to_token_pool=parts.req_to_token_pool, tree_cache=tree)
    assert seen == [(CONFIG, mm.req_to_token_pool, mm.token_to_kv_pool_allocator)]
    assert mm.tree_cache.req_to_token_pool is mm.req_to_token_pool


@pytest.mark.parametrize(("manager", "impl"), TWINS)
def test_a_tree_over_another_allocator_is_refused(manager: Any, impl: Any) -> None:
    parts = impl()
    other = parts.allocator(CONFIG)
    stray = parts.radix_cache(CONFIG, parts.req_to_token_pool(CONFIG), other)
    with pytest.raises(ConfigError, match=r"token_to_kv_pool_allocator|req_to_token_pool"):
        manager(CONFIG, tree_cache=stray)
    with pytest.raises(ConfigError):
        manager(CONFIG, kv_cache=42)
