"""Contracts of the ``hicache`` family: the host tier (host pool, transfer controller, the
hierarchical radix cache and its collaborators).

Reachable states (:func:`_rig`): a 16-slot MHA device pool (page size 1), its allocator, a host
pool of 17 slots and a request table of 4 rows under a ``HiRadixCache`` whose write policy, and
whether it runs SGLang 0.5.23's unified host tier, the seed picks. The seed then drives legal
calls: a request takes a row and device slots (not in the tree), two spare device slots stay
with the caller, a few token sequences are inserted (hits start write-throughs), some write
acknowledgements are delivered, the device is evicted (host-only nodes), some sequences are
inserted again, a host-only node may be loaded back (a load in flight), and a storage prefetch
may start, fetch pages and be aborted (host slots queued for release). The collaborators
(``HostEviction``, ``StoragePrefetch``, ``UnifiedHostTier``), the controller and the nodes are
reached through that tree (an unpinned node for ``HiTreeNode``); an acknowledgement and a
prefetch operation are built on their own; the host pools (MHA and MLA, page size 2, 18 slots)
over their device pools, with a seeded mix of host allocations and frees. Those three (and the
value helpers the family shares) live in :mod:`tests.contract.families.hicache_host`; this
module builds the tree and its collaborators and assembles the family.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

from kvpool.rules import Rules
from kvpool.tags import kv_tags
from tests.bad_inputs.harness import Twin
from tests.contract.families.hicache_host import (
    HOST_METHODS,
    OPERATION_METHODS,
    _ack,
    _host_pool,
    _host_slot_bads,
    _operation,
    _opts,
    _plain,
    _slots,
)
from tests.contract.machinery import Bad, Family, Method, Subject, klass, rng

POLICIES = ("write_through", "write_through_selective", "write_back")
UNIFIED = replace(
    Rules(),
    hicache_host_tier="unified",
    tree_free="segment",
    hit_count="inserted_len",
    release_path="checkpoint",
)


# --------------------------------------------------------------------------- the rig
def _rig(side: Twin, seed: int) -> SimpleNamespace:
    """A tree in the state ``seed`` reaches (module docstring)."""
    r = rng(seed)
    unified = r.random() < 0.35
    policy = r.choice(POLICIES)
    dev = klass(side, "MHATokenToKVPool")(16, 1, "float32", 1, 2, 2, **_opts(side))
    alloc = klass(side, "TokenToKVPoolAllocator")(16, **_opts(side))
    host = klass(side, "MHATokenToKVPoolHost")(dev, 1.0, 0, 1)
    pool = klass(side, "ReqToTokenPool")(4, 32, **_opts(side))
    tree = klass(side, "HiRadixCache")(
        pool,
        alloc,
        1,
        host,
        write_policy=policy,
        load_back_threshold=1,
        prefetch_threshold=2,
        enable_storage=True,
        rules=UNIFIED if unified else None,
        **_opts(side),
    )
    key = klass(side, "RadixKey")
    # a request holding a row and its own device slots (nothing cached yet)
    req = klass(side, "Req")("q0", [7, 8, 9][: r.randint(2, 3)])
    pool.alloc([req])
    n = len(req.origin_input_ids)
    slots = alloc.alloc(n)
    pool.write((req.req_pool_idx, slice(0, n)), slots)
    dev.write_tags(slots, kv_tags(req.origin_input_ids))
    req.fill_ids = list(req.origin_input_ids)
    req.kv_committed_len = req.kv_allocated_len = n
    req.last_node = tree.root_node
    spare = _plain(alloc.alloc(2))

    def insert(tokens: list[int]) -> None:
        got = alloc.alloc(len(tokens))
        if got is None:
            tree.evict(len(tokens))
            got = alloc.alloc(len(tokens))
        if got is None:
            return
        dev.write_tags(got, kv_tags(tokens))
        cached = int(tree.insert(key(tokens), got))
        if cached and not tree.frees_duplicates:
            alloc.free(got[:cached])

    seqs: list[list[int]] = []
    for _ in range(r.randint(3, 5)):
        base = r.choice(seqs)[: r.randint(1, 2)] if seqs and r.random() < 0.6 else []
        seqs.append(base + [r.randint(1, 5) for _ in range(r.randint(1, 3))])
        insert(seqs[-1])
    tree.writing_check(r.randint(0, 2))
    tree.evict(r.randint(1, 6))
    for s in r.sample(seqs, r.randint(0, 2)):
        insert(s)
    host_only = [n for n in _nodes(tree) if n.evicted]
    if host_only and r.random() < 0.5:
        tree.init_load_back(r.choice(host_only))
        if r.random() < 0.5:
            tree.ready_to_load_host_cache()
    if r.random() < 0.6:
        anchor = tree.match_prefix(key(r.choice(seqs))).last_host_node
        started = tree.prefetch_from_storage("p0", anchor, [1, 2, 3, 4])
        if started and r.random() < 0.7 and tree.storage_hit("p0", 4):
            tree.prefetch_io("p0", r.randint(0, 2))
            if r.random() < 0.4:  # an abort: the fetched host slots wait in the release queue
                tree.release_aborted_request("p0")
    parts = {"dev": dev, "alloc": alloc, "host": host, "pool": pool, "tree": tree}
    return SimpleNamespace(**parts, key=key, req=req, spare=spare, seqs=seqs)


def _nodes(tree: Any) -> list[Any]:
    """Every node but the root, parents first."""
    out, stack = [], list(tree.root_node.children.values())
    while stack:
        node = stack.pop(0)
        out.append(node)
        stack.extend(node.children.values())
    return out


def _tree_state(g: SimpleNamespace) -> Any:
    """:func:`_read_tree_state`, or a marker when a bad call left the state unreadable (a
    corrupted queue): then the state changed."""
    try:
        return _read_tree_state(g)
    except Exception as exc:  # the call under test broke the state; report it, do not crash
        return ("unreadable", type(exc).__name__, str(exc))


NODE_FIELDS = ("node_id", "load_back_pending_id", "write_through_pending_id", "creation_time",
               "host_ref_counter", "lock_ref")  # fmt: skip
OP_FIELDS = ("request_id", "storage_hit_count", "completed_tokens", "terminated")
REQ_FIELDS = ("req_pool_idx", "cache_protected_len", "cache_inserted_len", "kv_committed_len",
              "fill_ids")  # fmt: skip


def _fields(obj: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in names)


def _read_tree_state(g: SimpleNamespace) -> Any:
    """Everything a call on the tree or a collaborator could change: the whole host tier
    (device allocator, tree, host pool, transfers, prefetches, release queue, device tags),
    the sizes, the pending writes and loads, the unified registries, each node's host marks,
    the prefetch operations, the request table and the request."""
    t, cc, q = g.tree, g.tree.cache_controller, g.req
    ops = [op for _, _, op in t.ongoing_prefetch.values()] + list(cc.prefetch_buffer)
    return (
        t.host_snapshot(),
        (t.evictable_size_, t.protected_size_, cc.producer_count),
        {k: (a.node_id, [n.node_id for n in b]) for k, (a, b) in t.ongoing_write_through.items()},
        {k: v.node_id for k, v in t.ongoing_load_back.items()},
        list(t.unified_tier.full_host_duplicates),
        {k: [n.node_id for n in v] for k, v in t.unified_tier.load_host_pins.items()},
        [_fields(n, NODE_FIELDS) for n in _nodes(t)],
        [(_fields(op, OP_FIELDS), _plain(op.host_indices), _plain(op.tags)) for op in ops],
        g.pool.snapshot([(row, 32) for row in range(1, 5)]),
        (_fields(q, REQ_FIELDS), _plain(q.prefix_indices), getattr(q.last_node, "node_id", None)),
    )


def _handles(g: SimpleNamespace) -> dict[str, Any]:
    nodes = _nodes(g.tree)
    device = [n for n in nodes if not n.evicted]
    other = _rig(Twin(g.side.name, g.side.checked), 1)
    detached = klass(g.side, "HiTreeNode")(999, g.key([9]), _slots(g.side, [3]), None, 0.0)
    return {
        "g": g,
        "device": device[-1] if device else g.tree.root_node,
        "unbacked": next((n for n in device if n.host_value is None), None),
        "backed": next((n for n in device if n.host_value is not None), None),
        "host_only": next((n for n in nodes if n.evicted), None),
        "foreign": _nodes(other.tree)[0] if _nodes(other.tree) else other.tree.root_node,
        "detached": detached,
    }


def _tree_subject(side: Twin, seed: int, obj: Any = None) -> Subject:
    g = _rig(side, seed)
    g.side = side
    s = Subject(obj if obj is not None else g.tree, lambda: _tree_state(g))
    s.handles = _handles(g)
    return s


# --------------------------------------------------------------------------- bad values
def _node_bads(side: Twin, s: Subject) -> list[Bad]:
    """Nodes a call on this tree must refuse: of another tree, detached."""
    return [Bad("foreign-node", s.handles["foreign"]), Bad("detached-node", s.handles["detached"])]


def _device_node_bads(side: Twin, s: Subject) -> list[Bad]:
    out = _node_bads(side, s)
    if s.handles["host_only"] is not None:
        out.append(Bad("host-only-node", s.handles["host_only"]))
    return out


def _slot_bads(side: Twin, s: Subject) -> list[Bad]:
    """Device slots a caller cannot hand over: reserved 0, past the pool, a free one, twice."""
    g = s.handles["g"]
    spare = g.spare[0]
    free = sorted(set(range(1, 17)) - _held(g))
    out = [
        Bad("slot-0", _slots(side, [0, spare]), device_read=True),
        Bad("past-pool", _slots(side, [40, spare]), device_read=True),
        Bad("duplicate", _slots(side, [spare, spare]), device_read=True),
    ]
    if free:
        out.append(Bad("free-slot", _slots(side, [free[0], spare]), device_read=True))
    return out


def _held(g: SimpleNamespace) -> set[int]:
    snap = g.alloc.snapshot()
    return set(range(1, 17)) - set(snap.free_pages) - set(snap.release_pages)


def _req_bads(side: Twin, s: Subject) -> list[Bad]:
    """Requests in the wrong phase: no row, a lock on a node of another tree."""
    g = s.handles["g"]
    no_row = klass(side, "Req")("x", [7, 8])
    other = klass(side, "Req")("y", list(g.req.origin_input_ids))
    for f in ("req_pool_idx", "fill_ids", "kv_committed_len", "kv_allocated_len"):
        setattr(other, f, getattr(g.req, f))
    other.last_node = s.handles["foreign"]
    return [Bad("no-row", no_row), Bad("locks-foreign-node", other)]


def _key(s: Subject, tokens: list[int]) -> Any:
    return s.handles["g"].key(tokens)


# --------------------------------------------------------------------------- the tree
def _insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    g = s.handles["g"]
    return {
        "key": _key(s, [6, 6]),
        "value": _slots(side, g.spare),
        "priority": 0,
        "chunked": False,
        "inserted_len": None,
        "prev_prefix_len": 0,
    }


def _root(s: Subject) -> Any:
    return s.handles["g"].tree.root_node


def _unbacked_bads(side: Twin, s: Subject) -> list[Bad]:
    """Nodes a new backup must refuse: :func:`_device_node_bads`, and one backed up already
    (a second backup would leak the first's host slots)."""
    backed = s.handles["backed"]
    return [*_device_node_bads(side, s), *([Bad("backed-up", backed)] if backed else [])]


def _req(s: Subject) -> Any:
    return s.handles["g"].req


def _node(name: str) -> Any:
    return lambda side, s: {"node": s.handles[name] or s.handles["device"]}


def _count(*names: str) -> Any:
    return lambda side, s: dict.fromkeys(names, 1)


TREE_READS = ("evictable_size", "protected_size", "total_size", "host_snapshot", "snapshot",
              "pretty_print", "prefetch_snapshots")  # fmt: skip

TREE_METHODS = {
    "match_prefix": Method(lambda side, s: {"key": _key(s, [1, 2])}),
    "insert": Method(
        _insert_args,
        bad={
            "value": _slot_bads,
            "inserted_len": lambda side, s: [Bad("negative", -1), Bad("bool", True)],
        },
        signed=("priority",),
    ),
    "inc_lock_ref": Method(_node("device"), bad={"node": _device_node_bads}),
    "dec_lock_ref": Method(_node("device"), bad={"node": _node_bads}),
    "evict": Method(_count("num_tokens")),
    "evict_host": Method(_count("num_tokens")),
    "writing_check": Method(lambda side, s: {"num_acks": 0, "write_back": False}),
    "loading_check": Method(lambda side, s: {"num_acks": 0}),
    "load_back": Method(
        lambda side, s: {"node": s.handles["host_only"] or s.handles["device"], "mem_quota": 0},
        bad={"node": _node_bads},
        answer=lambda got: got is None,
    ),
    "init_load_back": Method(
        lambda side, s: {"node": s.handles["device"], "mem_quota": None}, bad={"node": _node_bads}
    ),
    "write_backup": Method(
        lambda side, s: {"node": s.handles["unbacked"] or s.handles["device"], "write_back": False},
        bad={"node": lambda side, s: [*_unbacked_bads(side, s), Bad("root", _root(s))]},
    ),
    "checkpoint": Method(
        lambda side, s: {"req": _req(s), "up_to": 2, "chunked": False},
        bad={"req": _req_bads, "up_to": lambda side, s: [Bad("past-tokens", 9)]},
    ),
    "cache_finished_req": Method(
        lambda side, s: {"req": _req(s), "is_insert": True, "row_read": None},
        bad={"req": _req_bads, "row_read": lambda side, s: [Bad("too-short", _slots(side, []))]},
    ),
    "cache_unfinished_req": Method(
        lambda side, s: {"req": _req(s), "chunked": False, "row_read": None},
        bad={"req": _req_bads, "row_read": lambda side, s: [Bad("too-short", _slots(side, []))]},
    ),
    "prefetch_from_storage": Method(
        lambda side, s: {
            "req_id": "p9",
            "last_host_node": s.handles["g"].tree.root_node,
            "new_input_tokens": [1, 2],
            "extra_key": None,
        },
        bad={
            "last_host_node": _node_bads,
            "new_input_tokens": lambda side, s: [Bad("negative-token", [1, -2])],
            "extra_key": lambda side, s: [Bad("not-a-str", 3)],
        },
    ),
    "storage_hit": Method(lambda side, s: {"req_id": "p0", "hit_tokens": 2}),
    "check_prefetch_progress": Method(lambda side, s: {"req_id": "p0"}),
    "release_aborted_request": Method(lambda side, s: {"rid": "p0"}),
    "prefetch_io": Method(lambda side, s: {"req_id": "p0", "num_pages": 1}),
    **dict.fromkeys(TREE_READS, Method(reads=True)),
}

TREE_EXEMPT = {
    "HiRadixCache.reset": "forgets the tree and clears the host pool: legal in every state",
    "HiRadixCache.ready_to_load_host_cache": "issues the queued loads: legal in every state",
    "HiRadixCache.drain_storage_control_queues": "frees the queued host slots, every one held "
    "by the queue: legal in every state",
    "StoragePrefetch.drain_storage_control_queues": "frees the queued host slots, every one "
    "held by the queue: legal in every state",
    "reset": "forgets its own records (frees nothing): legal in every state",
}


# --------------------------------------------------------------------------- collaborators
def _split_args(side: Twin, s: Subject) -> dict[str, Any]:
    """A node below another (not the root) and its parent; else the device node twice (the
    call then refuses, which no bad value below relies on)."""
    low = next(
        (n for n in _nodes(s.handles["g"].tree) if n.parent is not s.handles["g"].tree.root_node),
        None,
    )
    return {"low": low or s.handles["device"], "upper": low.parent if low else s.handles["device"]}


def _loading(s: Subject) -> Any:
    pending = list(s.handles["g"].tree.ongoing_load_back.values())
    return pending[0] if pending else s.handles["device"]


def _no_load_bads(side: Twin, s: Subject) -> list[Bad]:
    out = _node_bads(side, s)
    idle = [
        n
        for n in _nodes(s.handles["g"].tree)
        if n.node_id not in s.handles["g"].tree.ongoing_load_back
    ]
    if idle:
        out.append(Bad("no-load-in-flight", idle[0]))
    return out


UNIFIED_METHODS = {
    "backup_chain": Method(
        lambda side, s: {"node": s.handles["unbacked"] or s.handles["device"], "write_back": False},
        bad={"node": _unbacked_bads},
    ),
    "checkpoint": TREE_METHODS["checkpoint"],
    "finish_load_back": Method(
        lambda side, s: {"anchor": _loading(s)}, bad={"anchor": _no_load_bads}
    ),
    "load_back": Method(
        lambda side, s: {
            "last_hit_node": s.handles["host_only"] or s.handles["device"],
            "mem_quota": None,
        },
        bad={"last_hit_node": _node_bads},
        answer=lambda got: got is None,
    ),
    "split": Method(
        _split_args,
        bad={
            "low": _node_bads,
            "upper": lambda side, s: [
                *_node_bads(side, s),
                Bad("not-the-parent", s.handles["g"].tree.root_node),
            ],
        },
    ),
    "track_duplicate": Method(_node("device"), bad={"node": _node_bads}),
}


# --------------------------------------------------------------------------- the controller
def _ack_args(side: Twin, s: Subject) -> dict[str, Any]:
    cc = s.handles["g"].tree.cache_controller
    acks = cc.ack_write_queue + cc.ack_load_queue
    return {"ack": acks[0] if acks else _fresh_ack(side)}


def _fresh_ack(side: Twin) -> Any:
    return klass(side, "HiCacheAck")("write", [1], _slots(side, [0]), _slots(side, [3]))


def _host_only_slots(side: Twin, s: Subject) -> Any:
    node = s.handles["host_only"]
    return _slots(side, _plain(node.host_value)[:1] if node is not None else [])


CONTROLLER_METHODS = {
    "append_host_mem_release": Method(
        lambda side, s: {"host_indices": _slots(side, [])}, bad={"host_indices": _host_slot_bads}
    ),
    "complete": Method(
        _ack_args, bad={"ack": lambda side, s: [Bad("not-in-flight", _fresh_ack(side))]}
    ),
    "evict_device": Method(
        lambda side, s: {"device_indices": _slots(side, s.handles["g"].spare)},
        bad={"device_indices": _slot_bads},
    ),
    "evict_host": Method(
        lambda side, s: {"host_indices": _slots(side, [])}, bad={"host_indices": _host_slot_bads}
    ),
    "load": Method(
        lambda side, s: {"host_indices": _host_only_slots(side, s), "node_id": -1},
        bad={"host_indices": _host_slot_bads},
        signed=("node_id",),
    ),
    "prefetch": Method(lambda side, s: {"request_id": "p5", "tags": _slots(side, [5, 6])}),
    "prefetch_io": Method(lambda side, s: {"request_id": "p0", "num_pages": 1}),
    "terminate_prefetch": Method(
        lambda side, s: {"operation": klass(side, "PrefetchOperation")("p7", _slots(side, [1]))}
    ),
    "write": Method(
        lambda side, s: {
            "device_indices": _slots(side, s.handles["g"].spare),
            "node_id": -1,
            "flush": True,
        },
        bad={"device_indices": _slot_bads},
        signed=("node_id",),
    ),
    "worker_held": Method(reads=True),
}

CONTROLLER_EXEMPT = {
    "start_loading": "issues the queued loads as one transfer: legal in every state",
    "start_writing": "issues the queued writes as one transfer: legal in every state",
    "drain_release": "frees the queued host slots, every one held by the queue: legal in "
    "every state",
}


# --------------------------------------------------------------------------- the family
TREE_CLASSES = (
    "HiRadixCache",
    "HiCacheController",
    "HiTreeNode",
    "HostEviction",
    "StoragePrefetch",
    "UnifiedHostTier",
)


def _build(side: Twin, cls: str, seed: int) -> Subject:
    if cls in ("HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost"):
        return _host_pool(side, cls, seed)
    if cls == "HiCacheAck":
        return _ack(side, seed)
    if cls == "PrefetchOperation":
        return _operation(side, seed)
    s = _tree_subject(side, seed)
    tree = s.handles["g"].tree
    if cls == "HiTreeNode":  # an unpinned node: release_host must refuse
        node = next((n for n in _nodes(tree) if n.host_ref_counter == 0), tree.root_node)
        s.obj = node
    elif cls != "HiRadixCache":
        s.obj = {
            "HiCacheController": tree.cache_controller,
            "HostEviction": tree.host_eviction,
            "StoragePrefetch": tree.storage_prefetch,
            "UnifiedHostTier": tree.unified_tier,
        }[cls]
    return s


def _scoped(cls: str, table: dict[str, Any]) -> dict[str, Any]:
    return {f"{cls}.{k}": v for k, v in table.items()}


_PREFETCH = (
    "prefetch_from_storage",
    "storage_hit",
    "check_prefetch_progress",
    "release_aborted_request",
    "prefetch_io",
    "prefetch_snapshots",
)

FAMILY = Family(
    name="hicache",
    classes=(
        "HiCacheAck",
        "HiCacheController",
        "PrefetchOperation",
        "HiRadixCache",
        "HiTreeNode",
        "HostEviction",
        "HostKVCache",
        "MHATokenToKVPoolHost",
        "MLATokenToKVPoolHost",
        "StoragePrefetch",
        "UnifiedHostTier",
    ),
    build=_build,
    methods={
        **_scoped("HiRadixCache", TREE_METHODS),
        **_scoped("HostEviction", {k: TREE_METHODS[k] for k in ("evict", "evict_host")}),
        "HostEviction.evict_write_back_unified": TREE_METHODS["evict"],
        **_scoped("StoragePrefetch", {k: TREE_METHODS[k] for k in _PREFETCH}),
        **_scoped("UnifiedHostTier", UNIFIED_METHODS),
        **_scoped("HiCacheController", CONTROLLER_METHODS),
        **{
            f"{c}.{k}": v
            for c in ("HostKVCache", "MHATokenToKVPoolHost", "MLATokenToKVPoolHost")
            for k, v in HOST_METHODS.items()
        },
        "HiCacheAck.snapshot": Method(reads=True),
        **OPERATION_METHODS,
        "HiTreeNode.is_leaf": Method(reads=True),
        # the node is unpinned: dropping a pin must refuse (LockError) and change nothing
        "HiTreeNode.release_host": Method(reads=True),
    },
    exempt={
        **TREE_EXEMPT,
        **_scoped("HiCacheController", CONTROLLER_EXEMPT),
        "clear": "empties the host pool: a reset without arguments, legal in every state",
        "PrefetchOperation.mark_terminate": "marks the operation stopped: idempotent, legal in "
        "every state",
        "HiTreeNode.protect_host": "adds one host pin: legal on any node in any state",
    },
    abstract=("HostKVCache",),
)
