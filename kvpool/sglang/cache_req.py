"""A kvpool request as SGLang's ``RadixCache`` reads and writes it.

SGLang's ``cache_finished_req`` / ``cache_unfinished_req`` (0.5.16) and ``checkpoint`` /
``free_kv_row`` (0.5.23) take SGLang's scheduler ``Req``. :class:`CacheReq` shows them a kvpool
request (:class:`kvpool.optimized.req.Req` or :class:`kvpool.reference.req.Req`) with exactly the
fields they use, and nothing else (any other attribute raises ``AttributeError``, so a new read in
a later release shows up as a crash instead of a silent default):

=============================  =====================================  ==========================
SGLang reads / writes          kvpool field                           direction
=============================  =====================================  ==========================
``origin_input_ids``,          the request's token list, as           read
``output_ids``                 ``array('q')`` (SGLang's type: keys
                               built from lists would not compare
                               with the tree's array keys)
``get_fill_ids()``             ``all_token_ids[:len(fill_ids)]``      read
``full_untruncated_fill_ids``  ``all_token_ids`` (0.5.23)             read
``req_pool_idx``               ``req_pool_idx``                       read
``extra_key``, ``priority``,   the same fields; ``cache_salt`` is     read
``session_id``, ``rid``        ``None`` (kvpool has no salt)
``session``,                   ``None``: no SGLang streaming session, read (0.5.23 unified)
``kv_rotation_base``           no page sharding
``cache_protected_len``        ``cache_protected_len`` (0.5.16 on     read / write (int)
                               the request, 0.5.23 on ``req.kv``)
``last_node``                  ``last_node`` (SGLang's node)          read / write
``prefix_indices``             ``prefix_indices`` in the request's    write (0.5.16)
                               own container type
``lock`` (0.5.23)              ``last_node`` (kvpool keeps one lock   read / write
                               per request, on ``last_node``)
``kv.cache_inserted_len``      kept by the adapter per request        read / write (0.5.23)
                               (:class:`InsertedLen`)
``kv.swa_evict_floor``,        0: no sliding window                   read (0.5.23)
``kv.get_evicted_seqlen()``
``kv.swa_dead_lo(ps)``         SGLang's formula over the above        read (0.5.23)
=============================  =====================================  ==========================
"""

from __future__ import annotations

import weakref
from array import array
from typing import Any

import numpy as np
import torch


def token_array(ids: Any) -> array[int]:
    """Token ids (a list, numpy array, tensor or ``array('q')``) as an ``array('q')``, the type
    SGLang's ``RadixKey`` holds (an ``array('q')`` is returned as is)."""
    if isinstance(ids, array) and ids.typecode == "q":
        return ids
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().to("cpu", torch.int64).numpy()
    if isinstance(ids, np.ndarray):
        return array("q", np.ascontiguousarray(ids, dtype=np.int64).tobytes())
    return array("q", [int(t) for t in ids])


def request_tokens(req: Any) -> array[int]:
    """The request's full token list (prompt then output) as an ``array('q')``; from the twin
    Req's cached token array when it has one."""
    stop = len(req.origin_input_ids) + len(req.output_ids)
    cached = getattr(req, "token_array", None)
    if cached is not None:
        return token_array(cached(stop))
    return array("q", [int(t) for t in req.origin_input_ids] + [int(t) for t in req.output_ids])


class InsertedLen:
    """0.5.23's ``req.kv.cache_inserted_len`` of each kvpool request (the tokens it already
    inserted into the tree: later inserts count hits only past it). SGLang keeps it on the
    request's KV record and zeroes it on retraction; kvpool's request has no such field, so the
    adapter keeps it here and forgets it when the request's KV is released (finish, abort,
    retract: a retracted request starts again at 0, as in SGLang)."""

    def __init__(self) -> None:
        self._lens: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def get(self, req: Any) -> int:
        return self._lens.get(req, 0)

    def set(self, req: Any, value: int) -> None:
        self._lens[req] = int(value)

    def forget(self, req: Any) -> None:
        self._lens.pop(req, None)


class CacheReq:
    """``req`` (a kvpool request) as SGLang's radix cache sees it (see the module docstring).
    ``tree_lock`` builds 0.5.23's ``TreeLock`` of a node (None on 0.5.16);
    ``inserted`` keeps ``cache_inserted_len``."""

    __slots__ = ("_done", "_inserted", "_node", "_tokens", "_tree_lock", "req")
    req: Any
    _inserted: InsertedLen
    _tokens: array[int] | None
    _tree_lock: Any
    _node: Any
    _done: bool

    def __init__(
        self,
        req: Any,
        inserted: InsertedLen | None = None,
        tree_lock: Any = None,
        node: Any = None,
    ):
        object.__setattr__(self, "req", req)
        object.__setattr__(self, "_inserted", inserted if inserted is not None else InsertedLen())
        object.__setattr__(self, "_tree_lock", tree_lock)
        object.__setattr__(self, "_done", False)
        # how a node SGLang hands back is kept on the kvpool request (the unified cache's
        # NodeId becomes a UnifiedNodeRef that kvpool's snapshot can number); None: as it is
        object.__setattr__(self, "_node", node if node is not None else (lambda n: n))
        object.__setattr__(self, "_tokens", None)

    def __setattr__(self, name: str, value: Any) -> None:
        # Only the properties below may be written (they carry setters).
        prop = type(self).__dict__.get(name)
        if not isinstance(prop, property) or prop.fset is None:
            raise AttributeError(f"SGLang wrote {name!r}, which kvpool's request does not map")
        prop.fset(self, value)

    # ------------------------------------------------------------------ tokens
    def _all(self) -> array[int]:
        tokens: array[int] | None = self._tokens
        if tokens is None:
            tokens = request_tokens(self.req)
            object.__setattr__(self, "_tokens", tokens)
        return tokens

    @property
    def origin_input_ids(self) -> array[int]:
        return self._all()[: len(self.req.origin_input_ids)]

    @property
    def output_ids(self) -> array[int]:
        return self._all()[len(self.req.origin_input_ids) :]

    @property
    def full_untruncated_fill_ids(self) -> array[int]:
        return self._all()

    def get_fill_ids(self) -> array[int]:
        return self._all()[: len(self.req.fill_ids)]

    # ------------------------------------------------------------------ plain fields
    @property
    def rid(self) -> str:
        return str(self.req.rid)

    @property
    def req_pool_idx(self) -> int | None:
        value = self.req.req_pool_idx
        return None if value is None else int(value)

    @property
    def extra_key(self) -> str | None:
        key: str | None = self.req.extra_key
        return key

    @property
    def cache_salt(self) -> None:
        return None

    @property
    def priority(self) -> int:
        return int(getattr(self.req, "priority", 0) or 0)

    @property
    def session_id(self) -> str | None:
        sid: str | None = getattr(self.req, "session_id", None)
        return sid

    def finished(self) -> bool:
        """0.5.23's unified cache: whether the request is being released (the adapter marks
        the proxy of a ``cache_finished_req`` call: :meth:`mark_finished`)."""
        return bool(self._done)

    def mark_finished(self) -> None:
        """The request is being released (``finished()`` answers True from now on)."""
        object.__setattr__(self, "_done", True)

    @property
    def finished_reason(self) -> None:
        return None

    @property
    def skip_radix_cache_insert(self) -> bool:
        """0.5.23: a request whose KV must not enter the tree; never in kvpool."""
        return False

    @property
    def swa_branching_seqlen(self) -> None:
        return None

    @property
    def session(self) -> None:
        """0.5.23's unified cache: the request's SGLang streaming session, None (kvpool's
        sessions hand rows over in kvpool's lifecycle, not through SGLang's session object)."""
        return None

    @property
    def kv_rotation_base(self) -> None:
        """0.5.23: the logical-page sharding base, None (sharding off)."""
        return None

    @property
    def cache_protected_len(self) -> int:
        return int(self.req.cache_protected_len)

    @cache_protected_len.setter
    def cache_protected_len(self, value: int) -> None:
        self.req.cache_protected_len = int(value)

    @property
    def last_node(self) -> Any:
        return self.req.last_node

    @last_node.setter
    def last_node(self, node: Any) -> None:
        self.req.last_node = None if node is None else self._node(node)

    @property
    def prefix_indices(self) -> Any:
        return self.req.prefix_indices

    @prefix_indices.setter
    def prefix_indices(self, value: Any) -> None:
        self.req.prefix_indices = as_prefix(value, self.req.prefix_indices)

    # ------------------------------------------------------------------ 0.5.23
    @property
    def lock(self) -> Any:
        node = self.req.last_node
        if node is None or self._tree_lock is None:
            return None
        return self._tree_lock(node)

    @lock.setter
    def lock(self, value: Any) -> None:
        # kvpool holds one lock per request, on last_node; SGLang sets both together
        # (``req.lock = lock(node); req.last_node = node``). Dropping it (None) leaves
        # last_node to kvpool, which forgets it with the other KV fields.
        if value is not None:
            self.req.last_node = self._node(value.node)

    @property
    def kv(self) -> CacheReqKv:
        return CacheReqKv(self)


class CacheReqKv:
    """0.5.23's ``req.kv`` (``ReqKvInfo``) view of a :class:`CacheReq`."""

    __slots__ = ("_owner",)
    _owner: CacheReq

    def __init__(self, owner: CacheReq) -> None:
        object.__setattr__(self, "_owner", owner)

    def __setattr__(self, name: str, value: Any) -> None:
        prop = type(self).__dict__.get(name)
        if not isinstance(prop, property) or prop.fset is None:
            raise AttributeError(f"SGLang wrote kv.{name!r}, which kvpool's request does not map")
        prop.fset(self, value)

    @property
    def req_pool_idx(self) -> int | None:
        return self._owner.req_pool_idx

    @property
    def cache_protected_len(self) -> int:
        return self._owner.cache_protected_len

    @cache_protected_len.setter
    def cache_protected_len(self, value: int) -> None:
        self._owner.cache_protected_len = value

    @property
    def cache_inserted_len(self) -> int:
        return self._owner._inserted.get(self._owner.req)

    @cache_inserted_len.setter
    def cache_inserted_len(self, value: int) -> None:
        self._owner._inserted.set(self._owner.req, value)

    @property
    def kv_committed_len(self) -> int:
        return int(self._owner.req.kv_committed_len)

    @property
    def kv_allocated_len(self) -> int:
        return int(self._owner.req.kv_allocated_len)

    @property
    def swa_evict_floor(self) -> int:
        return 0

    def get_evicted_seqlen(self, component_type: Any) -> int:
        return 0

    def swa_dead_lo(self, page_size: int) -> int:
        return max(self.cache_protected_len, self.swa_evict_floor)


def as_prefix(value: Any, like: Any) -> Any:
    """Slots SGLang set as ``prefix_indices`` (a tensor) in the container type of ``like``
    (kvpool's current value): an int64 tensor on its device, or a list of ints."""
    if isinstance(like, torch.Tensor):
        if isinstance(value, torch.Tensor):
            return value.to(like.device, torch.int64)
        return torch.tensor(list(value), dtype=torch.int64, device=like.device)
    if isinstance(value, torch.Tensor):
        out: list[int] = value.tolist()
        return out
    return [int(v) for v in value]


def row_prefix(table: Any, row: int, stop: int, like: Any) -> Any:
    """``table[row, :stop]`` (SGLang's int32 ``req_to_token``) in the container type of
    ``like``."""
    return as_prefix(table[row, :stop].to(torch.int64), like)


__all__ = [
    "CacheReq",
    "CacheReqKv",
    "InsertedLen",
    "as_prefix",
    "request_tokens",
    "row_prefix",
    "token_array",
]
