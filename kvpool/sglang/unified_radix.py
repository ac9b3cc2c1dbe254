"""SGLang 0.5.23's ``UnifiedRadixCache`` (FULL component) behind kvpool's radix-cache protocol.

:class:`SGLangUnifiedRadixCache` builds SGLang's own ``UnifiedRadixCache`` from
``CacheInitParams(tree_components=(FULL,), tree_core_backend=CORE)`` over the SGLang
``ReqToTokenPool`` and allocator it is given, over either tree core (``"rust"``, SGLang's
default, or ``"python"``; :mod:`kvpool.sglang.tree_core`), and offers the calls of
:class:`~kvpool.sglang.radix.SGLangRadixCache` (its base), so every machine that drives the
legacy tree drives this one. What differs from the legacy adapter:

- **Nodes are ids.** The unified cache names nodes by ``NodeId`` (an int); ``match_prefix``
  returns one, ``inc_lock_ref`` / ``dec_lock_ref`` take one. A lock returns a *receipt*
  (``DecLockRefParams``) that its unlock must hand back, as the scheduler's ``TreeLock`` does:
  the adapter keeps the receipts of each node's open locks (last in, first out).
- **Snapshot ids** are renumbered as kvpool numbers them (the root 0, the first node minted
  after a reset 1): both cores mint ids from a counter that a reset does not restart (the
  Python core's reset also mints its LRU lists' sentinel nodes). The Python core's counter is the
  class attribute ``UnifiedTreeNode.counter``, shared by every cache of the process: the adapter
  loads this cache's own counter before each call and saves it after (as the legacy adapter
  does), so two caches in one process number their nodes independently.
- **The Rust core keeps no Python nodes.** Its snapshot is read through the binding's own
  queries: the node ids and lock counts from ``pretty_print`` (written by Rust to file
  descriptor 1, captured there), parents and key spans from ``collect_path_info``, values from
  ``get_component_device_value``. It cannot report a node's token ids, so the adapter records
  the token (and namespace) each slot was inserted with, on every insert, including those
  SGLang makes inside ``checkpoint``; a slot the tree holds was inserted with exactly that
  token. Neither core's snapshot reports access times, hit counts or priorities (the Rust core
  does not expose them): they are 0, and the ``unified_radix_cache`` machine compares trees
  without them (:func:`kvpool.testing.machines.unified.coarse_tree`); an order they decide
  shows in which slots an eviction frees.
- **Children** are reported in id order (the Rust core does not keep insertion order).

Time needs no freezing: the unified cache stamps nodes from its own logical counter
(``get_and_increase_time_counter``), not from the wall clock.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kvpool.errors import ConfigError
from kvpool.sglang.allocators import as_index_tensor
from kvpool.sglang.cache_req import CacheReq, InsertedLen
from kvpool.sglang.radix import SGLangMatch, SGLangRadixCache, to_sglang_key
from kvpool.sglang.tree_core import TREE_CORES, load_unified
from kvpool.snapshot import NodeSnapshot, TreeSnapshot

_BASE = "sglang.srt.mem_cache.base_prefix_cache"
_CORE = "sglang.srt.mem_cache.unified_cache.unified_tree_core"
_LINE = re.compile(r"^( *)\[(\d+)\] (\d+) full_lock=(-?\d+)")


class NodeRef(int):
    """A unified-cache ``NodeId`` (an int, as SGLang takes it) that also answers kvpool's
    ``node_id``: the id kvpool's snapshot gives the node (see the module docstring)."""

    cache: SGLangUnifiedRadixCache

    def __new__(cls, raw: int, cache: SGLangUnifiedRadixCache) -> NodeRef:
        ref = super().__new__(cls, raw)
        ref.cache = cache
        return ref

    @property
    def node_id(self) -> int:
        return self.cache.snapshot_id(int(self))


def capture_fd1(fn: Callable[[], object]) -> str:
    """What ``fn()`` writes to file descriptor 1 (where Rust's ``println!`` goes)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            fn()
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        return sink.read().decode("utf-8", "replace")


class SGLangUnifiedRadixCache(SGLangRadixCache):
    """SGLang's ``UnifiedRadixCache`` with the FULL component (see the module docstring).
    ``impl`` is SGLang's object; ``tree_core`` is ``"rust"`` or ``"python"``."""

    def __init__(
        self,
        modules: Any,
        req_to_token_pool: Any,
        token_to_kv_pool_allocator: Any,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
        tree_core: str = "rust",
    ) -> None:
        if tree_core not in TREE_CORES:
            raise ConfigError(f"tree_core must be one of {TREE_CORES}, got {tree_core!r}")
        self.modules = modules
        self.page_size = page_size
        self.disable = disable
        self.tree_core = tree_core
        self.eviction_policy = eviction_policy.lower()
        self._unified = load_unified(modules)
        self._full = self._unified.component_type.FULL
        self._node_cls = modules.attr(_CORE, "UnifiedTreeNode")
        self._next_id = 0
        self._depth = 0
        self._inserted = InsertedLen()
        self._receipts: dict[int, list[Any]] = {}
        """Node -> receipts of its open locks (SGLang's own calls included), newest last."""
        self._slot_token: dict[int, tuple[int, str | None]] = {}
        params = modules.attr("sglang.srt.mem_cache.cache_init_params", "CacheInitParams")(
            disable=disable,
            req_to_token_pool=getattr(req_to_token_pool, "impl", req_to_token_pool),
            token_to_kv_pool_allocator=getattr(
                token_to_kv_pool_allocator, "impl", token_to_kv_pool_allocator
            ),
            page_size=page_size,
            eviction_policy=eviction_policy,
            tree_components=(self._full,),
            tree_core_backend=tree_core,
        )
        with self._call():
            self.impl: Any = self._unified.cache_module.UnifiedRadixCache(params)
        self._first_id = self._next_id
        self._root_id = self._root()
        chosen = type(self.impl.tree_core).__name__
        if ("Rust" in chosen) != (tree_core == "rust"):
            raise ConfigError(f"asked for the {tree_core} tree core, SGLang built {chosen}")
        self.impl.insert = self._recording(self.impl.insert)
        for name in ("insert", "match_prefix", "touch_prefix", "checkpoint", "reset"):
            setattr(self.impl, name, self._counting(getattr(self.impl, name)))
        self.impl.inc_lock_ref = self._keeping(self.impl.inc_lock_ref)
        self.impl.dec_lock_ref = self._dropping(self.impl.dec_lock_ref)
        self._tree_lock = self._lock_of

    def _root(self) -> int:
        return int(self.impl.tree_core.root_node_handle())

    def snapshot_id(self, raw: int) -> int:
        """kvpool's number of SGLang's node ``raw``: the root 0, the first node minted after
        the last reset 1 (the Python core's reset also mints its LRU lists' sentinels)."""
        if raw == self._root_id:
            return 0
        if self.tree_core == "python":
            return raw - self._first_id + 1
        return raw - self._root_id

    def node_ref(self, node: Any) -> NodeRef | None:
        """``node`` (a ``NodeId``) as a :class:`NodeRef` of this cache; None for a disabled
        cache (its matches name the root, which it never locks: kvpool's chunk cache names
        no node)."""
        if self.disable or node is None:
            return None
        return node if isinstance(node, NodeRef) else NodeRef(int(node), self)

    def _keeping(self, method: Any) -> Any:
        """SGLang's bound ``inc_lock_ref`` keeping each lock's receipt."""

        def call(node_id: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(node_id, *args, **kwargs)
            self._receipts.setdefault(int(node_id), []).append(result.to_dec_params())
            return result

        return call

    def _dropping(self, method: Any) -> Any:
        """SGLang's bound ``dec_lock_ref`` dropping the receipt it hands back."""

        def call(node_id: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
            result = method(node_id, params, *args, **kwargs)
            held = self._receipts.get(int(node_id))
            if held:
                found = next((i for i, r in enumerate(held) if r is params), len(held) - 1)
                held.pop(found)
            return result

        return call

    def _lock_of(self, node: Any) -> Any:
        """SGLang's ``TreeLock`` on ``node`` with the receipt of its newest open lock (the one
        the kvpool request holds: kvpool keeps one lock per request, on ``last_node``)."""
        held = self._receipts.get(int(node))
        receipt = held[-1] if held else self.modules.attr(_BASE, "DecLockRefParams")()
        return self.modules.attr(_BASE, "TreeLock")(int(node), receipt)

    def request(self, req: Any) -> CacheReq:
        """``req`` as SGLang's cache sees it; nodes SGLang stores on it become NodeRefs."""
        return CacheReq(req, self._inserted, self._tree_lock, self.node_ref)

    @contextlib.contextmanager
    def _call(self) -> Iterator[None]:
        """One SGLang call with this cache's node counter (the Python core's is shared);
        re-entrant: only the outermost call loads and saves it."""
        self._depth += 1
        if self._depth == 1:
            self._node_cls.counter = self._next_id
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._next_id = self._node_cls.counter

    def _counting(self, method: Any) -> Any:
        """SGLang's bound ``method`` run inside :meth:`_call`: every way into the tree that can
        mint a node (SGLang's own glue calls the cache directly) uses this cache's counter."""

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._call():
                return method(*args, **kwargs)

        return call

    def _recording(self, method: Any) -> Any:
        """SGLang's bound ``insert`` recording the token each inserted slot stands for."""

        def call(params: Any) -> Any:
            value = params.value
            if value is not None:
                extra = params.key.extra_key
                slots = value.tolist()
                for slot, token in zip(slots, params.key.raw_token_ids(), strict=False):
                    self._slot_token[int(slot)] = (int(token), extra)
            return method(params)

        return call

    # ------------------------------------------------------------------ operations
    def match_prefix(self, key: Any) -> SGLangMatch:
        """SGLang's ``match_prefix`` of ``key``; the node is a ``NodeId``."""
        params = self.modules.attr(_BASE, "MatchPrefixParams")(key=to_sglang_key(self.modules, key))
        with self._call():
            result = self.impl.match_prefix(params)
            node = self.node_ref(result.last_device_node)
            indices = (
                self.impl.path_device_indices(int(node))
                if node is not None
                else torch.empty((0,), dtype=torch.int64)
            )
        return SGLangMatch(indices, node, result)

    frees_duplicates = True
    """An insert frees the caller's duplicate slots itself (``prev_prefix_len`` onwards)."""

    def insert(
        self, key: Any, value: Any = None, priority: int = 0, prev_prefix_len: int = 0
    ) -> int:
        """SGLang's ``insert``: the length (tokens) that was already cached; SGLang frees
        ``value[prev_prefix_len:cached]``, the duplicates of what the tree held."""
        params = self.modules.attr(_BASE, "InsertParams")(
            key=to_sglang_key(self.modules, key),
            value=None if value is None else as_index_tensor(value),
            priority=priority,
            prev_prefix_len=prev_prefix_len,
        )
        with self._call():
            return int(self.impl.insert(params).prefix_len)

    def inc_lock_ref(self, node: Any) -> int:
        """Lock ``node`` (a ``NodeId``; None changes nothing); the change in
        ``evictable_size`` (<= 0). The receipt is kept for the matching unlock."""
        if node is None:
            return 0
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.inc_lock_ref(int(node))
        return int(self.impl.evictable_size()) - before

    def dec_lock_ref(self, node: Any) -> int:
        """Unlock ``node`` with the receipt of its latest open lock (an unlock without one
        gets an empty receipt, as a caller that lost it would pass); the change in
        ``evictable_size`` (>= 0)."""
        if node is None:
            return 0
        held = self._receipts.get(int(node))
        receipt = held[-1] if held else self.modules.attr(_BASE, "DecLockRefParams")()
        before = int(self.impl.evictable_size())
        with self._call():
            self.impl.dec_lock_ref(int(node), receipt)
        return int(self.impl.evictable_size()) - before

    def reset(self) -> None:
        """SGLang's ``reset``; open lock receipts are dropped with the tree."""
        self._receipts.clear()
        with self._call():
            self.impl.reset()
        self._first_id = self._next_id
        self._root_id = self._root()

    def pretty_print(self) -> str:
        """What SGLang's ``pretty_print`` prints (the Rust core prints from Rust)."""
        return capture_fd1(self.impl.pretty_print)

    # ------------------------------------------------------------------ snapshot
    def snapshot(self) -> TreeSnapshot:
        """kvpool's tree snapshot (ids relative to the root, children in id order, no times,
        hit counts or priorities: see the module docstring)."""
        nodes = () if self.disable else tuple(self._rows())
        return TreeSnapshot(
            page_size=self.page_size,
            disabled=self.disable,
            eviction_policy=self.eviction_policy,
            evictable_size=int(self.impl.evictable_size()),
            protected_size=int(self.impl.protected_size()),
            nodes=nodes,
        )

    def _rows(self) -> list[NodeSnapshot]:
        if self.tree_core == "python":
            return self._python_rows()
        return self._rust_rows()

    def _python_rows(self) -> list[NodeSnapshot]:
        root = self.impl.tree_core.root_node
        sid = self.snapshot_id
        rows: list[NodeSnapshot] = []
        queue = [root]
        while queue:
            node = queue.pop(0)
            children = sorted(node.children.values(), key=lambda n: int(n.id))
            queue.extend(children)
            data = node.component_data[int(self._full)]
            value = () if data.value is None else tuple(int(v) for v in list(data.value))
            key = () if node.key is None else tuple(int(t) for t in node.key.raw_token_ids())
            rows.append(NodeSnapshot(
                node_id=sid(int(node.id)),
                parent_id=None if node.parent is None else sid(int(node.parent.id)),
                key=key,
                extra_key=None if node.key is None else node.key.extra_key,
                value=value,
                lock_ref=int(data.lock_ref),
                child_ids=tuple(sid(int(c.id)) for c in children),
                child_keys=tuple(tuple(int(t) for t in c.key.raw_token_ids()[: self.page_size])
                                 for c in children),
                last_access_time=0.0,
            ))  # fmt: skip
        return rows

    def _rust_rows(self) -> list[NodeSnapshot]:
        lines = [m for m in map(_LINE.match, self.pretty_print().splitlines()) if m]
        if not lines:
            return []
        base = int(lines[0].group(2))
        sid = self.snapshot_id
        locks = {int(m.group(2)): int(m.group(4)) for m in lines}
        ids = list(locks)
        paths = self.impl.tree_core.collect_path_info(ids)
        parent: dict[int, int | None] = {base: None}
        for path in paths:
            for info in path:
                parent[int(info.node_id)] = int(info.parent_id)
        children: dict[int, list[int]] = {i: [] for i in ids}
        for node_id in ids:
            up = parent.get(node_id)
            if up is not None:
                children[up].append(node_id)
        values: dict[int, tuple[int, ...]] = {}
        for node_id in ids:
            got = self.impl.tree_core.get_component_device_value(node_id, self._full)
            values[node_id] = () if got is None else tuple(int(v) for v in got.tolist())
        keys = {i: tuple(self._slot_token.get(s, (-1, None))[0] for s in values[i]) for i in ids}
        extras = {
            i: (self._slot_token.get(values[i][0], (-1, None))[1] if values[i] else None)
            for i in ids
        }
        rows: list[NodeSnapshot] = []
        order = [base]
        while order:
            node_id = order.pop(0)
            kids = sorted(children[node_id])
            order.extend(kids)
            up = parent.get(node_id)
            rows.append(NodeSnapshot(
                node_id=sid(node_id),
                parent_id=None if up is None else sid(up),
                key=keys[node_id],
                extra_key=extras[node_id],
                value=values[node_id],
                lock_ref=locks[node_id],
                child_ids=tuple(sid(k) for k in kids),
                child_keys=tuple(keys[k][: self.page_size] for k in kids),
                last_access_time=0.0,
            ))  # fmt: skip
        return rows


__all__ = ["SGLangUnifiedRadixCache", "capture_fd1"]
