"""The optimized twin's storage prefetches into the host tier: a mixin of ``HiRadixCache``.

Same steps, results and errors as :mod:`kvpool.reference.hicache.prefetch` (see its docstring);
host slots and stored tags are int64 tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.hicache.cache_controller import PrefetchOperation
from kvpool.optimized.radix_key import RadixKey
from kvpool.snapshot import PrefetchSnapshot
from kvpool.tags import kv_tags


class HiRadixPrefetch:
    """The storage-prefetch methods of ``HiRadixCache``."""

    page_size: int
    cache_controller: Any
    token_to_kv_pool_host: Any
    prefetch_threshold: int
    enable_storage: bool
    clock: Any
    root_node: Any
    _ck: Any
    _matched: Any
    _split: Any
    _new_node: Any
    _num_nodes: int
    device: torch.device
    evict_host: Any

    def reset_prefetch(self) -> None:
        """Forget every prefetch (frees nothing)."""
        self.ongoing_prefetch: dict[str, tuple[Any, RadixKey, PrefetchOperation]] = {}

    def prefetch_from_storage(
        self, req_id: str, last_host_node: Any, new_input_tokens: list[int]
    ) -> bool:
        """Start a prefetch of ``new_input_tokens`` (page-aligned) below ``last_host_node``;
        returns whether it started."""
        if req_id in self.ongoing_prefetch:
            raise InvalidArgumentError(f"request {req_id!r} already prefetches")
        tokens = [int(t) for t in new_input_tokens]
        tokens = tokens[: floor_align(len(tokens), self.page_size)]
        if not self.enable_storage or not tokens or len(tokens) < self.prefetch_threshold:
            return False
        path: list[int] = []
        cur = last_host_node
        while cur.parent is not None:
            path = cur.arr.tolist() + path
            cur = cur.parent
        tags = kv_tags(path + tokens, last_host_node.key.extra_key)[len(path) :]
        last_host_node.protect_host()
        key = RadixKey(tokens, last_host_node.key.extra_key)
        op = self.cache_controller.prefetch(req_id, torch.tensor(tags, dtype=torch.int64))
        self.ongoing_prefetch[req_id] = (last_host_node, key, op)
        return True

    def _revoke_pending_prefetch(self, req_id: str) -> None:
        info = self.ongoing_prefetch.pop(req_id, None)
        if info is not None:
            info[0].release_host()

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """Storage holds the first ``hit_tokens`` tokens: reserve host slots or revoke."""
        info = self.ongoing_prefetch.get(req_id)
        if info is None or info[2].host_indices is not None:
            return False
        _, key, op = info
        hit = floor_align(min(max(hit_tokens, 0), len(key)), self.page_size)
        if hit < self.prefetch_threshold or hit == 0 or op.terminated:
            self._revoke_pending_prefetch(req_id)
            return False
        host = self.token_to_kv_pool_host
        host_indices = host.alloc(hit)
        if host_indices is None:
            self.evict_host(hit)
            host_indices = host.alloc(hit)
        if host_indices is None:
            avail = floor_align(host.available_size(), self.page_size)
            hit = min(hit, avail)
            if hit >= self.prefetch_threshold and hit > 0:
                host_indices = host.alloc(hit)
        if host_indices is None:
            self._revoke_pending_prefetch(req_id)
            return False
        op.storage_hit_count = hit
        op.host_indices = host_indices.clone()
        self.cache_controller.prefetch_buffer.append(op)
        return True

    def check_prefetch_progress(self, req_id: str) -> bool:
        """End ``req_id``'s prefetch now (best effort); see the reference."""
        info = self.ongoing_prefetch.get(req_id)
        if info is None:
            return True
        last_host_node, key, op = info
        if op.host_indices is None:
            self.cache_controller.terminate_prefetch(op)
            self._revoke_pending_prefetch(req_id)
            return True
        completed = self.cache_controller.terminate_prefetch(op)
        written = op.host_indices[:completed]
        matched = self._insert_helper_host(last_host_node, key[:completed], written)
        self.token_to_kv_pool_host.free(op.host_indices[:matched])
        last_host_node.release_host()
        del self.ongoing_prefetch[req_id]
        return True

    def release_aborted_request(self, rid: str) -> None:
        """An aborted request's prefetch: stop it, queue its fetched host slots for release."""
        info = self.ongoing_prefetch.get(rid)
        if info is None:
            return
        last_host_node, _, op = info
        if op.host_indices is None:
            self.cache_controller.terminate_prefetch(op)
            self._revoke_pending_prefetch(rid)
            return
        completed = self.cache_controller.terminate_prefetch(op)
        last_host_node.release_host()
        del self.ongoing_prefetch[rid]
        self.cache_controller.append_host_mem_release(op.host_indices[:completed])

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        """The worker of ``req_id``'s transfer runs ``num_pages`` more pages."""
        if num_pages < 0:
            raise InvalidArgumentError(f"num_pages must be >= 0, got {num_pages}")
        return int(self.cache_controller.prefetch_io(req_id, num_pages))

    def drain_storage_control_queues(self) -> int:
        """Free the host slots queued for release; returns how many."""
        return int(self.cache_controller.drain_release())

    def _insert_helper_host(self, node: Any, key: RadixKey, host_value: torch.Tensor) -> int:
        """Insert ``key`` below ``node`` as host-only content; returns the tokens already in the
        tree (their host slots are the caller's to free)."""
        now = self.clock()
        node.last_access_time = now
        stop = len(key)
        pos = 0
        while pos < stop:
            child = node.children.get(self._ck(node, key, pos))
            if child is None:
                break
            child.last_access_time = now
            n = self._matched(child, key, pos, stop)
            pos += n
            if n < len(child):
                child = self._split(child, n)
            node = child
        if pos < stop:
            leaf_key = RadixKey.from_array(key.array[pos:stop], key.extra_key)
            empty = torch.empty(0, dtype=torch.int64, device=self.device)
            leaf = self._new_node(leaf_key, empty, node, now, node.priority)
            leaf.evicted = True
            leaf.host_value = host_value[pos:].clone()
            leaf.child_key = self._ck(node, key, pos)
            node.children[leaf.child_key] = leaf
            self._num_nodes += 1
        return pos

    def prefetch_snapshots(self) -> tuple[PrefetchSnapshot, ...]:
        """The ongoing prefetches, by request id."""
        out = []
        for rid in sorted(self.ongoing_prefetch):
            node, key, op = self.ongoing_prefetch[rid]
            hosts = () if op.host_indices is None else tuple(op.host_indices.tolist())
            out.append(PrefetchSnapshot(rid, node.node_id, len(key), hosts,
                                        op.completed_tokens, op.terminated))  # fmt: skip
        return tuple(out)
