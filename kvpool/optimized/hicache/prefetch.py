"""The optimized twin's storage prefetches into the host tier.

Same steps, results and errors as :mod:`kvpool.reference.hicache.prefetch` (see its docstring);
host slots and stored tags are int64 tensors. :class:`StoragePrefetch` is a collaborator the tree
owns (``HiRadixCache.storage_prefetch``); it reaches the tree through :class:`PrefetchTree`.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_count, as_str, token_list
from kvpool.optimized.hicache.cache_controller import HiCacheController, PrefetchOperation
from kvpool.optimized.hicache.tree_node import HiTreeNode, as_hi
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.radix_key import RadixKey, TreeNode
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.reference.hicache.args import check_node
from kvpool.reference.hicache.prefetch import hit_tokens_held
from kvpool.rules import Rules
from kvpool.snapshot import PrefetchSnapshot
from kvpool.tags import kv_tags


class PrefetchTree(Protocol):
    """The parts of the twin's ``HiRadixCache`` its storage prefetches use."""

    @property
    def page_size(self) -> int: ...

    @property
    def prefetch_threshold(self) -> int: ...

    @property
    def enable_storage(self) -> bool: ...

    @property
    def root_node(self) -> HiTreeNode: ...

    @property
    def unified(self) -> bool: ...

    @property
    def cache_controller(self) -> HiCacheController: ...

    @property
    def write_policy(self) -> str: ...

    @property
    def rules(self) -> Rules: ...

    @property
    def token_to_kv_pool_host(self) -> HostPoolProtocol[torch.Tensor]: ...

    def evict_host(self, num_tokens: int) -> int: ...

    def _insert_helper_host(self, node: HiTreeNode, key: RadixKey, host_value: torch.Tensor) -> int:
        """Insert ``key`` below ``node`` as host-only content; the tokens already in the tree."""
        ...


class StoragePrefetch:
    """The storage prefetches of one twin ``HiRadixCache`` (see the reference)."""

    def __init__(self, tree: PrefetchTree) -> None:
        self.tree = tree
        self.reset()

    def _drops_refill(self, node: HiTreeNode) -> bool:
        """Whether a completing prefetch drops the tokens below ``node`` (see the reference)."""
        tree = self.tree
        return (
            node is not tree.root_node
            and not node.backuped
            and tree.write_policy != "write_back"
            and tree.rules.prefetch_refill != "attach"
        )

    def reset(self) -> None:
        """Forget every prefetch (frees nothing)."""
        self.ongoing_prefetch: dict[str, tuple[HiTreeNode, RadixKey, PrefetchOperation]] = {}
        self.pins: dict[str, list[HiTreeNode]] = {}
        """The nodes each prefetch pins: its node (none for the root under the unified rules'
        write-through), and under the unified rules the upper halves of its splits
        (:meth:`_split`)."""

    def prefetch_from_storage(
        self,
        req_id: str,
        last_host_node: TreeNode,
        new_input_tokens: list[int],
        extra_key: str | None = None,
    ) -> bool:
        """Start a prefetch of ``new_input_tokens`` (page-aligned) below ``last_host_node``;
        returns whether it started (checked first as the reference; the unified rules' gate,
        rate limit, namespace and pin as there)."""
        tree = self.tree
        req_id = as_str("req_id", req_id)
        if req_id in self.ongoing_prefetch:
            raise InvalidArgumentError(f"request {req_id!r} already prefetches")
        check_node("last_host_node", last_host_node, tree.root_node, HiTreeNode)
        anchor = as_hi(last_host_node)
        if not tree.unified and not anchor.backuped:
            raise InvalidArgumentError(
                f"last_host_node {last_host_node.node_id} has no host copy to extend"
            )
        if extra_key is not None:
            extra_key = as_str("extra_key", extra_key)
        root = anchor is tree.root_node
        if tree.unified and not root and anchor.key.extra_key != extra_key:
            raise InvalidArgumentError(
                f"last_host_node {anchor.node_id} is in namespace {anchor.key.extra_key!r}, "
                f"not {extra_key!r}"
            )
        raw: object = new_input_tokens
        if isinstance(raw, torch.Tensor | np.ndarray):  # a 1-D integer index, read on host
            raw = index_tensor("new_input_tokens", raw, "cpu").tolist()
        tokens = token_list("new_input_tokens", raw)  # type: ignore[arg-type]
        tokens = tokens[: floor_align(len(tokens), tree.page_size)]
        if not tree.enable_storage or not tokens or len(tokens) < tree.prefetch_threshold:
            return False
        namespace = anchor.key.extra_key
        pinned = True
        if tree.unified:
            if not (root or anchor.backuped) or self._rate_limited():
                return False
            namespace = extra_key
            pinned = not root or tree.write_policy == "write_back"
        path: list[int] = []
        cur: TreeNode = anchor
        while cur.parent is not None:
            path = cur.arr.tolist() + path
            cur = cur.parent
        tags = kv_tags(path + tokens, namespace)[len(path) :]
        if pinned:
            anchor.protect_host()
        key = RadixKey(tokens, namespace)
        op = tree.cache_controller.prefetch(req_id, torch.tensor(tags, dtype=torch.int64))
        self.pins[req_id] = [anchor] if pinned else []
        self.ongoing_prefetch[req_id] = (anchor, key, op)
        return True

    def _rate_limited(self) -> bool:
        """The unified rules: the prefetches in flight ask for half the host pool or more."""
        asked = sum(len(key) for _, key, _ in self.ongoing_prefetch.values())
        return asked >= int(0.5 * self.tree.token_to_kv_pool_host.size)

    def _unpin(self, req_id: str) -> None:
        for node in self.pins.pop(req_id, []):
            node.release_host()

    def _split(self, low: HiTreeNode, upper: HiTreeNode) -> None:
        """The unified rules: a split's upper half takes the pins of the prefetches that pin
        its lower half (0.5.23's host lock receipts cover the node the lock was taken on, so
        both halves; their release drops both)."""
        for pins in self.pins.values():
            if any(node is low for node in pins):
                pins.append(upper)
                upper.protect_host()

    def _revoke_pending_prefetch(self, req_id: str) -> None:
        if self.ongoing_prefetch.pop(req_id, None) is not None:
            self._unpin(req_id)

    def storage_hit(self, req_id: str, hit_tokens: int) -> bool:
        """Storage holds the first ``hit_tokens`` tokens: reserve host slots or revoke
        (checked first as the reference)."""
        tree = self.tree
        req_id = as_str("req_id", req_id)
        hit_tokens = as_count("hit_tokens", hit_tokens)
        info = self.ongoing_prefetch.get(req_id)
        if info is None or info[2].host_indices is not None:
            return False
        _, key, op = info
        hit = hit_tokens_held(hit_tokens, len(key), tree.page_size)
        if hit < tree.prefetch_threshold or hit == 0 or op.terminated:
            self._revoke_pending_prefetch(req_id)
            return False
        host = tree.token_to_kv_pool_host
        host_indices = host.alloc(hit)
        if host_indices is None:
            tree.evict_host(hit)
            host_indices = host.alloc(hit)
        if host_indices is None:
            avail = floor_align(host.available_size(), tree.page_size)
            hit = min(hit, avail)
            if hit >= tree.prefetch_threshold and hit > 0:
                host_indices = host.alloc(hit)
        if host_indices is None:
            self._revoke_pending_prefetch(req_id)
            return False
        op.storage_hit_count = hit
        op.host_indices = host_indices.clone()
        tree.cache_controller.prefetch_buffer.append(op)
        return True

    def check_prefetch_progress(self, req_id: str) -> bool:
        """End ``req_id``'s prefetch now (best effort); see the reference."""
        tree = self.tree
        req_id = as_str("req_id", req_id)
        info = self.ongoing_prefetch.get(req_id)
        if info is None:
            return True
        _, _, op = info
        tree.cache_controller.terminate_prefetch(op)
        if op.host_indices is None:
            self._revoke_pending_prefetch(req_id)
            return True
        self._complete(req_id)
        return True

    def _complete(self, req_id: str) -> None:
        """Insert the tokens counted by now, free the cached ones' slots, unpin (see the
        reference)."""
        tree = self.tree
        last_host_node, key, op = self.ongoing_prefetch.pop(req_id)
        assert op.host_indices is not None
        completed = op.completed_tokens
        written = op.host_indices[:completed]
        matched = tree._insert_helper_host(last_host_node, key[:completed], written)
        tree.token_to_kv_pool_host.free(op.host_indices[:matched])
        self._unpin(req_id)

    def release_aborted_request(self, rid: str) -> None:
        """An aborted request's prefetch: stop it, queue its fetched host slots for release."""
        rid = as_str("rid", rid)
        cc = self.tree.cache_controller
        info = self.ongoing_prefetch.get(rid)
        if info is None:
            return
        op = info[2]
        if op.host_indices is None:
            cc.terminate_prefetch(op)
            self._revoke_pending_prefetch(rid)
            return
        completed = cc.terminate_prefetch(op)
        self._unpin(rid)
        del self.ongoing_prefetch[rid]
        cc.append_host_mem_release(op.host_indices[:completed])

    def prefetch_io(self, req_id: str, num_pages: int) -> int:
        """The worker of ``req_id``'s transfer runs ``num_pages`` more pages (the controller
        checks the arguments)."""
        return int(self.tree.cache_controller.prefetch_io(req_id, num_pages))

    def drain_storage_control_queues(self) -> int:
        """Free the host slots queued for release; returns how many (under the unified rules
        after applying the worker's acknowledgements, as the reference)."""
        cc = self.tree.cache_controller
        host = self.tree.token_to_kv_pool_host
        before = int(host.available_size())
        if cc.acks_at_drain:
            acks, cc.ack_prefetch_queue = cc.ack_prefetch_queue, []
            for op, tokens in acks:
                info = self.ongoing_prefetch.get(op.request_id)
                current = info is not None and info[2] is op
                if tokens is not None:
                    if current:
                        op.completed_tokens = tokens
                    continue
                if current:
                    self._complete(op.request_id)
                assert op.host_indices is not None  # only a transfer with slots runs
                cc.append_host_mem_release(op.host_indices[op.completed_tokens :])
        cc.drain_release()
        return int(host.available_size()) - before

    def prefetch_snapshots(self) -> tuple[PrefetchSnapshot, ...]:
        """The ongoing prefetches, by request id."""
        out = []
        for rid in sorted(self.ongoing_prefetch):
            node, key, op = self.ongoing_prefetch[rid]
            hosts = () if op.host_indices is None else tuple(op.host_indices.tolist())
            out.append(PrefetchSnapshot(rid, node.node_id, len(key), hosts,
                                        op.completed_tokens, op.terminated))  # fmt: skip
        return tuple(out)


__all__ = ["PrefetchTree", "StoragePrefetch"]
