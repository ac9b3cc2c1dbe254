"""SGLang's ``MambaRadixCache`` behind the interface of kvpool's
:class:`~kvpool.reference.mamba.radix_cache.MambaRadixCache`.

:class:`SGLangMambaRadixCache` builds SGLang's class from ``CacheInitParams`` over SGLang's
``HybridReqToTokenPool`` and token allocator (the adapters' ``impl``) and calls it with SGLang's
parameter objects. What the adapter does so that its snapshot compares with kvpool's:

- **Node ids.** SGLang numbers nodes from the class counter ``TreeNode.counter`` (shared by the
  process); each of its two LRU lists also makes two dummy nodes at ``reset``. The adapter loads
  its own counter before each call and saves it after; after ``reset`` it restarts at 1, so the
  root is 0 and the tree's nodes are numbered 1, 2... in creation order, as in kvpool (the
  dummies are never in the tree, and SGLang keys nothing by them). A read-only ``node_id``
  alias of ``id`` is installed on SGLang's class.
- **Access times.** SGLang stamps nodes from a process-wide float counter that only its sanity
  check reads; the LRU orders are its linked lists, which the snapshot reads (most recent first).
- **Branching length.** ``match_prefix`` reports where a request could start caching states
  again (``mamba_branching_seqlen``), from the server's ``mamba_cache_chunk_size``; kvpool does
  not model it, and the adapter sets that field to 64 (the server argument is not loaded).
- **Requests.** ``match_prefix(key, req, cow_mamba)`` passes a
  :class:`~kvpool.sglang.hybrid.MambaReqProxy` of the kvpool request, so the slot SGLang gives
  it and the copy it records land on the kvpool request as ints.
- **Results.** Slots come back as lists of ints; ``insert`` returns ``(prefix_len,
  mamba_exist)`` and ``evict`` ``(tokens, states)``, as kvpool's.

SGLang asserts where a copy-on-write finds no slot even after evicting one state; a harness
under ``Rules.mamba_slot_shortage="assert"`` does not ask for that.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.hybrid import MambaReqProxy
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.radix import to_sglang_key
from kvpool.snapshot import MambaNodeSnapshot, MambaTreeSnapshot

MAMBA_RADIX = "sglang.srt.mem_cache.mamba_radix_cache"
_BASE = "sglang.srt.mem_cache.base_prefix_cache"
CHUNK_SIZE = 64
"""``mamba_cache_chunk_size`` given to SGLang's cache (only its branching length reads it)."""


@dataclass(frozen=True)
class SGLangMambaMatch:
    """``match_prefix``'s result as kvpool's: the slots of the prefix up to the deepest node
    with a state, that node, whether a copy was staged, and SGLang's own ``MatchResult``."""

    device_indices: list[int]
    last_device_node: Any
    cow_staged: bool
    result: Any


def _ints(value: Any) -> tuple[int, ...]:
    """A node's KV slots (SGLang's root holds a list, every other node a tensor)."""
    return tuple(int(v) for v in (value.tolist() if hasattr(value, "tolist") else value))


def _impl(component: Any) -> Any:
    return getattr(component, "impl", component)


class SGLangMambaRadixCache:
    """SGLang's ``MambaRadixCache`` (see the module docstring). ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int = 1,
    ) -> None:
        self.modules = modules
        self.page_size = page_size
        self._module = modules.module(MAMBA_RADIX)
        node_cls = self._module.TreeNode
        if "node_id" not in node_cls.__dict__:
            node_cls.node_id = property(lambda node: int(node.id))
        self._next_id = 0
        params_cls = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        params = params_cls(
            disable=False,
            req_to_token_pool=_impl(req_to_token_pool),
            token_to_kv_pool_allocator=_impl(token_to_kv_pool_allocator),
            page_size=page_size,
            enable_mamba_extra_buffer=bool(getattr(req_to_token_pool, "track_buffers", 0)),
        )
        with self._call(reset=True):
            self.impl: Any = self._module.MambaRadixCache(params)
        self.impl.mamba_cache_chunk_size = CHUNK_SIZE

    @contextlib.contextmanager
    def _call(self, reset: bool = False) -> Iterator[None]:
        """Run one SGLang call with this cache's node counter (see the module docstring)."""
        node_cls = self._module.TreeNode
        node_cls.counter = self._next_id
        try:
            yield
        finally:
            self._next_id = 1 if reset else node_cls.counter

    @property
    def root_node(self) -> Any:
        return self.impl.root_node

    def _key(self, key: Any) -> Any:
        return to_sglang_key(self.modules, key)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any, req: Any = None, cow_mamba: bool = False) -> SGLangMambaMatch:
        """SGLang's ``match_prefix`` (with ``req`` and ``cow_mamba``)."""
        proxy = None if req is None else MambaReqProxy(req)
        params = self.modules.attr(_BASE, "MatchPrefixParams")(
            key=self._key(key), cow_mamba=cow_mamba, req=proxy
        )
        with self._call():
            result = self.impl.match_prefix(params)
        node = result.last_device_node
        staged = bool(cow_mamba and req is not None and node.mamba_value is not None
                      and req.mamba_cow_src_index is not None)  # fmt: skip
        indices = [int(s) for s in result.device_indices.tolist()]
        return SGLangMambaMatch(indices, node, staged, result)

    def insert(
        self, key: Any, value: Any, mamba_value: int, prev_prefix_len: int = 0
    ) -> tuple[int, bool]:
        """SGLang's ``insert``: ``(tokens already cached, whether the end node had a state)``."""
        params = self.modules.attr(_BASE, "InsertParams")(
            key=self._key(key),
            value=as_index_tensor(value),
            mamba_value=as_index_tensor([int(mamba_value)]),
            prev_prefix_len=prev_prefix_len,
        )
        with self._call():
            result = self.impl.insert(params)
        return int(result.prefix_len), bool(result.mamba_exist)

    def inc_lock_ref(self, node: Any) -> None:
        with self._call():
            self.impl.inc_lock_ref(node)

    def dec_lock_ref(self, node: Any) -> None:
        with self._call():
            self.impl.dec_lock_ref(node)

    def evict_mamba(self, mamba_num: int) -> int:
        with self._call():
            return int(self.impl.evict_mamba(mamba_num))

    def evict_full(self, full_num_tokens: int) -> int:
        with self._call():
            return int(self.impl.evict_full(full_num_tokens))

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]:
        params = self.modules.attr(_BASE, "EvictParams")(num_tokens=num_tokens,
                                                         mamba_num=mamba_num)  # fmt: skip
        with self._call():
            result = self.impl.evict(params)
        return int(result.num_tokens_evicted), int(result.mamba_num_evicted)

    def full_evictable_size(self) -> int:
        return int(self.impl.full_evictable_size())

    def mamba_evictable_size(self) -> int:
        return int(self.impl.mamba_evictable_size())

    def full_protected_size(self) -> int:
        return int(self.impl.full_protected_size())

    def mamba_protected_size(self) -> int:
        return int(self.impl.mamba_protected_size())

    def all_mamba_values(self) -> list[int]:
        return [int(s) for s in self.impl.all_mamba_values_flatten().tolist()]

    def reset(self) -> None:
        """SGLang's ``reset``; node ids restart (the root is 0)."""
        self._next_id = 0
        with self._call(reset=True):
            self.impl.reset()

    # ------------------------------------------------------------------ snapshot
    def _lru(self, mamba: bool) -> tuple[int, ...]:
        lru = self.impl.mamba_lru_list if mamba else self.impl.full_lru_list
        nxt = "mamba_next" if mamba else "next"
        ids: list[int] = []
        node = getattr(lru.head, nxt)
        while node is not lru.tail:
            ids.append(int(node.id))
            node = getattr(node, nxt)
        return tuple(ids)

    def _nodes(self) -> list[Any]:
        out, stack = [], [self.impl.root_node]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(list(node.children.values())))
        return out

    def snapshot(self) -> MambaTreeSnapshot:
        """kvpool's snapshot: nodes in pre-order (children in SGLang's dict order), the sizes
        and both LRU orders (most recently used first)."""
        nodes: Sequence[MambaNodeSnapshot] = tuple(
            MambaNodeSnapshot(
                node_id=int(n.id),
                parent_id=None if n.parent is None else int(n.parent.id),
                key=tuple(int(t) for t in n.key.token_ids),
                extra_key=n.key.extra_key,
                value=_ints(n.value),
                mamba_value=None if n.mamba_value is None else int(n.mamba_value.reshape(-1)[0]),
                full_lock_ref=int(n.full_lock_ref),
                mamba_lock_ref=int(n.mamba_lock_ref),
                child_ids=tuple(int(c.id) for c in n.children.values()),
            )
            for n in self._nodes()
        )
        impl = self.impl
        return MambaTreeSnapshot(
            full_evictable_size=int(impl.full_evictable_size_),
            mamba_evictable_size=int(impl.mamba_evictable_size_),
            full_protected_size=int(impl.full_protected_size_),
            mamba_protected_size=int(impl.mamba_protected_size_),
            nodes=tuple(nodes),
            full_lru=self._lru(mamba=False),
            mamba_lru=self._lru(mamba=True),
        )


__all__ = ["CHUNK_SIZE", "SGLangMambaMatch", "SGLangMambaRadixCache"]
