"""SGLang's ``RadixCache`` behind kvpool's :class:`~kvpool.protocols.RadixCacheProtocol`.

:class:`SGLangRadixCache` builds SGLang's class from ``CacheInitParams`` over the SGLang
``ReqToTokenPool`` and allocator it is given (adapters or SGLang objects) and calls it with
SGLang's parameter objects (``MatchPrefixParams``, ``InsertParams``, ``EvictParams``). What the
adapter does so that its snapshot can be compared with kvpool's reference:

- **Clock.** Each ``match_prefix`` / ``insert`` that walks the tree (not disabled, page-aligned
  key not empty: when kvpool's reference reads its clock) advances a per-cache logical clock by
  1.0 and runs SGLang under :func:`kvpool.sglang.clock.frozen_at` that tick, so all of SGLang's
  ``time.monotonic()`` reads in that call (the walk stamp, the new nodes' access and creation
  times) return it. Other calls run at the current tick.
- **Node ids.** SGLang numbers nodes from the class counter ``TreeNode.counter``, shared by every
  cache of the process. The adapter loads its own counter into ``TreeNode.counter`` before each
  call and saves it after, and zeroes it on ``reset``: ids are per cache, the root is 0 and the
  upper half of a split takes the next id, as in kvpool.
- **Root.** SGLang stamps the root's ``last_access_time`` on every walk and raises its
  ``priority`` (``-sys.maxsize`` at reset) on every insert; the root is never evicted, so no
  result depends on either. The snapshot reports them as kvpool does: 0.0 and 0.
- **Match result.** 0.5.23's ``MatchResult`` carries ``device_prefix_len`` instead of
  ``device_indices``; the adapter rebuilds them with SGLang's ``path_device_indices``.

``cache_finished_req`` / ``cache_unfinished_req`` are not adapted: SGLang's take its scheduler
``Req`` (``kv_len_to_handle``, ``req.kv`` in 0.5.23), which kvpool's request does not mirror.
"""

from __future__ import annotations

import contextlib
import io
import math
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.clock import frozen_at, install_clock
from kvpool.sglang.loader import SGLangModules
from kvpool.snapshot import NodeSnapshot, TreeSnapshot

_RADIX = "sglang.srt.mem_cache.radix_cache"
_BASE = "sglang.srt.mem_cache.base_prefix_cache"


@dataclass(frozen=True)
class SGLangMatch:
    """``match_prefix``'s result: the matched slots (int64 tensor), the last matched node and
    SGLang's own ``MatchResult``."""

    device_indices: Any
    last_device_node: Any
    result: Any


def make_radix_key(modules: SGLangModules, token_ids: Sequence[int], extra_key: str | None) -> Any:
    """SGLang's ``RadixKey`` of ``token_ids`` (an ``array('q')``, as SGLang builds them)."""
    cls = modules.attr(_RADIX, "RadixKey")
    return cls(array("q", [int(t) for t in token_ids]), extra_key)


def _impl(component: Any) -> Any:
    return getattr(component, "impl", component)


class SGLangRadixCache:
    """SGLang's ``RadixCache`` (see the module docstring). ``impl`` is SGLang's object."""

    def __init__(
        self,
        modules: SGLangModules,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
    ) -> None:
        self.modules = modules
        self.page_size = page_size
        self.disable = disable
        self._radix = modules.module(_RADIX)
        install_clock(self._radix)
        self._now = 0.0
        self._next_id = 0
        params_cls = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        params = params_cls(
            disable=disable,
            req_to_token_pool=_impl(req_to_token_pool),
            token_to_kv_pool_allocator=_impl(token_to_kv_pool_allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
        )
        with self._call():
            self.impl: Any = self._radix.RadixCache(params)

    @contextlib.contextmanager
    def _call(self, walks: bool = False) -> Iterator[None]:
        """Run one SGLang call with this cache's node counter and clock (one tick if it walks)."""
        if walks:
            self._now += 1.0
        node_cls = self._radix.TreeNode
        node_cls.counter = self._next_id
        try:
            with frozen_at(self._now):
                yield
        finally:
            self._next_id = node_cls.counter

    def _walks(self, key: Any) -> bool:
        return not self.disable and len(key) // self.page_size > 0

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> SGLangMatch:
        """SGLang's ``match_prefix`` of ``key`` (a RadixKey, see :func:`make_radix_key`)."""
        params = self.modules.attr(_BASE, "MatchPrefixParams")(key=key)
        with self._call(self._walks(key)):
            result = self.impl.match_prefix(params)
        node = result.last_device_node
        indices = getattr(result, "device_indices", None)
        if indices is None:  # 0.5.23: only the length; rebuild the slots from the path
            indices = self.impl.path_device_indices(node)
        return SGLangMatch(indices, node, result)

    def insert(self, key: Any, value: Any = None, priority: int = 0) -> int:
        """SGLang's ``insert``: the length (tokens) that was already cached."""
        params = self.modules.attr(_BASE, "InsertParams")(
            key=key,
            value=None if value is None else as_index_tensor(value),
            priority=priority,
        )
        with self._call(self._walks(key)):
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int:
        """Change in ``evictable_size`` (<= 0)."""
        with self._call():
            return int(self.impl.inc_lock_ref(node).delta or 0)

    def dec_lock_ref(self, node: Any) -> int:
        """Change in ``evictable_size`` (>= 0)."""
        with self._call():
            return int(self.impl.dec_lock_ref(node).delta or 0)

    def evict(self, num_tokens: int) -> int:
        """Tokens SGLang freed (whole leaves, may exceed ``num_tokens``)."""
        params = self.modules.attr(_BASE, "EvictParams")(num_tokens=num_tokens)
        with self._call():
            return int(self.impl.evict(params).num_tokens_evicted)

    def evictable_size(self) -> int:
        return int(self.impl.evictable_size())

    def protected_size(self) -> int:
        return int(self.impl.protected_size())

    def total_size(self) -> int:
        return int(self.impl.total_size())

    def reset(self) -> None:
        """SGLang's ``reset``; node ids restart at 0 (the root)."""
        self._next_id = 0
        with self._call():
            self.impl.reset()

    def pretty_print(self) -> str:
        """What SGLang's ``pretty_print`` prints."""
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.impl.pretty_print()
        return out.getvalue()

    def cache_finished_req(self, req: Any, is_insert: bool = True) -> None:
        raise NotImplementedError("SGLang's cache_finished_req takes its scheduler Req")

    def cache_unfinished_req(self, req: Any, chunked: bool = False) -> None:
        raise NotImplementedError("SGLang's cache_unfinished_req takes its scheduler Req")

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot of SGLang's tree: breadth-first, children in insertion order,
        root time and priority reported as 0 (see the module docstring)."""
        nodes: list[NodeSnapshot] = []
        root = self.impl.root_node
        queue = deque([root])
        while queue and not self.disable:
            node = queue.popleft()
            children = list(node.children.values())
            queue.extend(children)
            nodes.append(
                NodeSnapshot(
                    node_id=int(node.id),
                    parent_id=None if node.parent is None else int(node.parent.id),
                    key=tuple(int(t) for t in node.key.raw_token_ids()),
                    extra_key=node.key.extra_key,
                    value=tuple(
                        int(v) for v in (node.value if node is root else node.value.tolist())
                    ),
                    lock_ref=int(node.lock_ref),
                    child_ids=tuple(int(c.id) for c in children),
                    child_keys=tuple(
                        tuple(int(t) for t in c.key.raw_token_ids()[: self.page_size])
                        for c in children
                    ),
                    last_access_time=0.0
                    if node is root
                    else float(math.floor(node.last_access_time)),
                    hit_count=int(node.hit_count),
                    priority=0 if node is root else int(node.priority),
                )
            )
        return TreeSnapshot(
            page_size=self.page_size,
            disabled=self.disable,
            eviction_policy=str(self.impl.eviction_policy),
            evictable_size=int(self.impl.evictable_size_),
            protected_size=int(self.impl.protected_size_),
            nodes=tuple(nodes),
        )


__all__ = ["SGLangMatch", "SGLangRadixCache", "make_radix_key"]
