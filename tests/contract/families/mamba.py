"""Contracts of the ``mamba`` family: the hybrid Mamba family.

Reachable states (each driven by ``rng(seed)``):

- ``MambaSlotAllocator``: 8 slots, a seeded mix of allocations and frees (some slots held, some
  free), sometimes an open alloc group holding prefetched slots.
- ``MambaPool``: 6 slots over 2 layers, seeded slots written with state tags.
- ``HybridReqToTokenPool``: 4 rows of 8 columns, 12 Mamba slots, 0-2 track buffers (seeded);
  one to three requests admitted (rows, Mamba slots, track buffers) and their rows written.
- ``MambaRadixCache`` / ``MambaLifecycleCache``: a hybrid pool (4 rows, 6 Mamba slots) over 24
  token slots; seeded keys inserted with their KV and a state each (a chain of prefixes and a
  branch), some node locked, sometimes a state evicted (a tombstone). The lifecycle cache also
  has a running request: matched, locked, its row written with the tree's slots and its own.
- ``LRUList``: both orders over a small tree of nodes, one node locked.

``MambaTreeNode`` and ``MambaMatchResult`` have no public method (plain records). A tree's state
is its snapshot, its allocator's and its hybrid pool's (the Mamba slots and state tags), and the
fields of every request the builder made. The three pools are built in
:mod:`tests.contract.families.mamba_pools`; this module builds the trees and the LRU list and
assembles the family.
"""

from __future__ import annotations

from typing import Any

from tests.bad_inputs.harness import Twin
from tests.contract.families.mamba_pools import (
    HYBRID_EXEMPT,
    HYBRID_METHODS,
    POOL_METHODS,
    SLOT_ALLOCATOR_EXEMPT,
    SLOT_ALLOCATOR_METHODS,
    _fields,
    _free_mamba_of,
    _hybrid,
    _pool,
    _slot_allocator,
)
from tests.contract.machinery import Bad, Family, Method, Subject, klass, make, rng

# --------------------------------------------------------------------------- trees
TREES = ("MambaRadixCache", "MambaLifecycleCache")


def _key(side: Twin, tokens: list[int]) -> Any:
    return klass(side, "RadixKey")(tokens)


def _tree(side: Twin, cls: str, seed: int, **kw: Any) -> Subject:
    """A tree over 24 token slots and 6 Mamba slots holding seeded keys (see the module
    docstring); ``kw`` goes to the tree's constructor."""
    r = rng(seed)
    pool = make(side, "HybridReqToTokenPool", 4, 16, 6)
    alloc = make(side, "TokenToKVPoolAllocator", 24)
    tree = make(side, cls, pool, alloc, **kw)
    base = [r.randint(1, 9) for _ in range(r.randint(3, 5))]
    keys = [base[: r.randint(1, len(base))], base, [*base[:2], 50 + r.randint(0, 9)]]
    for tokens in keys:
        kv = alloc.alloc(len(tokens))
        (slot,) = pool.mamba_allocator.alloc(1)
        pool.mamba_pool.write_state(side.idx([slot]), side.idx([r.randint(1, 999)]))
        _, exist = tree.insert(_key(side, tokens), kv, slot, 0)
        if exist:
            pool.mamba_allocator.free([slot])
    nodes = [n for n in tree._nodes() if n is not tree.root_node]
    locked = r.choice(nodes)
    tree.inc_lock_ref(locked)
    if r.random() < 0.5:
        tree.evict_mamba(1)
    reqs: list[Any] = []
    if cls in ("MambaLifecycleCache", "UnifiedMambaLifecycleCache"):
        reqs.append(_running(side, tree, pool, alloc, base, r.randint(1, 3)))
    unlocked = [n for n in tree._nodes() if n is not tree.root_node and n.full_lock_ref == 0]
    (held_state,) = pool.mamba_allocator.alloc(1)  # what an insert's caller holds
    held = {"kv": [int(x) for x in alloc.alloc(2)], "state": held_state}

    def state() -> Any:
        return (
            tree.snapshot(),
            alloc.snapshot(),
            pool.hybrid_snapshot([(row, 16) for row in range(1, 5)]),
            tuple(_fields(q) for q in reqs),
        )

    return Subject(
        tree,
        state,
        {
            "pool": pool,
            "alloc": alloc,
            "locked": locked,
            "unlocked": unlocked,
            "reqs": reqs,
            "free_kv": _free_kv_slot(alloc),
            "held_kv": held,
        },
    )


def _free_kv_slot(alloc: Any) -> int | None:
    free = alloc.snapshot().free_pages  # page size 1: a page is a slot
    return int(free[0]) if free else None


def _running(side: Twin, tree: Any, pool: Any, alloc: Any, base: list[int], extra: int) -> Any:
    """A running request: its prompt extends a cached key; matched, locked, admitted, its row
    written with the matched slots and ``extra`` of its own, all of it committed."""
    tokens = [*base, *range(60, 60 + extra)]
    req = klass(side, "Req")("run", tokens)
    match = tree.match_prefix(_key(side, tokens))
    prefix = [int(x) for x in match.device_indices]
    tree.inc_lock_ref(match.last_device_node)
    req.last_node = match.last_device_node
    pool.alloc([req])
    own = [int(x) for x in alloc.alloc(len(tokens) - len(prefix))]
    pool.write((req.req_pool_idx, slice(0, len(tokens))), side.idx(prefix + own))
    req.prefix_indices = side.idx(prefix)
    req.fill_ids = list(tokens)
    req.kv_committed_len = req.kv_allocated_len = len(tokens)
    req.cache_protected_len = len(prefix)
    req.state = "running"
    return req


def _other_tree_node(side: Twin, s: Subject) -> Any:
    other = _tree(side, type(s.obj).__name__, 1)
    return other.handles["locked"]


def _detached(side: Twin, s: Subject) -> Any:
    node_cls = klass(side, "MambaTreeNode")
    value: Any = [3] if side.is_ref else side.idx([3])
    return node_cls(999, _key(side, [7]), value, s.obj.root_node, 1)


def _bad_nodes(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("other-tree", _other_tree_node(side, s)), Bad("detached", _detached(side, s))]


def _bad_unlock(side: Twin, s: Subject) -> list[Bad]:
    out = _bad_nodes(side, s)
    if s.handles["unlocked"]:
        out.append(Bad("not-locked", s.handles["unlocked"][0]))
    return out


def _insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    """A new key of two tokens at the two KV slots and the Mamba slot the caller holds."""
    held = s.handles["held_kv"]
    return {
        "key": _key(side, [90, 91]),
        "value": side.idx(held["kv"]),
        "mamba_value": held["state"],
        "prev_prefix_len": 0,
    }


def _bad_insert_value(side: Twin, s: Subject) -> list[Bad]:
    kv = s.handles["held_kv"]["kv"]
    dev = not side.is_ref
    out = [
        Bad("too-short", side.idx(kv[:1])),
        Bad("slot-0", side.idx([0, kv[1]]), dev),
        Bad("past-pool", side.idx([kv[0], 99]), dev),
        Bad("duplicate", side.idx([kv[0], kv[0]]), True),
    ]
    if s.handles["free_kv"] is not None:
        out.append(Bad("free-slot", side.idx([kv[0], s.handles["free_kv"]]), True))
    return out


def _bad_state_slot(side: Twin, s: Subject) -> list[Bad]:
    tree_state = s.obj.all_mamba_values()[0] if s.obj.all_mamba_values() else None
    out = [
        Bad("slot-0", 0),
        Bad("past-pool", 999),
        Bad("free-slot", _free_mamba_of(s.handles["pool"])),
    ]
    if tree_state is not None:
        # the twin walks the tree's states for this only in checked mode
        out.append(Bad("the-tree's-slot", tree_state, device_read=True))
    return out


def _bad_prev(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("past-key", 3)]


def _match_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"key": _key(side, [1, 2]), "req": None, "cow_mamba": False}


TREE_METHODS = {
    "match_prefix": Method(
        _match_args,
        bad={
            "req": lambda side, s: [Bad("not-a-request", 3)],
            "cow_mamba": lambda side, s: [Bad("cow-without-req", True)],
        },
    ),
    "insert": Method(
        _insert_args,
        bad={
            "value": _bad_insert_value,
            "mamba_value": _bad_state_slot,
            "prev_prefix_len": _bad_prev,
        },
    ),
    "inc_lock_ref": Method(lambda side, s: {"node": s.handles["locked"]}, bad={"node": _bad_nodes}),
    "dec_lock_ref": Method(
        lambda side, s: {"node": s.handles["locked"]}, bad={"node": _bad_unlock}
    ),
    "evict": Method(
        lambda side, s: {"num_tokens": 0, "mamba_num": 0}, unbounded=("num_tokens", "mamba_num")
    ),
    "evict_full": Method(lambda side, s: {"full_num_tokens": 0}, unbounded=("full_num_tokens",)),
    "evict_mamba": Method(lambda side, s: {"mamba_num": 0}, unbounded=("mamba_num",)),
    "all_mamba_values": Method(reads=True),
    "full_evictable_size": Method(reads=True),
    "full_protected_size": Method(reads=True),
    "mamba_evictable_size": Method(reads=True),
    "mamba_protected_size": Method(reads=True),
    "snapshot": Method(reads=True),
}


def _lifecycle_lock(side: Twin, s: Subject) -> list[Bad]:
    """Not a node (None is a request never matched: a documented no-op), or not this tree's."""
    return [Bad("int", 3), Bad("str", "x"), Bad("object", object()), *_bad_nodes(side, s)]


def _lifecycle_unlock(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("int", 3), Bad("str", "x"), Bad("object", object()), *_bad_unlock(side, s)]


def _release_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"req": s.handles["reqs"][0], "row_read": None}


def _bad_release_req(side: Twin, s: Subject) -> list[Bad]:
    """Requests in the wrong phase or with lengths the tree cannot take."""
    req = s.handles["reqs"][0]
    waiting = klass(side, "Req")("w", [1, 2])
    out = [Bad("waiting", waiting), Bad("not-a-request", 3)]
    for name, value in (
        ("kv_committed_len", len(req.fill_ids) + 5),
        ("kv_committed_len", -1),
        ("kv_committed_len", True),
        ("cache_protected_len", len(req.fill_ids) + 1),
        ("cache_protected_len", -2),
        ("mamba_pool_idx", 999),
        ("mamba_pool_idx", True),
        ("req_pool_idx", 99),
        ("req_pool_idx", 1.5),
    ):
        out.append(Bad(f"{name}={value!r}", _variant(side, s, name, value)))
    return out


def _variant(side: Twin, s: Subject, name: str, value: Any) -> Any:
    """A copy of the running request with one field changed (the original stays in state)."""
    req = s.handles["reqs"][0]
    req_cls: Any = klass(side, "Req")
    copy = req_cls.__new__(req_cls)
    copy.__dict__.update(vars(req))
    setattr(copy, name, value)
    return copy


def _bad_row_read(side: Twin, s: Subject) -> list[Bad]:
    req = s.handles["reqs"][0]
    row = [int(x) for x in s.handles["pool"].read(req.req_pool_idx, 0, req.kv_committed_len)]
    out = [Bad("too-short", side.idx(row[:-1])), Bad("slot-0", side.idx([0] * len(row)), True)]
    if s.handles["free_kv"] is not None:
        out.append(Bad("free-slots", side.idx([*row[:-1], s.handles["free_kv"]]), True))
    return out


LIFECYCLE_METHODS = {
    "cache_finished_req": Method(
        lambda side, s: {**_release_args(side, s), "is_insert": True},
        bad={"req": _bad_release_req, "row_read": _bad_row_read},
    ),
    "cache_unfinished_req": Method(
        lambda side, s: {**_release_args(side, s), "chunked": False},
        bad={"req": _bad_release_req, "row_read": _bad_row_read},
    ),
    "inc_lock_ref": Method(
        lambda side, s: {"node": s.handles["locked"]}, bad={"node": _lifecycle_lock}, generic=()
    ),
    "dec_lock_ref": Method(
        lambda side, s: {"node": s.handles["locked"]}, bad={"node": _lifecycle_unlock}, generic=()
    ),
    "evictable_size": Method(reads=True),
    "protected_size": Method(reads=True),
}
LIFECYCLE_EXEMPT = {
    "alloc_mamba_slot": "takes one slot (evicting a state when none is free); no argument, "
    "and its OutOfMemoryError changes nothing",
}
TREE_EXEMPT = {"reset": "forgets the tree without freeing anything: legal in every state"}


# --------------------------------------------------------------------------- LRU list
def _lru(side: Twin, seed: int) -> Subject:
    r = rng(seed)
    node_cls = klass(side, "MambaTreeNode")
    lru = klass(side, "LRUList")(mamba=r.random() < 0.5)
    root = node_cls(0, _key(side, []), side.idx([]), None, None)
    nodes = [root]
    for i in range(1, 5):
        parent = r.choice(nodes)
        node = node_cls(i, _key(side, [i]), side.idx([i]), parent, i)
        parent.children[i] = node
        nodes.append(node)
        lru.insert_mru(node)
    nodes[r.randint(1, 4)].full_lock_ref = nodes[r.randint(1, 4)].mamba_lock_ref = 1
    outsider = node_cls(9, _key(side, [9]), side.idx([9]), root, 9)
    return Subject(
        lru, lambda: _lru_state(lru), {"nodes": nodes, "root": root, "outsider": outsider}
    )


def _lru_state(lru: Any) -> tuple[int, ...]:
    """The order by object identity (robust to a call that let a non-node in)."""
    order = lru.order if hasattr(lru, "order") else list(lru._order.values())
    return tuple(id(n) for n in order)


def _lru_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("int", 3), Bad("str", "x"), Bad("object", object()), Bad("None", None)]


LRU_METHODS = {
    "LRUList.insert_mru": Method(
        lambda side, s: {"node": s.handles["outsider"]},
        bad={
            "node": lambda side, s: [*_lru_bad(side, s), Bad("already-in", s.handles["nodes"][1])]
        },
        generic=(),
    ),
    "LRUList.remove": Method(
        lambda side, s: {"node": s.handles["nodes"][1]},
        bad={"node": lambda side, s: [*_lru_bad(side, s), Bad("not-in", s.handles["outsider"])]},
        generic=(),
    ),
    "LRUList.reset_node_mru": Method(
        lambda side, s: {"node": s.handles["nodes"][1]},
        bad={"node": lambda side, s: [*_lru_bad(side, s), Bad("not-in", s.handles["outsider"])]},
        generic=(),
    ),
    "LRUList.reset_node_and_parents_mru": Method(
        lambda side, s: {"node": s.handles["nodes"][1], "root": s.handles["root"]},
        bad={
            "node": lambda side, s: [*_lru_bad(side, s), Bad("not-in", s.handles["outsider"])],
            "root": lambda side, s: [
                *_lru_bad(side, s),
                Bad("not-an-ancestor", s.handles["outsider"]),
            ],
        },
        generic=(),
    ),
    "LRUList.lru_no_lock": Method(lambda side, s: {"leaf_only": False}),
    "LRUList.ids": Method(reads=True),
}


# --------------------------------------------------------------------------- the family
def _build(side: Twin, cls: str, seed: int) -> Subject:
    if cls == "MambaSlotAllocator":
        return _slot_allocator(side, seed)
    if cls == "MambaPool":
        return _pool(side, seed)
    if cls == "HybridReqToTokenPool":
        return _hybrid(side, seed)
    if cls in TREES:
        return _tree(side, cls, seed)
    if cls == "LRUList":
        return _lru(side, seed)
    raise NotImplementedError(cls)  # MambaTreeNode, MambaMatchResult: no public method


FAMILY = Family(
    name="mamba",
    classes=(
        "MambaPool",
        "MambaSlotAllocator",
        "HybridReqToTokenPool",
        "MambaRadixCache",
        "MambaLifecycleCache",
        "MambaTreeNode",
        "LRUList",
        "MambaMatchResult",
    ),
    build=_build,
    methods={
        **{f"MambaSlotAllocator.{k}": v for k, v in SLOT_ALLOCATOR_METHODS.items()},
        **{f"MambaPool.{k}": v for k, v in POOL_METHODS.items()},
        **HYBRID_METHODS,
        **{f"{c}.{k}": v for c in TREES for k, v in TREE_METHODS.items()},
        **{f"MambaLifecycleCache.{k}": v for k, v in LIFECYCLE_METHODS.items()},
        **LRU_METHODS,
    },
    exempt={
        **SLOT_ALLOCATOR_EXEMPT,
        **HYBRID_EXEMPT,
        **{f"{c}.{k}": v for c in TREES for k, v in TREE_EXEMPT.items()},
        **{f"MambaLifecycleCache.{k}": v for k, v in LIFECYCLE_EXEMPT.items()},
    },
)
