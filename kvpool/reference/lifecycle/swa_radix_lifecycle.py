"""``SWARadixLifecycle``: the SWA radix cache as the request lifecycle uses it.

The lifecycle (:class:`~kvpool.reference.lifecycle.swa_memory_manager.SWAMemoryManager`) talks to
its tree the way it talks to a :class:`~kvpool.reference.radix.radix_cache.RadixCache`:
``match_prefix``, ``inc_lock_ref(node)`` / ``dec_lock_ref(node)``, ``cache_finished_req`` /
``cache_unfinished_req``, the sizes and the snapshot. This class gives an
:class:`~kvpool.reference.swa.radix_cache.SWARadixCache` that shape, with SGLang 0.5.16's SWA
hand-overs (its ``SWARadixCache.cache_finished_req`` / ``cache_unfinished_req``):

- **Locks.** SGLang keeps a request's ``swa_uuid_for_lock`` on the request; here every
  ``inc_lock_ref(node)`` pushes the uuid it got on a stack per node and ``dec_lock_ref(node)``
  pops it (the counts a release takes back are the same whichever of a node's holders
  releases first).
- **Finish** (``is_insert``): insert the committed page-aligned tokens at their row slots with
  ``prev_prefix_len = cache_protected_len`` and the request's ``swa_evicted_seqlen`` (the
  tokens whose SWA slots its window released become a tombstone node; the tree frees the
  duplicates and recovers tombstones itself), then free the unaligned tail, then unlock.
  Without insert: free ``row[cache_protected_len:aligned]``, then the tail, then unlock.
- **Between prefill chunks**: insert ``fill_ids`` with the request's ``swa_evicted_seqlen``
  (non-zero only after a session turn whose window slid; SGLang's class passes 0 there, which
  breaks the SWA accounting: kvpool's one deviation), match again (the SWA-aware match),
  rewrite ``row[cache_protected_len:len(match)]`` with the tree's slots, move the lock, set
  ``cache_protected_len``, ``prefix_indices`` and ``last_node``.
- **Eviction** ``evict(num_tokens, swa_num_tokens)`` is the tree's: separate full and SWA
  deficits, returning both amounts freed (tokens).

``swa_evicted_seqlen`` comes from the lifecycle through ``evicted_of(req)`` (tokens, a page
multiple). Units: tokens; slots are full slots.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Protocol, cast

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError, LockError
from kvpool.host_checks import as_bool, as_count, as_instance, as_int, int_list
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix_key import RadixKey, cached_len
from kvpool.reference.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.reference.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.reference.swa.tree_node import SWATreeNode
from kvpool.reference.unified.swa_radix_cache import UnifiedSWARadixCache
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot


class SWAReq(Protocol):
    """What the SWA tree's hand-overs read and write of a request (lengths in tokens): its
    lock is on an :class:`SWATreeNode`."""

    last_node: SWATreeNode | None
    cache_protected_len: int
    cache_inserted_len: int
    prefix_indices: list[int]

    @property
    def rid(self) -> str: ...
    @property
    def req_pool_idx(self) -> int | None: ...
    @property
    def kv_committed_len(self) -> int: ...
    @property
    def fill_ids(self) -> Sequence[int]: ...
    @property
    def extra_key(self) -> str | None: ...
    @property
    def all_token_ids(self) -> Sequence[int]: ...


_SWA_REQ_FIELDS = (
    "rid", "req_pool_idx", "kv_committed_len", "cache_protected_len", "cache_inserted_len",
    "last_node", "prefix_indices", "fill_ids", "extra_key", "all_token_ids",
)  # fmt: skip


def check_swa_req(req: object) -> SWAReq:
    """``req`` as a request holding a row (the fields :class:`SWAReq` names):
    InvalidArgumentError for anything else (duck-typed: any request object qualifies)."""
    missing = [f for f in _SWA_REQ_FIELDS if not hasattr(req, f)]
    if missing:
        raise InvalidArgumentError(f"req must be a request (no {missing[0]}), got {req!r}")
    out = cast(SWAReq, req)
    if out.req_pool_idx is None:
        raise InvalidArgumentError(f"request {out.rid!r} holds no row")
    return out


class SWARadixLifecycle:
    """An :class:`SWARadixCache` behind the lifecycle's tree calls (module docstring)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        is_eagle: bool = False,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.disable = False
        self.eviction_policy = "lru"
        self.tree = SWARadixCache(token_to_kv_pool_allocator, page_size, sliding_window_size, clock,
                                  is_eagle=is_eagle)  # fmt: skip
        self.is_eagle = self.tree.is_eagle
        """EAGLE's bigram keys (SGLang's ``is_eagle``): a hand-over of ``n`` tokens caches
        ``cached_len(n)`` = ``floor_align(n - 1)`` slots, keyed by the bigrams of the first
        ``floor_align(n - 1) + 1`` tokens; the unaligned tail it frees starts there."""
        self.evicted_of: Callable[[SWAReq], int] = lambda req: 0
        """The request's ``swa_evicted_seqlen`` (set by the lifecycle)."""
        self._uuids: dict[int, list[int | None]] = {}

    # ----------------------------------------------------------------- tree calls
    def match_prefix(self, key: RadixKey) -> SWAMatchResult:
        """The tree's match of ``key`` (InvalidArgumentError unless a :class:`RadixKey`)."""
        return self.tree.match_prefix(as_instance("key", key, RadixKey))

    def inc_lock_ref(self, node: SWATreeNode | None) -> int:
        """Lock ``node`` (None: nothing) and remember the swa_uuid for its release.
        InvalidArgumentError for anything but a tree node or None."""
        if node is not None:
            as_instance("node", node, SWATreeNode)
        if node is None or node is self.tree.root_node:
            return 0
        uuid = self.tree.inc_lock_ref(node)
        self._uuids.setdefault(node.node_id, []).append(uuid)
        return 0

    def dec_lock_ref(self, node: SWATreeNode | None) -> int:
        """Release the last lock taken on ``node`` (None: nothing). LockError if none;
        InvalidArgumentError for anything but a tree node or None."""
        if node is not None:
            as_instance("node", node, SWATreeNode)
        if node is None or node is self.tree.root_node:
            return 0
        held = self._uuids.get(node.node_id)
        if not held:
            raise LockError(f"node {node.node_id} holds no lifecycle lock")
        self.tree.dec_lock_ref(node, held[-1])
        held.pop()
        if not held:
            del self._uuids[node.node_id]
        return 0

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """The tree's eviction: (full tokens freed, SWA tokens freed). InvalidArgumentError
        unless both counts are int64 integers >= 0."""
        num_tokens = as_count("num_tokens", num_tokens)
        swa_num_tokens = as_count("swa_num_tokens", swa_num_tokens)
        return self.tree.evict(num_tokens, swa_num_tokens)

    def evictable_size(self) -> int:
        return self.tree.full_evictable_size()

    def protected_size(self) -> int:
        return self.tree.full_protected_size()

    def swa_evictable_size(self) -> int:
        return self.tree.swa_evictable_size()

    def reset(self) -> None:
        self.tree.reset()
        self._uuids = {}

    def snapshot(self) -> TreeSnapshot:
        return self.tree.snapshot()

    # ----------------------------------------------------------------- hand-overs
    def _hand_over_args(
        self, req: object, flag_name: str, flag: object, row_read: object, finished: bool
    ) -> tuple[SWAReq, bool, list[int] | None]:
        """The checks of a hand-over (``cache_finished_req``, ``cache_unfinished_req``) before
        any change: ``req`` a request holding a row, the flag a bool, ``row_read`` None or the
        row's first ``need`` slots (``kv_committed_len`` when ``finished``, else
        ``len(fill_ids)``) given as an integer index equal to the row.
        InvalidArgumentError naming the argument otherwise."""
        out = check_swa_req(req)
        value = as_bool(flag_name, flag)
        row = out.req_pool_idx
        assert row is not None
        need = out.kv_committed_len if finished else len(out.fill_ids)
        if row_read is None:
            return out, value, None
        got = int_list("row_read", row_read)  # type: ignore[arg-type]
        if len(got) < need:
            raise InvalidArgumentError(f"row_read holds {len(got)} slots; the request needs {need}")
        if got[:need] != self.req_to_token_pool.read(row, 0, need):
            raise InvalidArgumentError(f"row_read is not row {row}'s first {need} slots")
        return out, value, got

    def _key(self, req: SWAReq, slots: int) -> RadixKey:
        """The token key whose tree key names the request's first ``slots`` slots: its first
        ``slots`` tokens, under ``is_eagle`` one more (the last bigram's second)."""
        stop = slots + self.is_eagle if slots else 0
        return RadixKey(list(req.all_token_ids[:stop]), req.extra_key)

    def cache_finished_req(
        self, req: SWAReq, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """Hand a finished (or retracted) request's committed KV to the tree, or free it; free
        the unaligned tail; unlock (module docstring). InvalidArgumentError for a request
        without a row. ``row_read``: ``row[:committed]`` as the caller already read it, used
        instead of a read of the row."""
        req, is_insert, row_read = self._hand_over_args(req, "is_insert", is_insert, row_read, True)
        committed = req.kv_committed_len
        assert req.req_pool_idx is not None
        if row_read is not None:
            kv = list(row_read[:committed])
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, committed)
        aligned = cached_len(committed, self.page_size, self.is_eagle)
        protected = req.cache_protected_len
        alloc = self.token_to_kv_pool_allocator
        if is_insert:
            evicted = min(self.evicted_of(req), aligned)
            self.tree.insert(self._key(req, aligned), kv[:aligned], protected, evicted)
        else:
            alloc.free(kv[protected:aligned])
        alloc.free(kv[aligned:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: SWAReq, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """Between prefill chunks (module docstring); ``row_read``: ``row[:len(fill_ids)]`` as
        the caller already read it, used instead of a read of the row."""
        req, chunked, row_read = self._hand_over_args(req, "chunked", chunked, row_read, False)
        row = req.req_pool_idx
        assert row is not None
        filled = len(req.fill_ids)
        if row_read is not None:
            kv = list(row_read[:filled])
        else:
            kv = self.req_to_token_pool.read(row, 0, filled)
        aligned = cached_len(filled, self.page_size, self.is_eagle)
        key = self._key(req, aligned)
        protected = req.cache_protected_len
        # The chunk goes in with the request's window cursor, as a finish does: a session turn
        # whose window slid before this chunk holds slots whose SWA side is already free, and
        # SGLang 0.5.16's SWARadixCache (which inserts a chunk with cursor 0) would put them in
        # the tree as live SWA (specs/swa.md, "A chunk after a slid window").
        evicted = min(self.evicted_of(req), aligned)
        self.tree.insert(key, kv[:aligned], protected, evicted)
        match = self.tree.match_prefix(key)
        new = list(match.device_indices)
        self.req_to_token_pool.write((row, slice(protected, len(new))), new[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new)
        req.prefix_indices = new + kv[len(new) :]
        req.last_node = match.last_device_node


class UnifiedSWARadixLifecycle(SWARadixLifecycle):
    """SGLang 0.5.23's FULL+SWA unified tree (:class:`UnifiedSWARadixCache`) behind the
    lifecycle's tree calls (``Rules.swa_window_release == "scheduler"``). The locks, sizes and
    eviction are :class:`SWARadixLifecycle`'s; the hand-over is SGLang 0.5.23's
    ``checkpoint`` (:meth:`checkpoint`), which the lifecycle
    (:class:`~kvpool.reference.lifecycle.swa_memory_manager.SWAMemoryManager`) calls with the
    request's window cursor after sliding the window; the row release is the lifecycle's.
    Under ``is_eagle`` the tree walks bigrams (its slot positions are still token positions:
    bigram ``i`` holds token ``i``'s slot), and every length here counts slots."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        eviction_policy: str = "lru",
        is_eagle: bool = False,
    ) -> None:
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         sliding_window_size, clock, is_eagle)  # fmt: skip
        self.eviction_policy = eviction_policy
        self.unified = UnifiedSWARadixCache(token_to_kv_pool_allocator, page_size,
                                            sliding_window_size, clock,
                                            eviction_policy=eviction_policy,
                                            is_eagle=is_eagle)  # fmt: skip
        self.tree = self.unified

    def snapshot(self) -> TreeSnapshot:
        """The tree's snapshot with every tombstone's ``swa_lock_ref`` reported as 0: 0.5.23's
        window lock counts tombstones too (:class:`UnifiedSWARadixCache`, difference 4), but
        only nodes holding SWA slots move the SWA sizes, and the pool invariants
        (``INV-SWA-TREE-LOCKS``) hold a tombstone to no SWA lock."""
        snap = self.tree.snapshot()
        nodes = tuple(dataclasses.replace(n, swa_lock_ref=0) if n.swa_tombstone else n
                      for n in snap.nodes)  # fmt: skip
        return dataclasses.replace(snap, nodes=nodes)

    def full_hit_length(self, key: RadixKey) -> int:
        """Slots of the page-aligned ``key`` (its bigrams under ``is_eagle``) whose full KV the
        tree holds (the walk a match makes, tombstones included; changes nothing): SGLang's
        ``full_kv_hit_length``."""
        key = self.tree._tree_key(as_instance("key", key, RadixKey))
        key = key[: floor_align(len(key), self.page_size)]
        node, total = self.tree.root_node, 0
        while len(key) > 0:
            child = node.children.get(self.tree._child_key(node, key))
            if child is None:
                break
            n = self.tree._match_len(child.key, key)
            total += n
            if n < len(child.key):
                break
            node, key = child, key[n:]
        return total

    def branching_seqlen(self, key: RadixKey, device_prefix_len: int) -> int | None:
        """SGLang's ``swa_branching_seqlen`` of a match of ``key`` that found
        ``device_prefix_len`` usable tokens: the page-aligned full hit when it reaches past
        them, else None."""
        key = as_instance("key", key, RadixKey)
        device_prefix_len = as_count("device_prefix_len", device_prefix_len)
        full = floor_align(self.full_hit_length(key), self.page_size)
        return full if full > device_prefix_len else None

    def checkpoint(self, req: SWAReq, stop: int, swa_evicted_seqlen: int) -> int:
        """SGLang 0.5.23's ``checkpoint_into_tree`` of ``row[:stop]`` with the window cursor
        ``swa_evicted_seqlen`` (tokens; the lifecycle slid the window first): insert the
        page-aligned key with ``prev_prefix_len = cache_protected_len`` (the tree frees the
        duplicates and recovers tombstones; hits count past ``cache_inserted_len``, which then
        rises to the key's length), rewrite ``row[cache_protected_len:len(path)]`` with the
        slots of the path to the node the insert ended on, move the lock there and set
        ``cache_protected_len`` (returned), ``prefix_indices`` (``row[:stop]`` after the
        rewrite) and ``last_node``. Under ``is_eagle`` the key is the first ``stop`` tokens'
        bigrams: ``floor_align(stop - 1)`` slots, the last token's never. InvalidArgumentError
        for a request without a row."""
        req = check_swa_req(req)
        limit = max(req.kv_committed_len, len(req.fill_ids))
        stop = as_int("stop", stop)
        if not 0 <= stop <= limit:
            raise InvalidArgumentError(f"stop must lie in [0, {limit}], got {stop}")
        swa_evicted_seqlen = as_count("swa_evicted_seqlen", swa_evicted_seqlen)
        row = req.req_pool_idx
        assert row is not None
        kv = self.req_to_token_pool.read(row, 0, stop)
        aligned = cached_len(stop, self.page_size, self.is_eagle)
        protected = req.cache_protected_len
        if aligned <= 0:
            req.prefix_indices = kv
            return protected
        evicted = min(swa_evicted_seqlen, aligned)
        self.unified.insert(self._key(req, aligned), kv[:aligned], protected, evicted,
                            inserted_len=req.cache_inserted_len)  # fmt: skip
        req.cache_inserted_len = max(req.cache_inserted_len, aligned)
        node = self.unified.last_insert_node
        path = self._path_values(node)
        self.req_to_token_pool.write((row, slice(protected, len(path))), path[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.cache_protected_len = len(path)
        req.prefix_indices = path + kv[len(path) :]
        req.last_node = node
        return len(path)

    def _path_values(self, node: SWATreeNode) -> list[int]:
        """Full slots of the path from the root to ``node``."""
        parts: list[list[int]] = []
        while node is not self.tree.root_node and node.parent is not None:
            parts.append(list(node.value))
            node = node.parent
        return [s for part in reversed(parts) for s in part]


class UnifiedSWARadixLifecycleV0516(SWARadixLifecycle):
    """SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` (:class:`UnifiedSWARadixCache` under
    ``rules``: ``Rules.for_sglang("0.5.16")`` gives 0.5.16's ``unified_*`` knobs) behind the
    lifecycle's tree calls, with that cache's own ``cache_finished_req`` /
    ``cache_unfinished_req`` (``unified_radix_cache.py``), selected by
    ``Rules.swa_tree == "unified"`` under the ``"maybe_evict"`` (0.5.16's) or ``"decode"``
    window rule. The locks (a uuid stack per node), sizes and eviction are
    :class:`SWARadixLifecycle`'s; full eviction follows ``eviction_policy``. The hand-overs
    differ from :class:`SWARadixLifecycle`'s (0.5.16's legacy ``SWARadixCache``) in three ways:

    - every insert carries the request's ``swa_evicted_seqlen`` (the SWA component's
      ``prepare_for_caching_req``), a prefill chunk's too (the legacy tree inserts a chunk
      with 0); a chunk's insert counts no hits (``InsertParams.chunked``);
    - a release without insert frees ``row[cache_protected_len:committed]`` with one
      ``free`` (the legacy tree: two, at the page boundary: another order of the paged
      allocator's release pages);
    - the chunk hand-over's unlock passes no ``skip_swa`` (0.5.16 releases a window lock
      early only under ``SGLANG_OPT_SWA_RELEASE_LEAF_LOCK_AFTER_WINDOW``, off by default,
      which kvpool does not model: no difference).
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        eviction_policy: str = "lru",
        rules: Rules | None = None,
        is_eagle: bool = False,
    ) -> None:
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         sliding_window_size, clock, is_eagle)  # fmt: skip
        self.eviction_policy = eviction_policy
        self.unified = UnifiedSWARadixCache(token_to_kv_pool_allocator, page_size,
                                            sliding_window_size, clock,
                                            eviction_policy=eviction_policy,
                                            rules=rules, is_eagle=is_eagle)  # fmt: skip
        self.tree = self.unified

    def cache_finished_req(
        self, req: SWAReq, is_insert: bool = True, row_read: list[int] | None = None
    ) -> None:
        """0.5.16's unified ``cache_finished_req`` of ``row[:committed]``: with insert, the
        page-aligned tokens go in with ``prev_prefix_len = cache_protected_len`` and the
        request's ``swa_evicted_seqlen`` (the tree frees the duplicates, makes the released part
        a tombstone and recovers tombstones), then the unaligned tail is one ``free``; without
        insert, ``row[cache_protected_len:committed]`` is one ``free``; then the unlock.
        InvalidArgumentError for a request without a row. ``row_read``: ``row[:committed]`` as
        the caller already read it."""
        req, is_insert, row_read = self._hand_over_args(req, "is_insert", is_insert, row_read, True)
        committed = req.kv_committed_len
        assert req.req_pool_idx is not None
        if row_read is not None:
            kv = list(row_read[:committed])
        else:
            kv = self.req_to_token_pool.read(req.req_pool_idx, 0, committed)
        protected = req.cache_protected_len
        alloc = self.token_to_kv_pool_allocator
        if is_insert:
            aligned = cached_len(committed, self.page_size, self.is_eagle)
            # the cursor never passes the committed page-aligned tokens (the window keeps
            # at least a page); min keeps the tree's argument check out of the way
            evicted = min(self.evicted_of(req), aligned)
            self.unified.insert(self._key(req, aligned), kv[:aligned], protected, evicted)
            alloc.free(kv[aligned:committed])
        else:
            alloc.free(kv[protected:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: SWAReq, chunked: bool = False, row_read: list[int] | None = None
    ) -> None:
        """0.5.16's unified ``cache_unfinished_req`` of ``row[:len(fill_ids)]``: insert the
        page-aligned tokens with ``prev_prefix_len = cache_protected_len`` and the request's
        ``swa_evicted_seqlen`` (``chunked``: no hit counted), match the key again, rewrite
        ``row[cache_protected_len:len(match)]`` with the tree's slots, move the lock, set
        ``cache_protected_len``, ``prefix_indices`` and ``last_node``. ``row_read``:
        ``row[:len(fill_ids)]`` as the caller already read it."""
        req, chunked, row_read = self._hand_over_args(req, "chunked", chunked, row_read, False)
        row = req.req_pool_idx
        assert row is not None
        filled = len(req.fill_ids)
        if row_read is not None:
            kv = list(row_read[:filled])
        else:
            kv = self.req_to_token_pool.read(row, 0, filled)
        aligned = cached_len(filled, self.page_size, self.is_eagle)
        key = self._key(req, aligned)
        protected = req.cache_protected_len
        evicted = min(self.evicted_of(req), aligned)
        # a chunk's insert counts no hit: no node ends past the key's own length
        self.unified.insert(key, kv[:aligned], protected, evicted,
                            inserted_len=aligned if chunked else 0)  # fmt: skip
        match = self.unified.match_prefix(key)
        new = list(match.device_indices)
        self.req_to_token_pool.write((row, slice(protected, len(new))), new[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new)
        req.prefix_indices = new + kv[len(new) :]
        req.last_node = match.last_device_node


__all__ = [
    "SWARadixLifecycle",
    "UnifiedSWARadixLifecycle",
    "UnifiedSWARadixLifecycleV0516",
    "check_swa_req",
]
