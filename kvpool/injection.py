"""Component injection: how a memory manager takes a component object or a factory for it.

Both twins' ``MemoryManager`` accept ``req_to_token_pool``, ``token_to_kv_pool_allocator``,
``tree_cache`` and ``kv_cache``, each as a ready object, a factory, or None (build the twin's own
from the :class:`~kvpool.config.PoolConfig`). Every part of the manager then holds the ONE
object: a tree cache is built over the injected pool and allocator, and an injected tree cache
that holds another allocator or pool is refused (patching one reference but not the other would
otherwise fail silently). Torch-free: the reference uses it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.errors import ConfigError

MARKERS = {
    "req_to_token_pool": "available_size",
    "token_to_kv_pool_allocator": "available_size",
    "tree_cache": "evictable_size",
    "kv_cache": "set_kv_buffer",
}
"""A method every object of the component has: what tells an object from a factory."""


def resolve(name: str, given: Any, default: Callable[[], Any], *factory_args: Any) -> Any:
    """``given`` itself when it is a component object (it has the method :data:`MARKERS`
    names), ``given(*factory_args)`` when it is any other callable, ``default()`` when None.
    ConfigError for anything else."""
    if given is None:
        return default()
    if hasattr(given, MARKERS[name]):
        return given
    if callable(given):
        return given(*factory_args)
    raise ConfigError(f"{name} must be a component, a factory or None, got {given!r}")


def check_shared(tree_cache: Any, req_to_token_pool: Any, allocator: Any) -> None:
    """ConfigError when ``tree_cache`` holds a pool or allocator other than the manager's."""
    for attr, mine in (
        ("req_to_token_pool", req_to_token_pool),
        ("token_to_kv_pool_allocator", allocator),
    ):
        theirs = getattr(tree_cache, attr, mine)
        if theirs is not mine:
            raise ConfigError(
                f"the tree cache holds its own {attr}, not the manager's: inject the same "
                f"object into both (or inject only the {attr} and let the manager build the tree)"
            )


__all__ = ["check_shared", "resolve"]
