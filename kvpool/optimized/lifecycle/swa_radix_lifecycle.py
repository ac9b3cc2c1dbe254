"""``SWARadixLifecycle`` (optimized twin): the SWA radix cache as the request lifecycle uses it.

Twin of :mod:`kvpool.reference.lifecycle.swa_radix_lifecycle`, written out again (the lockstep
harness compares the two); rows are read as int64 tensors, ``prefix_indices`` is a tensor.

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

import torch

from kvpool.constants import floor_align
from kvpool.errors import InvalidArgumentError, LockError
from kvpool.host_checks import as_bool, as_count, as_instance, as_int
from kvpool.optimized.index_args import index_tensor
from kvpool.optimized.options import TwinOptions
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix_key import RadixKey, req_key
from kvpool.optimized.swa.allocator import SWATokenToKVPoolAllocator
from kvpool.optimized.swa.radix_cache import SWAMatchResult, SWARadixCache
from kvpool.optimized.swa.tree_node import SWATreeNode
from kvpool.optimized.unified.swa_radix_cache import UnifiedSWARadixCache
from kvpool.reference.radix_key import cached_len
from kvpool.rules import Rules
from kvpool.snapshot import TreeSnapshot


class SWAReq(Protocol):
    """What the SWA tree's hand-overs read and write of a request (lengths in tokens): its
    lock is on an :class:`SWATreeNode`."""

    last_node: SWATreeNode | None
    cache_protected_len: int
    cache_inserted_len: int
    prefix_indices: torch.Tensor

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
    """An :class:`SWARadixCache` behind the lifecycle's tree calls (module docstring);
    ``options`` go to the tree (as :class:`SWARadixCache` takes them)."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        is_eagle: bool = False,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self.disable = False
        self.eviction_policy = "lru"
        self.tree = SWARadixCache(token_to_kv_pool_allocator, page_size, sliding_window_size, clock,
                                  options=options, is_eagle=is_eagle)  # fmt: skip
        self.is_eagle = self.tree.is_eagle
        """EAGLE's bigram keys: a hand-over of ``n`` tokens caches ``floor_align(n - 1)`` slots
        (see the reference's)."""
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
    ) -> tuple[SWAReq, bool, torch.Tensor | None]:
        """The checks of a hand-over (``cache_finished_req``, ``cache_unfinished_req``) before
        any change: ``req`` a request holding a row, the flag a bool, ``row_read`` None or the
        row's first ``need`` slots (``kv_committed_len`` when ``finished``, else
        ``len(fill_ids)``) given as an integer index of at least that many, equal to the row
        there (checked mode: a device read; unchecked, its content is the caller's).
        InvalidArgumentError naming the argument otherwise."""
        out = check_swa_req(req)
        value = as_bool(flag_name, flag)
        row = out.req_pool_idx
        assert row is not None
        need = out.kv_committed_len if finished else len(out.fill_ids)
        if row_read is None:
            return out, value, None
        got = index_tensor("row_read", row_read, self.req_to_token_pool.device)
        if got.numel() < need:
            raise InvalidArgumentError(
                f"row_read holds {got.numel()} slots; the request needs {need}"
            )
        # The reference compares the slots with the row; here that is a device read: checked
        # mode only (unchecked, the content is the caller's, as the README says).
        if self.tree.options.checked and not torch.equal(got[:need], self._read_row(row, need)):
            raise InvalidArgumentError(f"row_read is not row {row}'s first {need} slots")
        return out, value, got

    def _key(self, req: SWAReq, slots: int) -> RadixKey:
        """The token key whose tree key names the request's first ``slots`` slots: its first
        ``slots`` tokens, under ``is_eagle`` one more (the last bigram's second)."""
        stop = slots + self.is_eagle if slots else 0
        return req_key(req, stop)

    def _read_row(self, row: int, stop: int) -> torch.Tensor:
        kv: torch.Tensor = self.req_to_token_pool.read(row, 0, stop)
        return kv.to(torch.int64)

    def cache_finished_req(
        self, req: SWAReq, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """Hand a finished (or retracted) request's committed KV to the tree, or free it; free
        the unaligned tail; unlock (module docstring). InvalidArgumentError for a request
        without a row. ``row_read``: ``row[:committed]`` as the caller already read it (int64,
        on the device), used instead of a read of the row."""
        req, is_insert, row_read = self._hand_over_args(req, "is_insert", is_insert, row_read, True)
        committed = req.kv_committed_len
        assert req.req_pool_idx is not None
        if row_read is not None:
            kv = row_read[:committed]
        else:
            kv = self._read_row(req.req_pool_idx, committed)
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
        self, req: SWAReq, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """Between prefill chunks (module docstring); ``row_read``: ``row[:len(fill_ids)]`` as
        the caller already read it (int64, on the device), used instead of a read of the row."""
        req, chunked, row_read = self._hand_over_args(req, "chunked", chunked, row_read, False)
        row = req.req_pool_idx
        assert row is not None
        filled = len(req.fill_ids)
        kv = row_read[:filled] if row_read is not None else self._read_row(row, filled)
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
        new = match.device_indices
        self.req_to_token_pool.write((row, slice(protected, len(new))), new[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new)
        req.prefix_indices = torch.cat((new, kv[len(new) :]))
        req.last_node = match.last_device_node


class UnifiedSWARadixLifecycle(SWARadixLifecycle):
    """SGLang 0.5.23's FULL+SWA unified tree (:class:`UnifiedSWARadixCache`) behind the
    lifecycle's tree calls (``Rules.swa_window_release == "scheduler"``; twin of the
    reference's). The locks, sizes and eviction are :class:`SWARadixLifecycle`'s; the hand-over
    is SGLang 0.5.23's ``checkpoint`` (:meth:`checkpoint`), which the lifecycle calls with the
    request's window cursor after sliding the window; the row release is the lifecycle's."""

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: SWATokenToKVPoolAllocator,
        page_size: int,
        sliding_window_size: int,
        clock: Callable[[], float] | None = None,
        eviction_policy: str = "lru",
        is_eagle: bool = False,
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         sliding_window_size, clock, is_eagle, options=options)  # fmt: skip
        self.eviction_policy = eviction_policy
        self.unified = UnifiedSWARadixCache(token_to_kv_pool_allocator, page_size,
                                            sliding_window_size, clock,
                                            eviction_policy=eviction_policy,
                                            options=options, is_eagle=is_eagle)  # fmt: skip
        self.tree = self.unified

    def snapshot(self) -> TreeSnapshot:
        """The tree's snapshot with every tombstone's ``swa_lock_ref`` reported as 0 (see the
        reference's)."""
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
        """SGLang 0.5.23's ``checkpoint_into_tree`` of ``row[:stop]`` (see the reference's):
        insert, rewrite ``row[cache_protected_len:len(path)]`` with the path's slots, move the
        lock, set ``cache_protected_len`` (returned), ``prefix_indices``, ``last_node``. Under
        ``is_eagle``: ``floor_align(stop - 1)`` slots, keyed by the first ``stop`` tokens'
        bigrams."""
        req = check_swa_req(req)
        limit = max(req.kv_committed_len, len(req.fill_ids))
        stop = as_int("stop", stop)
        if not 0 <= stop <= limit:
            raise InvalidArgumentError(f"stop must lie in [0, {limit}], got {stop}")
        swa_evicted_seqlen = as_count("swa_evicted_seqlen", swa_evicted_seqlen)
        row = req.req_pool_idx
        assert row is not None
        kv = self._read_row(row, stop)
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
        self.req_to_token_pool.write((row, slice(protected, path.numel())), path[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(node)
        req.cache_protected_len = path.numel()
        req.prefix_indices = torch.cat((path, kv[path.numel() :]))
        req.last_node = node
        return path.numel()

    def _path_values(self, node: SWATreeNode) -> torch.Tensor:
        """Full slots of the path from the root to ``node`` (int64)."""
        parts: list[torch.Tensor] = []
        while node is not self.tree.root_node and node.parent is not None:
            parts.append(node.value.to(torch.int64))
            node = node.parent
        if not parts:
            return torch.empty((0,), dtype=torch.int64, device=self.tree.root_node.value.device)
        return torch.cat(list(reversed(parts)))


class UnifiedSWARadixLifecycleV0516(SWARadixLifecycle):
    """SGLang 0.5.16's FULL+SWA ``UnifiedRadixCache`` behind the lifecycle's tree calls, with
    that cache's ``cache_finished_req`` / ``cache_unfinished_req`` (twin of the reference's,
    whose docstring says how they differ from :class:`SWARadixLifecycle`'s): every insert
    carries the request's ``swa_evicted_seqlen``, a chunk's insert counts no hits, a release
    without insert is one ``free`` of ``row[cache_protected_len:committed]``."""

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
        *,
        options: TwinOptions | None = None,
    ) -> None:
        super().__init__(req_to_token_pool, token_to_kv_pool_allocator, page_size,
                         sliding_window_size, clock, is_eagle, options=options)  # fmt: skip
        self.eviction_policy = eviction_policy
        self.unified = UnifiedSWARadixCache(token_to_kv_pool_allocator, page_size,
                                            sliding_window_size, clock,
                                            eviction_policy=eviction_policy, rules=rules,
                                            options=options, is_eagle=is_eagle)  # fmt: skip
        self.tree = self.unified

    def cache_finished_req(
        self, req: SWAReq, is_insert: bool = True, row_read: torch.Tensor | None = None
    ) -> None:
        """0.5.16's unified ``cache_finished_req`` (see the reference's): insert the
        page-aligned committed tokens with the request's cursor, then one ``free`` of the tail;
        without insert one ``free`` of ``row[cache_protected_len:committed]``; then the
        unlock. ``row_read``: ``row[:committed]`` as the caller already read it (int64)."""
        req, is_insert, row_read = self._hand_over_args(req, "is_insert", is_insert, row_read, True)
        committed = req.kv_committed_len
        assert req.req_pool_idx is not None
        if row_read is not None:
            kv = row_read[:committed]
        else:
            kv = self._read_row(req.req_pool_idx, committed)
        protected = req.cache_protected_len
        alloc = self.token_to_kv_pool_allocator
        if is_insert:
            aligned = cached_len(committed, self.page_size, self.is_eagle)
            evicted = min(self.evicted_of(req), aligned)
            self.unified.insert(self._key(req, aligned), kv[:aligned], protected, evicted)
            alloc.free(kv[aligned:committed])
        else:
            alloc.free(kv[protected:committed])
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(
        self, req: SWAReq, chunked: bool = False, row_read: torch.Tensor | None = None
    ) -> None:
        """0.5.16's unified ``cache_unfinished_req`` (see the reference's); ``row_read``:
        ``row[:len(fill_ids)]`` as the caller already read it (int64)."""
        req, chunked, row_read = self._hand_over_args(req, "chunked", chunked, row_read, False)
        row = req.req_pool_idx
        assert row is not None
        filled = len(req.fill_ids)
        kv = row_read[:filled] if row_read is not None else self._read_row(row, filled)
        aligned = cached_len(filled, self.page_size, self.is_eagle)
        key = self._key(req, aligned)
        protected = req.cache_protected_len
        evicted = min(self.evicted_of(req), aligned)
        # a chunk's insert counts no hit: no node ends past the key's own length
        self.unified.insert(key, kv[:aligned], protected, evicted,
                            inserted_len=aligned if chunked else 0)  # fmt: skip
        match = self.unified.match_prefix(key)
        new = match.device_indices
        self.req_to_token_pool.write((row, slice(protected, len(new))), new[protected:])
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        req.cache_protected_len = len(new)
        req.prefix_indices = torch.cat((new, kv[len(new) :]))
        req.last_node = match.last_device_node


__all__ = [
    "SWARadixLifecycle",
    "UnifiedSWARadixLifecycle",
    "UnifiedSWARadixLifecycleV0516",
    "check_swa_req",
]
