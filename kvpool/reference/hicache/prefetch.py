"""Prefetches from storage into the host tier: the part of ``HiRadixCache`` that runs them.

Units: tokens; host indices are host slots. :class:`StoragePrefetch` is a collaborator the tree
owns (``HiRadixCache.storage_prefetch``; the tree's prefetch methods call it); it reaches the
tree through :class:`PrefetchTree`, exactly the parts it uses (the controller, the host pool,
``evict_host`` and the insert of host-only content). Mirrored in both twins.

A prefetch (SGLang 0.5.16, ``best_effort`` stop policy, one rank) goes through:

1. ``prefetch_from_storage(rid, last_host_node, tokens)``: nothing unless storage is enabled and
   the page-aligned ``tokens`` reach ``prefetch_threshold``; else ``last_host_node`` is pinned
   and the operation is ongoing (no host slot reserved yet).
2. ``storage_hit(rid, tokens)``: storage reports how many tokens it holds. Below the threshold,
   or when the operation was terminated meanwhile, it is revoked (the pin dropped). Otherwise
   host slots are reserved for the hit (evicting host leaves once, then trying the largest
   page-aligned part that fits and still reaches the threshold), or the prefetch is revoked.
3. The worker fetches pages (the controller's ``prefetch_io``; :meth:`StoragePrefetch.prefetch_io`).
4. ``check_prefetch_progress(rid)`` ends it: the fetched tokens go below ``last_host_node`` as
   host-only nodes (the slots of tokens already in the tree are freed at once), the pin is
   dropped, and the unfetched slots are left to the worker, which releases them when it sees
   the termination.
5. ``release_aborted_request(rid)`` (abort) instead queues the fetched slots for release and
   leaves the unfetched ones to the worker, likewise.

Under the unified rules (SGLang 0.5.23's ``UnifiedRadixCache``, cache mode, ``best_effort``,
one rank; specs/unified_cache.md, "Storage prefetches") the same steps differ in:

- the start: only below a backed-up node or the root (the scheduler's ``_prefetch_kvcache``
  asks nothing of another), nothing while the prefetches in flight ask for half the host pool
  or more (``prefetch_rate_limited``: their requested tokens), in the request's namespace
  (``extra_key``; a node's must match), and the node is pinned unless it is the root under a
  write-through policy (the root has no host copy to pin);
- the worker (the controller's ``acks_at_drain``): a transfer is read in one batch, and what it
  read counts only when ``drain_storage_control_queues`` applies its acknowledgements; the
  acknowledgement of its end completes a prefetch still in flight at once (as step 4, with the
  tokens acknowledged) and releases the slots it did not fill;
- step 4 inserts the tokens acknowledged by then (``Rules.prefetch_refill == "refill"``: the
  device nodes it walks through take their host copies).
"""

from __future__ import annotations

from typing import Protocol

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError
from kvpool.host_checks import as_count, as_str, token_list
from kvpool.protocols.hicache import HostPoolProtocol
from kvpool.reference.hicache.args import check_node
from kvpool.reference.hicache.cache_controller import HiCacheController, PrefetchOperation
from kvpool.reference.hicache.tree_node import HiTreeNode, as_hi
from kvpool.reference.radix_key import RadixKey, TreeNode
from kvpool.rules import Rules
from kvpool.snapshot import PrefetchSnapshot
from kvpool.tags import kv_tags


def hit_tokens_held(hit_tokens: int, wanted: int, page_size: int) -> int:
    """The tokens a storage hit of ``hit_tokens`` covers for a prefetch of ``wanted`` tokens:
    capped at the prefetch, whole pages only (SGLang's query thread counts page hits)."""
    return floor_align(min(max(hit_tokens, 0), wanted), page_size)


class PrefetchTree(Protocol):
    """The parts of ``HiRadixCache`` its storage prefetches use."""

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
    def token_to_kv_pool_host(self) -> HostPoolProtocol[list[int]]: ...

    def evict_host(self, num_tokens: int) -> int: ...

    def _insert_helper_host(self, node: HiTreeNode, key: RadixKey, host_value: list[int]) -> int:
        """Insert ``key`` below ``node`` as host-only content at ``host_value``; the tokens
        already in the tree (their host slots are the caller's to free)."""
        ...


class StoragePrefetch:
    """The storage prefetches of one ``HiRadixCache`` (see the module docstring):
    ``ongoing_prefetch`` maps a request id to its pinned node, its key and its operation."""

    def __init__(self, tree: PrefetchTree) -> None:
        self.tree = tree
        self.reset()

    def _drops_refill(self, node: HiTreeNode) -> bool:
        """Whether a completing prefetch drops the fetched tokens that would hang below
        ``node`` (their host slots freed, as its duplicates'): ``node`` is on device without a
        host copy, the policy writes through and ``Rules.prefetch_refill`` is ``"drop"`` or
        ``"refill"`` (where the walk ends at such a node only when it matched nothing: the
        nodes it matched took host copies), so backed-up nodes keep forming a prefix from the
        root. ``"attach"`` (SGLang 0.5.16) hangs them below it as a host-only child
        (specs/host_tier.md)."""
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
        returns whether it started. Its stored content is the KV of the node's path followed by
        these tokens, in the node's namespace (the unified rules: ``extra_key``'s, the
        request's). InvalidArgumentError (nothing changed) for a ``req_id`` that is not a str
        or already prefetches, a ``last_host_node`` that is not a node of this tree (nor, but
        under the unified rules, backed up: its host copy is what the prefetch extends; under
        them, nor in another namespace than ``extra_key``), tokens that are not token ids or
        an ``extra_key`` that is neither None nor a str."""
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
        tokens = token_list("new_input_tokens", new_input_tokens)
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
            path = list(cur.key.token_ids) + path
            cur = cur.parent
        tags = kv_tags(path + tokens, namespace)[len(path) :]
        if pinned:
            anchor.protect_host()
        key = RadixKey(tokens, namespace)
        op = tree.cache_controller.prefetch(req_id, tags)
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
        """Storage holds the first ``hit_tokens`` tokens (page-aligned, capped at the request):
        reserve host slots for them or revoke (see the module docstring). Returns whether the
        transfer started (False for a request with no prefetch waiting for its hit).
        InvalidArgumentError for a ``req_id`` that is not a str or a ``hit_tokens`` that is not
        a count."""
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
        op.host_indices = list(host_indices)
        tree.cache_controller.prefetch_buffer.append(op)
        return True

    def check_prefetch_progress(self, req_id: str) -> bool:
        """End ``req_id``'s prefetch now (best effort): insert what was fetched as host-only
        nodes, free the slots of tokens already cached, drop the pin. True when no prefetch is
        left for the request. InvalidArgumentError for a ``req_id`` that is not a str."""
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
        """Insert ``req_id``'s fetched tokens (those counted by now) below its node, free the
        slots of those already cached, drop the pin; the prefetch ends."""
        tree = self.tree
        last_host_node, key, op = self.ongoing_prefetch.pop(req_id)
        assert op.host_indices is not None
        completed = op.completed_tokens
        written = op.host_indices[:completed]
        matched = tree._insert_helper_host(last_host_node, key[:completed], written)
        tree.token_to_kv_pool_host.free(op.host_indices[:matched])
        self._unpin(req_id)

    def release_aborted_request(self, rid: str) -> None:
        """An aborted request's prefetch: stop it, queue its fetched host slots for release,
        drop the pin (the worker releases the unfetched slots). InvalidArgumentError for a
        ``rid`` that is not a str."""
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
        """The worker of ``req_id``'s transfer runs ``num_pages`` more pages (see the
        controller, which checks the arguments); returns the tokens fetched."""
        return int(self.tree.cache_controller.prefetch_io(req_id, num_pages))

    def drain_storage_control_queues(self) -> int:
        """Free the host slots queued for release; returns how many host slots the call freed.
        Under the unified rules the worker's acknowledgements are applied first, in order: a
        batch's tokens count for a prefetch still in flight, and a transfer's end completes
        one (as :meth:`check_prefetch_progress` does, which frees the slots of tokens already
        cached) and queues the slots it did not fill."""
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
            out.append(PrefetchSnapshot(rid, node.node_id, len(key), tuple(op.host_indices or ()),
                                        op.completed_tokens, op.terminated))  # fmt: skip
        return tuple(out)


__all__ = ["PrefetchTree", "StoragePrefetch", "hit_tokens_held"]
