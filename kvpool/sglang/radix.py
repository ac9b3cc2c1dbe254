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

- **Keys.** Every key argument may be SGLang's ``RadixKey`` or any key with token ids and an
  ``extra_key`` (kvpool's reference or optimized ``RadixKey``): :func:`to_sglang_key` converts it
  to SGLang's (an ``array('q')`` of the ids, as SGLang builds them; its ``match`` requires every
  key of a tree to hold the same sequence type).
- **Node ids.** SGLang's ``TreeNode`` keeps its id in ``id``; the private class gets a read-only
  ``node_id`` alias, the name kvpool's snapshots read.

**Requests.** ``cache_finished_req`` / ``cache_unfinished_req`` call SGLang's own code with a
:class:`kvpool.sglang.cache_req.CacheReq` (the kvpool request with SGLang's field names):

- 0.5.16: SGLang's ``cache_finished_req(req, is_insert, kv_len_to_handle=kv_committed_len)``
  (kvpool releases the committed tokens; SGLang's ``release_kv_cache`` passes
  ``effective_kv_committed_len``, the same without ``strip_thinking_cache``) and
  ``cache_unfinished_req(req, chunked)``, which sets ``prefix_indices``, ``cache_protected_len``
  and ``last_node`` itself;
- 0.5.23 has neither: its ``release_kv_cache`` runs ``checkpoint(req, up_to=owned_kv_len)``
  (with insert), then ``free_kv_row(req.kv, [(cache_protected_len, owned_kv_len)])`` and
  ``unlock(req.lock)`` before it frees the over-allocation and the row, which is exactly what
  kvpool's ``cache_finished_req`` is inside kvpool's ``release_kv_cache`` (under
  ``Rules.release_path="checkpoint"`` kvpool's own follows the same steps); a chunk boundary runs
  ``checkpoint(req, up_to=extend_end)``. The adapter makes those calls (``owned_kv_len`` and
  ``extend_end`` are ``kv_committed_len`` and ``len(fill_ids)``). 0.5.23 keeps no
  ``prefix_indices`` (it tracks ``prefix_len`` and reads the row); the adapter sets kvpool's
  ``prefix_indices`` to the row's first ``len(fill_ids)`` slots after the checkpoint, which is
  what 0.5.16 (and kvpool) set: the tree's slots followed by the request's partial page.

SGLang's internal ``insert`` / ``match_prefix`` calls inside those methods go through the same
per-walk clock as the adapter's own (the instance's two methods are wrapped), so every walk
reads its own tick, as in kvpool's reference.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kvpool.errors import InvalidArgumentError
from kvpool.optimized.radix_key import RadixKey as OptimizedRadixKey
from kvpool.reference.radix_key import bigram_codes
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import CacheReq, InsertedLen, row_prefix, token_array
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


def key_codes(key: Any, bigram: bool = False) -> tuple[int, ...]:
    """An SGLang ``RadixKey`` as kvpool's snapshots spell a node's key: its token ids, or for a
    bigram key (EAGLE; ``bigram``: a key an EAGLE tree is about to view so) the codes of
    :func:`kvpool.reference.radix_key.bigram_codes`."""
    raw = [int(t) for t in key.raw_token_ids()]
    return tuple(bigram_codes(raw) if bigram or getattr(key, "is_bigram", False) else raw)


def walks_tree(key: Any, page_size: int, is_eagle: bool) -> bool:
    """Whether an SGLang ``match_prefix`` / ``insert`` of ``key`` walks the tree (and so reads
    its clock): a whole page of the key as the tree keys it (under EAGLE its bigrams, one fewer
    than the tokens of a key not yet viewed as bigrams)."""
    n = len(key)
    if is_eagle and not key.is_bigram:
        n = max(n - 1, 0)
    return n // page_size > 0


def make_radix_key(modules: SGLangModules, token_ids: Sequence[int], extra_key: str | None) -> Any:
    """SGLang's ``RadixKey`` of ``token_ids`` (an ``array('q')``, as SGLang builds them)."""
    cls = modules.attr(_RADIX, "RadixKey")
    return cls(token_array(token_ids), extra_key)


def to_sglang_key(modules: SGLangModules, key: Any) -> Any:
    """``key`` as SGLang's ``RadixKey``: SGLang's own is returned as is; kvpool's optimized key
    gives its cached numpy array (or its list), kvpool's reference key its ``token_ids``; any
    other object its ``token_ids`` (else its iteration) and ``extra_key``."""
    cls = modules.attr(_RADIX, "RadixKey")
    if isinstance(key, cls):
        return key
    ids: Any
    if isinstance(key, OptimizedRadixKey):
        held = key._array  # the array the key already holds, if any
        ids = held if held is not None else key.token_ids
    else:
        ids = getattr(key, "token_ids", None)
        if ids is None:
            ids = list(key)
    return cls(token_array(ids), getattr(key, "extra_key", None))


def _install_node_id(radix_module: Any) -> None:
    """Give SGLang's loaded ``TreeNode`` a read-only ``node_id`` (its ``id``), idempotent."""
    node_cls = radix_module.TreeNode
    if "node_id" not in node_cls.__dict__:
        node_cls.node_id = property(lambda node: int(node.id))


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
        is_eagle: bool = False,
    ) -> None:
        self.modules = modules
        self.page_size = page_size
        self.disable = disable
        self.is_eagle = is_eagle
        self._radix = modules.module(_RADIX)
        install_clock(self._radix)
        _install_node_id(self._radix)
        self._now = 0.0
        self._next_id = 0
        self._depth = 0
        self._inserted = InsertedLen()
        tree_lock = modules.attr(_BASE, "TreeLock")
        dec_params = modules.attr(_BASE, "DecLockRefParams")
        self._tree_lock = (
            None
            if tree_lock is None or dec_params is None
            else (lambda node: tree_lock(node, dec_params()))
        )
        params_cls = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")
        params = params_cls(
            disable=disable,
            req_to_token_pool=_impl(req_to_token_pool),
            token_to_kv_pool_allocator=_impl(token_to_kv_pool_allocator),
            page_size=page_size,
            eviction_policy=eviction_policy,
            is_eagle=is_eagle,
        )
        with self._call():
            self.impl: Any = self._radix.RadixCache(params)
        for name in ("match_prefix", "insert"):
            setattr(self.impl, name, self._ticking(getattr(self.impl, name)))
        if hasattr(self.impl, "checkpoint"):  # 0.5.23: SGLang's glue calls it directly
            checkpoint = self.impl.checkpoint

            def counted_checkpoint(*args: Any, **kwargs: Any) -> Any:
                with self._call():
                    return checkpoint(*args, **kwargs)

            self.impl.checkpoint = counted_checkpoint

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """Run one SGLang call with this cache's node counter, at the current tick;
        re-entrant: only the outermost call loads and saves the counter."""
        node_cls = self._radix.TreeNode
        depth = self._depth
        self._depth = depth + 1
        if depth == 0:
            node_cls.counter = self._next_id
        try:
            with frozen_at(self._now):
                yield
        finally:
            self._depth = depth
            if depth == 0:
                self._next_id = node_cls.counter

    def _ticking(self, method: Any) -> Any:
        """``method`` (SGLang's bound ``match_prefix`` / ``insert``, taking a params object
        with ``key``) advancing the clock by one tick when it walks the tree."""

        def call(params: Any) -> Any:
            if self._walks(params.key):
                self._now += 1.0
            with self._call():  # this cache's node counter too: SGLang's glue calls it
                return method(params)

        return call

    def _walks(self, key: Any) -> bool:
        return not self.disable and walks_tree(key, self.page_size, self.is_eagle)

    def _key(self, key: Any) -> Any:
        return to_sglang_key(self.modules, key)

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> SGLangMatch:
        """SGLang's ``match_prefix`` of ``key`` (any key, see :func:`to_sglang_key`)."""
        params = self.modules.attr(_BASE, "MatchPrefixParams")(key=self._key(key))
        with self._call():
            result = self.impl.match_prefix(params)
        node = result.last_device_node
        indices = getattr(result, "device_indices", None)
        if indices is None:  # 0.5.23: only the length; rebuild the slots from the path
            indices = self.impl.path_device_indices(node)
        return SGLangMatch(indices, node, result)

    def insert(self, key: Any, value: Any = None, priority: int = 0) -> int:
        """SGLang's ``insert``: the length (tokens) that was already cached."""
        params = self.modules.attr(_BASE, "InsertParams")(
            key=self._key(key),
            value=None if value is None else as_index_tensor(value),
            priority=priority,
        )
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int:
        """Change in ``evictable_size`` (<= 0). ``None`` (no node: kvpool's convention, e.g. a
        session turn that matched nothing in the tree) changes nothing, as in kvpool's cache;
        SGLang never passes None (its callers test ``last_node`` first)."""
        if node is None:
            return 0
        with self._call():
            return int(self.impl.inc_lock_ref(node).delta or 0)

    def dec_lock_ref(self, node: Any) -> int:
        """Change in ``evictable_size`` (>= 0); ``None`` changes nothing (see
        :meth:`inc_lock_ref`)."""
        if node is None:
            return 0
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

    # ------------------------------------------------------------------ requests
    def request(self, req: Any) -> CacheReq:
        """``req`` (a kvpool request) as SGLang's radix cache sees it."""
        return CacheReq(req, self._inserted, self._tree_lock)

    def cache_finished_req(self, req: Any, is_insert: bool = True, row_read: Any = None) -> None:
        """Hand a finished request's committed KV to SGLang's tree, or free it, and drop its
        lock (see the module docstring). InvalidArgumentError (nothing changed) for a request
        without a row, as kvpool's. ``row_read`` (the caller's read of the row) is ignored:
        SGLang's tree reads the row itself."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        proxy = self.request(req)
        proxy.mark_finished()
        committed = int(req.kv_committed_len)
        with self._call():
            if hasattr(self.impl, "cache_finished_req"):
                self.impl.cache_finished_req(proxy, is_insert, kv_len_to_handle=committed)
            else:
                if is_insert:
                    self.impl.checkpoint(proxy, up_to=committed)
                self.impl.free_kv_row(proxy.kv, [(proxy.kv.cache_protected_len, committed)])
                self.impl.unlock(proxy.lock)
                proxy.lock = None
        self._inserted.forget(req)

    def cache_unfinished_req(self, req: Any, chunked: bool = False, row_read: Any = None) -> None:
        """Between prefill chunks: SGLang inserts ``fill_ids``, frees the duplicates, rewrites
        the row, moves the lock and sets ``prefix_indices`` / ``cache_protected_len`` /
        ``last_node`` (0.5.23: its ``checkpoint``; ``prefix_indices`` read from the row).
        ``row_read`` (the caller's read of the row) is ignored: SGLang's tree reads the row."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        proxy = self.request(req)
        with self._call():
            if hasattr(self.impl, "cache_unfinished_req"):
                self.impl.cache_unfinished_req(proxy, chunked=chunked)
                return
            filled = len(req.fill_ids)
            self.impl.checkpoint(proxy, up_to=filled)
        table = self.impl.req_to_token_pool.req_to_token
        req.prefix_indices = row_prefix(table, req.req_pool_idx, filled, req.prefix_indices)

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
                    key=key_codes(node.key),
                    extra_key=node.key.extra_key,
                    value=tuple(
                        int(v) for v in (node.value if node is root else node.value.tolist())
                    ),
                    lock_ref=int(node.lock_ref),
                    child_ids=tuple(int(c.id) for c in children),
                    child_keys=tuple(key_codes(c.key)[: self.page_size] for c in children),
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


__all__ = ["SGLangMatch", "SGLangRadixCache", "make_radix_key", "to_sglang_key"]
