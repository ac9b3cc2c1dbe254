"""Seeded host-tier bugs (the field bugs of hierarchical caches): :data:`HOST_MUTANTS`.

Each patch takes one built :class:`kvpool.optimized.hicache.hiradix_cache.HiRadixCache` and
re-creates, on that instance only, a bug seen in the field; the ``hiradix_cache`` machine hunts it
(:func:`kvpool.testing.quality.hunt_component`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvpool.testing.quality import ComponentMutant, need, wrap


def prefetch_released_twice(tree: Any) -> None:
    """After a partial prefetch, the abort path queues every reserved host slot for release,
    the unfetched ones included, which the prefetch worker releases as well: two cleanup paths
    free the same host pages."""
    need(tree, "ongoing_prefetch", "cache_controller", "storage_prefetch")

    def release_aborted_request(rid: str) -> None:
        info = tree.ongoing_prefetch.get(rid)
        if info is None:
            return
        node, _, op = info
        if op.host_indices is None:
            tree.cache_controller.terminate_prefetch(op)
            tree.storage_prefetch._revoke_pending_prefetch(rid)
            return
        tree.cache_controller.terminate_prefetch(op)
        node.release_host()
        del tree.ongoing_prefetch[rid]
        tree.cache_controller.append_host_mem_release(op.host_indices)  # not [:completed]

    tree.release_aborted_request = release_aborted_request


def write_back_ack_keeps_device(tree: Any) -> None:
    """Write-back eviction waits for the acknowledgements of the writes it staged but never
    frees the staged nodes' device slots: they stay allocated, held by nobody."""
    need(tree, "host_eviction", "writing_check")
    eviction = tree.host_eviction
    need(eviction, "_flush_staged")

    def flush(staged: list[tuple[Any, torch.Tensor]]) -> None:
        if not staged:
            return
        tree.writing_check(write_back=True)
        for node, _ in staged:
            node.release_host()  # the evict_device of the staged slots is missing
        staged.clear()

    eviction._flush_staged = flush


def evicts_unacked_backup(tree: Any) -> None:
    """Eviction takes a node whose write to host is still in flight as backed up (it has host
    slots): its device copy is freed before the copy completed."""
    need(tree, "host_eviction")
    need(tree.host_eviction, "_device_evictable")
    tree.host_eviction._device_evictable = lambda node: (
        node.lock_ref == 0 or node.write_through_pending_id is not None
    )


def load_back_unpinned(tree: Any) -> None:
    """``load_back`` drops the lock of the restored path at once instead of at the load's
    acknowledgement: until the copy completes, its device slots can be evicted and its host
    pages freed and reused under it."""
    need(tree, "load_back")

    def make(orig: Any) -> Callable[..., Any]:
        def load_back(node: Any, mem_quota: int | None = None) -> Any:
            got = orig(node, mem_quota)
            if got is not None:
                tree.dec_lock_ref(node)
            return got

        return load_back

    wrap(tree, "load_back", make)


HOST_MUTANTS: tuple[ComponentMutant, ...] = (
    ComponentMutant("host-prefetch-double-release", "host pages released by two cleanup paths "
                    "after a partial prefetch", ("INV-HOST-DOUBLE-FREE",),
                    prefetch_released_twice, "hiradix_cache"),
    ComponentMutant("host-write-back-device-leak", "device pages not freed after a write-back "
                    "acknowledgement", ("INV-HOST-DEVICE-ACCOUNTING",),
                    write_back_ack_keeps_device, "hiradix_cache"),
    ComponentMutant("host-evict-unacked", "device KV evicted although its host backup was not "
                    "acknowledged", ("INV-HOST-BACKUP-DONE",), evicts_unacked_backup,
                    "hiradix_cache"),
    ComponentMutant("host-load-unpinned", "a load-back whose host pages are not pinned until "
                    "the load completes", ("INV-HOST-PINNED",), load_back_unpinned,
                    "hiradix_cache"),
)  # fmt: skip
"""The seeded host-tier bugs of the quality suite (``hiradix_cache`` machine)."""

__all__ = [
    "HOST_MUTANTS",
    "evicts_unacked_backup",
    "load_back_unpinned",
    "prefetch_released_twice",
    "write_back_ack_keeps_device",
]
