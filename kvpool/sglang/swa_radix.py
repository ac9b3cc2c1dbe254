"""SGLang's ``SWARadixCache`` behind the API of kvpool's reference ``SWARadixCache``.

:class:`SGLangSWARadixCache` builds SGLang's class (``mem_cache/swa_radix_cache.py``) from
``CacheInitParams`` over an :class:`~kvpool.sglang.swa.SGLangSWAAllocator` and calls it with
SGLang's parameter objects. What the adapter does so that its results and snapshots can be
compared with kvpool's reference:

- **Node ids.** SGLang numbers nodes from the class counter ``TreeNode.counter`` (shared by every
  cache of the process) and its ``reset`` also spends four ids on the dummy heads and tails of
  its two LRU lists (which are never part of the tree and are not keyed in the lists' maps).
  The adapter keeps a counter per cache, loads it before each call and saves it after, and sets
  it to 1 after ``reset``: the root is 0 and the first node 1, as in kvpool.
- **swa_uuid.** SGLang's class counter ``TreeNode.swa_uuid_counter`` (starting at 1; the first
  uuid handed out is 2) is kept per cache the same way; the adapter reports ``uuid - 1`` (kvpool
  hands out 1, 2, ...) and adds 1 back when a uuid is passed in.
- **Recency.** SGLang orders nodes by two LRU lists (every node; non-tombstones), not by the
  ``last_access_time`` counter it stamps for its sanity check. The snapshot's
  ``last_access_time`` of a node is its position in SGLang's full LRU list (1.0 for the least
  recently used; the root 0.0); the SWA radix machine compares the eviction order these imply
  (:func:`kvpool.testing.machines.swa_radix.recency_ranks`), not clock values.
- **Keys** as in :func:`kvpool.sglang.radix.to_sglang_key`; node ``node_id`` is SGLang's ``id``.
- **Environment switches** ``SGLANG_OPT_SWA_RADIX_CACHE_COMPACT`` and
  ``SGLANG_OPT_SWA_SPLIT_LEAF_ON_INSERT`` read a stub (falsy): both default to off in SGLang.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import key_codes, to_sglang_key
from kvpool.snapshot import NodeSnapshot, TreeSnapshot

_SWA_RADIX = "sglang.srt.mem_cache.swa_radix_cache"
_BASE = "sglang.srt.mem_cache.base_prefix_cache"


@dataclass(frozen=True)
class SGLangSWAMatch:
    """``match_prefix``'s result: the matched full slots (int64 tensor) and the last node."""

    device_indices: Any
    last_device_node: Any
    result: Any


def _install_node_id(module: Any) -> None:
    node_cls = module.TreeNode
    if "node_id" not in node_cls.__dict__:
        node_cls.node_id = property(lambda node: int(node.id))


class SGLangSWARadixCache:
    """SGLang's ``SWARadixCache`` (see the module docstring). ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        allocator: Any,
        page_size: int,
        sliding_window_size: int,
        is_eagle: bool = False,
    ) -> None:
        self.modules = modules
        self.page_size = page_size
        self.sliding_window_size = sliding_window_size
        self._mod = modules.module(_SWA_RADIX)
        _install_node_id(self._mod)
        self._next_id = 0
        self._next_uuid = 1
        params_cls = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        params = params_cls(
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=getattr(allocator, "impl", allocator),
            page_size=page_size,
            sliding_window_size=sliding_window_size,
            is_eagle=is_eagle,
        )
        with self._call():
            self.impl: Any = self._mod.SWARadixCache(params)
        self._next_id = 1  # the LRU lists' dummy nodes are no tree nodes

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Run one SGLang call with this cache's node and swa_uuid counters."""
        node_cls = self._mod.TreeNode
        node_cls.counter, node_cls.swa_uuid_counter = self._next_id, self._next_uuid
        try:
            yield
        finally:
            self._next_id, self._next_uuid = node_cls.counter, node_cls.swa_uuid_counter

    def _key(self, key: Any) -> Any:
        return to_sglang_key(self.modules, key)

    def _params(self, name: str, **kwargs: Any) -> Any:
        return self.modules.attr(_BASE, name)(**kwargs)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> SGLangSWAMatch:
        with self._call():
            result = self.impl.match_prefix(self._params("MatchPrefixParams", key=self._key(key)))
        return SGLangSWAMatch(result.device_indices, result.last_device_node, result)

    def insert(
        self, key: Any, value: Any, prev_prefix_len: int = 0, swa_evicted_seqlen: int = 0
    ) -> int:
        """SGLang's ``insert``: the tokens that were already cached."""
        params = self._params(
            "InsertParams",
            key=self._key(key),
            value=as_index_tensor(value),
            prev_prefix_len=prev_prefix_len,
            swa_evicted_seqlen=swa_evicted_seqlen,
        )
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int | None:
        """The swa_uuid of the node where the SWA lock stopped (kvpool's numbering), or None."""
        with self._call():
            uuid = self.impl.inc_lock_ref(node).swa_uuid_for_lock
        return None if uuid is None else int(uuid) - 1

    @staticmethod
    def _uuid(uuid: int | None) -> int | None:
        return None if uuid is None else uuid + 1

    def dec_lock_ref(
        self, node: Any, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None:
        params = self._params("DecLockRefParams", swa_uuid_for_lock=self._uuid(swa_uuid_for_lock))
        with self._call():
            self.impl.dec_lock_ref(node, params, skip_swa=skip_swa)

    def dec_swa_lock_only(self, node: Any, swa_uuid_for_lock: int | None = None) -> None:
        with self._call():
            self.impl.dec_swa_lock_only(node, self._uuid(swa_uuid_for_lock))

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """(full tokens freed, SWA tokens freed)."""
        params = self._params("EvictParams", num_tokens=num_tokens, swa_num_tokens=swa_num_tokens)
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.swa_num_tokens_evicted)

    def full_evictable_size(self) -> int:
        return int(self.impl.full_evictable_size())

    def full_protected_size(self) -> int:
        return int(self.impl.full_protected_size())

    def swa_evictable_size(self) -> int:
        return int(self.impl.swa_evictable_size())

    def swa_protected_size(self) -> int:
        return int(self.impl.swa_protected_size())

    def reset(self) -> None:
        with self._call():
            self.impl.reset()
        self._next_id, self._next_uuid = 1, 1

    # ------------------------------------------------------------------ snapshot
    def _recency(self) -> dict[int, float]:
        """Position of every node in SGLang's full LRU list, 1.0 for the least recent."""
        lru = self.impl.full_lru_list
        order: dict[int, float] = {}
        node = lru.tail.prev
        while node is not lru.head:
            order[id(node)] = float(len(order) + 1)
            node = node.prev
        return order

    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot of SGLang's tree: breadth-first, children in insertion order,
        ``lock_ref`` the full lock count, ``last_access_time`` the LRU position (module
        docstring)."""
        ps = self.page_size
        recency = self._recency()
        root = self.impl.root_node
        nodes: list[NodeSnapshot] = []

        def first_page(node: Any) -> tuple[int, ...]:
            return key_codes(node.key)[:ps]

        queue = deque([root])
        while queue:
            node = queue.popleft()
            kids = list(node.children.values())
            queue.extend(kids)
            is_root = node is root
            nodes.append(
                NodeSnapshot(
                    node_id=int(node.id),
                    parent_id=None if node.parent is None else int(node.parent.id),
                    key=() if is_root else key_codes(node.key),
                    extra_key=None if is_root else node.key.extra_key,
                    value=() if is_root else tuple(int(v) for v in node.value.tolist()),
                    lock_ref=int(node.full_lock_ref),
                    child_ids=tuple(int(c.id) for c in kids),
                    child_keys=tuple(first_page(c) for c in kids),
                    last_access_time=0.0 if is_root else recency.get(id(node), -1.0),
                    swa_tombstone=bool(node.swa_tombstone),
                    swa_lock_ref=int(node.swa_lock_ref),
                )
            )
        impl = self.impl
        return TreeSnapshot(
            page_size=ps,
            disabled=False,
            eviction_policy="lru",
            evictable_size=int(impl.full_evictable_size_),
            protected_size=int(impl.full_protected_size_),
            nodes=tuple(nodes),
            swa_evictable_size=int(impl.swa_evictable_size_),
            swa_protected_size=int(impl.swa_protected_size_),
        )


__all__ = ["SGLangSWAMatch", "SGLangSWARadixCache"]
