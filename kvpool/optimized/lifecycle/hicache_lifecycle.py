"""The host tier inside the request lifecycle (optimized twin).

Mirrors :mod:`kvpool.reference.lifecycle.hicache_lifecycle` step by step; prefixes are int64
tensors.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
from kvpool.optimized.hicache.memory_pool_host import host_pool_for
from kvpool.optimized.radix_key import MatchResult, TreeNode


def build_hiradix_tree(
    config: PoolConfig,
    pool: Any,
    alloc: Any,
    kv_cache: Any,
    clock: Callable[[], float] | None,
) -> HiRadixCache:
    """The manager's ``HiRadixCache``: a host pool of ``hicache_ratio`` times ``kv_cache`` (the
    manager's KV buffers, so transfers copy what the lifecycle computed) and the config's write
    policy and thresholds; the host tier ``Rules.hicache_host_tier`` names (see the
    reference)."""
    host = host_pool_for(kv_cache, config.hicache_ratio)
    rules = config.rules
    return HiRadixCache(pool, alloc, config.page_size, host, False, config.eviction_policy,
                        clock, config.hicache_write_policy, config.hicache_load_back_threshold,
                        config.hicache_prefetch_threshold, config.hicache_storage,
                        rules=rules)  # fmt: skip


class HiCacheLifecycle:
    """The host-tier steps of the lifecycle (see the module docstring)."""

    tree_cache: Any

    def hiradix(self) -> HiRadixCache | None:
        """The tree cache when it has a host tier (it loads back), else None."""
        tree = self.tree_cache
        return tree if hasattr(tree, "init_load_back") else None

    def _admit_prefix(
        self, result: MatchResult, load_back: bool = True
    ) -> tuple[torch.Tensor, TreeNode | None]:
        """The prefix a request takes from ``result``: its device slots, and its last node; when
        the match ends in host memory (and ``load_back``), the restored slots too and the
        restored node."""
        prefix, last = result.device_indices, result.last_device_node
        tree = self.hiradix()
        if tree is None or not load_back:  # other trees' results have no host fields
            return prefix, last
        host_node = result.last_host_node
        if not result.host_hit_length or host_node is None:
            return prefix, last
        loaded, node = tree.init_load_back(host_node)
        return torch.cat([prefix, loaded]), node

    def _wait_for_loads(self) -> None:
        """The forward: issue the queued loads and wait for the content of every load in flight
        (the acknowledgements stay queued)."""
        tree = self.hiradix()
        if tree is None:
            return
        tree.ready_to_load_host_cache()
        cc = tree.cache_controller
        for ack in cc.ack_load_queue:
            cc.complete(ack)

    def _flush_backups(self) -> None:
        """The end of a batch under the unified host tier: issue the queued writes as one
        transfer (SGLang 0.5.23's ``flush_pending_backups``); nothing otherwise."""
        tree = self.hiradix()
        if tree is not None and tree.unified:
            tree.cache_controller.start_writing()

    def _host_tier(self, num_acks: int) -> HiRadixCache:
        tree = self.hiradix()
        if tree is None:
            raise InvalidArgumentError("this memory manager has no host tier")
        if num_acks < 0:
            raise InvalidArgumentError(f"num_acks must be >= 0, got {num_acks}")
        return tree

    def hicache_ack_writes(self, num_acks: int) -> int:
        """The first ``num_acks`` write acknowledgements arrive (``writing_check``): each write's
        node is unlocked and its host copy complete. Returns how many arrived.
        InvalidArgumentError (nothing changed) without a host tier or for ``num_acks < 0``."""
        return int(self._host_tier(num_acks).writing_check(num_acks))

    def hicache_ack_loads(self, num_acks: int) -> int:
        """The queued loads are issued, then the first ``num_acks`` load acknowledgements arrive
        (``loading_check``): content copied, restored nodes unlocked. Returns how many arrived.
        InvalidArgumentError (nothing changed) without a host tier or for ``num_acks < 0``."""
        tree = self._host_tier(num_acks)
        tree.ready_to_load_host_cache()
        return int(tree.loading_check(num_acks))


__all__ = ["HiCacheLifecycle", "build_hiradix_tree"]
