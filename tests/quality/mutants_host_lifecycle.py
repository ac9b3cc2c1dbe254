"""Seeded host-tier bugs on the lifecycle path: :data:`HOST_LIFECYCLE_MUTANTS`.

Each patch takes one built :class:`kvpool.optimized.lifecycle.memory_manager.MemoryManager` with the
host tier (``enable_hierarchical_cache``) and re-creates, on that instance only, a bug of the
request lifecycle around host memory; the lifecycle machine hunts it
(:func:`kvpool.testing.quality.hunt`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvpool.testing.quality import Mutant, need, wrap


def abort_frees_loading_prefix(mm: Any) -> None:
    """Aborting a waiting request whose prefix is being loaded back from host memory frees the
    restored node's device slots, as if the request owned them: the tree keeps naming them, so
    they are free and held at once (the next allocation hands them out twice)."""
    need(mm, "abort", "tree_cache", "token_to_kv_pool_allocator")

    def make(orig: Any) -> Callable[[str], None]:
        def abort(rid: str) -> None:
            req = mm.reqs.get(rid)
            loading = getattr(mm.tree_cache, "ongoing_load_back", {})
            node = None if req is None or req.state != "waiting" else req.last_node
            orig(rid)
            if node is not None and any(n is node for n in loading.values()):
                mm.token_to_kv_pool_allocator.free(node.value)  # the tree still holds them

        return abort

    wrap(mm, "abort", make)


_HOST = {
    "disable_radix_cache": False,
    "enable_hierarchical_cache": True,
    "hicache_write_policy": "write_back",
    "hicache_ratio": 2.0,
    "hicache_load_back_threshold": 0,
}
_LOAD_BACK = ("new_req", "twin_req", "extend", "finish", "evict", "match_prefix", "abort")

HOST_LIFECYCLE_MUTANTS: tuple[Mutant, ...] = (
    Mutant("abort-frees-loading-prefix",
           "an abort with a load-back in flight frees the restored device slots the tree holds",
           ("INV-HOST-DEVICE-ACCOUNTING",), abort_frees_loading_prefix, (1, 2), _HOST,
           _LOAD_BACK),
)  # fmt: skip


__all__ = ["HOST_LIFECYCLE_MUTANTS", "abort_frees_loading_prefix"]
