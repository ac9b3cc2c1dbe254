"""Contracts of the ``lifecycle`` family: the memory managers and their collaborators.

Reachable states (seeded by ``rng(seed)``; the seed also picks the config shape):

- ``MemoryManager``: one of radix / chunk cache at page size 1 and 4, a hybrid Mamba model
  (radix cache at page size 1, chunk cache at page size 4) or a host tier. A finished request
  ``f`` left its prefix in the tree, ``a`` runs (a few decodes, maybe a speculative
  over-allocation), ``c`` stands between prefill chunks, ``w`` waits (matched or not),
  session ``s`` holds a finished turn and session ``e`` is empty (no sessions with the Mamba
  radix cache).
- ``SWAMemoryManager``: the same requests over SWA pools: the chunk cache, the SWA radix tree,
  SGLang 0.5.16's window rule with its unified tree, or 0.5.23's scheduler rule.
- ``MambaHooks``: the hooks of a hybrid manager; ``SessionSlot``: session ``s`` of a manager;
  ``SWARadixLifecycle`` / ``UnifiedSWARadixLifecycle``: the tree of an SWA manager (decode /
  scheduler rule). Their state is the owning manager's whole state.
- ``LifecyclePrimitives``: the base class; its primitives are swept on ``MemoryManager``.

``state()`` reads the manager's snapshot (pools, tree, KV tags, Mamba and host tier), every
request's and session's fields, the SWA manager's window bookkeeping and the tree's lock
stacks.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Family, Method, Subject, klass, make, rng

# --------------------------------------------------------------------------- configs
_MM_SHAPES: tuple[dict[str, Any], ...] = (
    {"page_size": 1},
    {"page_size": 4},
    {"page_size": 1, "disable_radix_cache": True},
    {"page_size": 4, "disable_radix_cache": True},
    {"page_size": 1, "mamba_slots": 8},
    {"page_size": 4, "mamba_slots": 8, "disable_radix_cache": True},
    {"page_size": 1, "enable_hierarchical_cache": True, "hicache_load_back_threshold": 1},
)
_SWA_SHAPES: tuple[dict[str, Any], ...] = (
    {"page_size": 4, "disable_radix_cache": True},
    {"page_size": 1},
    {"page_size": 4, "rules": Rules(swa_window_release="maybe_evict", swa_tree="unified")},
    {"page_size": 1, "rules": Rules.for_sglang("0.5.23")},
)


def _config(shape: dict[str, Any], swa: bool) -> PoolConfig:
    fields: dict[str, Any] = {"size": 96, "req_pool_size": 8, "max_context_len": 40}
    if swa:
        fields["sliding_window"] = 4
    return PoolConfig(**{**fields, **shape})


def _plain(value: Any) -> Any:
    """``value`` as plain, comparable data (tensors and lists as tuples)."""
    if isinstance(value, torch.Tensor):
        return tuple(value.tolist())
    if isinstance(value, list | tuple):
        return tuple(_plain(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    return value


_REQ_FIELDS = (
    "rid",
    "state",
    "origin_input_ids",
    "output_ids",
    "extra_key",
    "session_id",
    "priority",
    "req_pool_idx",
    "prefix_indices",
    "fill_ids",
    "kv_committed_len",
    "kv_allocated_len",
    "cache_protected_len",
    "cache_inserted_len",
    "is_chunked",
    "matched",
    "mamba_pool_idx",
    "mamba_needs_clear",
    "mamba_cow_src_index",
    "mamba_ping_pong_track_buffer",
    "mamba_next_track_idx",
)
_SESSION_FIELDS = (
    "session_id",
    "req_pool_idx",
    "kv_committed_len",
    "kv_allocated_len",
    "cache_protected_len",
    "tokens",
    "extra_key",
    "has_namespace",
    "busy_with",
    "is_chunked",
    "mamba_pool_idx",
    "mamba_needs_clear",
    "mamba_cow_src_index",
    "mamba_ping_pong_track_buffer",
    "mamba_next_track_idx",
)


def _node_id(node: Any) -> Any:
    return None if node is None else node.node_id


def _fields(obj: Any, names: tuple[str, ...]) -> tuple[Any, ...]:
    return (*(_plain(getattr(obj, n)) for n in names), _node_id(obj.last_node))


def mm_state(mm: Any) -> Any:
    """Everything a call on ``mm`` (or on a collaborator of it) could change."""
    extra: tuple[Any, ...] = ()
    for name in ("_swa_evicted", "_session_swa", "_carrying", "_decodes", "_branching"):
        if hasattr(mm, name):
            extra += (_plain(getattr(mm, name)),)
    tree = mm.tree_cache
    hi = mm.hiradix()
    host: Any = None
    if hi is not None:
        cc = hi.cache_controller
        host = tuple(len(getattr(cc, q, ())) for q in ("ack_write_queue", "ack_load_queue"))
    return (
        mm.snapshot(),
        tuple(_fields(r, _REQ_FIELDS) for r in mm.reqs.values()),
        tuple(_fields(s, _SESSION_FIELDS) for s in mm.sessions.values()),
        extra,
        _plain(getattr(tree, "_uuids", None)),
        host,
        mm.capacity_refusals,
    )


# --------------------------------------------------------------------------- builder
def _manager(side: Twin, swa: bool, seed: int) -> Any:
    """A manager in the state the module docstring describes (seeded legal calls)."""
    shapes = _SWA_SHAPES if swa else _MM_SHAPES
    shape = shapes[seed % len(shapes)]
    config = _config(shape, swa)
    mm = make(side, "SWAMemoryManager" if swa else "MemoryManager", config)
    r = rng(seed)

    def toks(n: int) -> list[int]:
        return [r.randint(1, 60) for _ in range(n)]

    sessions = not (config.mamba_slots is not None and not config.disable_radix_cache)
    if sessions:
        mm.open_session("s")
        mm.open_session("e")
    base = toks(r.randint(5, 9))
    mm.new_req("f", base + toks(2))
    mm.extend(["f"])
    mm.decode(["f"], toks(1))
    mm.finish(["f"])
    mm.new_req("a", base + toks(r.randint(1, 3)))
    mm.match_prefix("a")
    mm.extend(["a"])
    for _ in range(r.randint(1, 3)):
        mm.decode(["a"], toks(1))
    if r.random() < 0.5:
        mm.spec_step(["a"], [toks(1)], 2)
    mm.new_req("c", toks(10))
    mm.extend(["c"], [r.randint(3, 6)])
    if sessions:
        mm.new_req("t", toks(r.randint(3, 6)), None, "s")
        mm.extend(["t"])
        mm.decode(["t"], toks(1))
        mm.finish(["t"])
        if r.random() < 0.5:
            mm.new_req("u", toks(2), None, "s")  # the session's next turn: s is busy
    mm.new_req("w", base + toks(2))
    if r.random() < 0.7:
        mm.match_prefix("w")
    return mm


def _build(side: Twin, cls: str, seed: int) -> Subject:
    swa = cls in ("SWAMemoryManager", "SWARadixLifecycle", "UnifiedSWARadixLifecycle")
    if cls == "SWARadixLifecycle":
        seed = 1 + 2 * (seed % 2)  # the decode rule's radix tree or 0.5.16's unified tree
    elif cls == "UnifiedSWARadixLifecycle":
        seed = 3 + 4 * (seed % 4)  # the scheduler rule
    elif cls == "MambaHooks":
        seed = 4 + 7 * (seed % 2)  # a hybrid model, radix or chunk cache
    elif cls == "SessionSlot" and seed % 7 == 4:
        seed += 1  # not the Mamba radix cache (no sessions)
    mm = _manager(side, swa, seed)
    handles = {"mm": mm, "side": side}
    obj: Any = mm
    if cls == "MambaHooks":
        obj = mm.mamba_hooks
    elif cls == "SessionSlot":
        obj = mm.sessions["s"]
    elif cls in ("SWARadixLifecycle", "UnifiedSWARadixLifecycle"):
        obj = mm.tree_cache
    return Subject(obj, lambda: mm_state(mm), handles)


# --------------------------------------------------------------------------- values
def _mm(s: Subject) -> Any:
    return s.handles["mm"]


def _req(s: Subject, rid: str) -> Any:
    return _mm(s).reqs[rid]


def _fresh_req(side: Twin, rid: str = "n", tokens: tuple[int, ...] = (1, 2, 3)) -> Any:
    return klass(side, "Req")(rid, list(tokens))


def _bad_rid(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("unknown", "zz"), Bad("unhashable", ["a"]), Bad("waiting-not-running", "w")]


def _bad_rids(running_full: bool) -> Any:
    def bads(side: Twin, s: Subject) -> list[Bad]:
        out = [
            Bad("unknown", ["zz"]),
            Bad("duplicate", ["a", "a"]),
            Bad("str-not-list", "a"),
            Bad("unhashable-item", [["a"]]),
            Bad("int-item", [3]),
        ]
        if running_full:
            out += [Bad("waiting", ["w"]), Bad("chunked", ["c"])]
        else:
            out += [Bad("running-not-chunked", ["a"])]
        return out

    return bads


def _bad_reqs(side: Twin, s: Subject) -> list[Bad]:
    fresh = _fresh_req(side, "dup")
    return [
        Bad("same-request-twice", [fresh, fresh]),
        Bad("not-a-request", [3]),
        Bad("str-not-list", "ab"),
        Bad(
            "req-of-other-twin",
            [_fresh_req(Twin("optimized") if side.is_ref else Twin("reference"))],
        ),
    ]


def _bad_req(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("no-row", _fresh_req(side, "x")),
        Bad("other-twin", _fresh_req(Twin("optimized") if side.is_ref else Twin("reference"))),
    ]


def _bad_tokens(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("too-many", [1, 2]),
        Bad("empty", []),
        Bad("token-past-vocab", [2**31]),
        Bad("int64-max", [2**63 - 1]),
        Bad("past-int64", [2**63]),
    ]


def _bad_accepted(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("float-item", [[1.5]]),
        Bad("bool-item", [[True]]),
        Bad("negative-item", [[-1]]),
        Bad("token-past-vocab", [[2**31]]),
        Bad("past-int64", [[2**63]]),
        Bad("more-than-2-reserve", [[1, 2, 3]]),
        Bad("count-mismatch", []),
        Bad("str", "x"),
        Bad("None", None),
        Bad("int", 3),
        Bad("int-items", [3]),
        Bad("None-items", [None]),
    ]


def _bad_chunks(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("float", [2.5]),
        Bad("integral-float", [2.0]),
        Bad("bool", [True]),
        Bad("zero", [0]),
        Bad("negative", [-1]),
        Bad("count-mismatch", [None, None]),
        Bad("str-item", ["2"]),
        Bad("str", "2"),
    ]


def _seq_lens(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("float", [2.5]),
        Bad("bool", [True]),
        Bad("past-context", [10**6]),
        Bad("count-mismatch", [3, 3]),
        Bad("below-prefix", [-1]),
        Bad("past-int64", [2**63]),
    ]


def _busy(s: Subject) -> list[Bad]:
    """Session ``s`` when a turn of it is registered (then it may not close or take a turn)."""
    session = _mm(s).sessions.get("s")
    return [Bad("busy-session", "s")] if session is not None and session.busy_with else []


def _session(s: Subject) -> list[Bad]:
    return [Bad("unknown", "zz"), Bad("unhashable", ["s"]), *_busy(s)]


# --------------------------------------------------------------------------- manager methods
def _a(s: Subject) -> Any:
    return _req(s, "a")


MANAGER_METHODS: dict[str, Method] = {
    "new_req": Method(
        lambda side, s: {
            "rid": "n",
            "input_ids": [1, 2, 3],
            "extra_key": None,
            "session_id": None,
            "priority": 0,
        },
        bad={
            "rid": lambda side, s: [Bad("existing", "a"), Bad("unhashable", ["n"])],
            "input_ids": lambda side, s: [
                Bad("empty", []),
                Bad("past-context", [1] * 41),
                Bad("token-past-vocab", [2**31]),
            ],
            "session_id": lambda side, s: [
                Bad("unknown", "zz"),
                Bad("unhashable", ["s"]),
                *_busy(s),
            ],
        },
        signed=("priority",),
    ),
    "match_prefix": Method(
        lambda side, s: {"rid": "w"},
        bad={"rid": lambda side, s: [Bad("unknown", "zz"), Bad("running", "a")]},
    ),
    "extend": Method(
        lambda side, s: {"rids": ["w"], "chunk_sizes": None},
        bad={"rids": _bad_rids(False), "chunk_sizes": _bad_chunks},
    ),
    "decode": Method(
        lambda side, s: {"rids": ["a"], "token_ids": [5]},
        bad={"rids": _bad_rids(True), "token_ids": _bad_tokens},
    ),
    "spec_step": Method(
        lambda side, s: {"rids": ["a"], "accepted": [[7]], "reserve": 1},
        bad={
            "rids": _bad_rids(True),
            "accepted": _bad_accepted,
            "reserve": lambda side, s: [Bad("past-context", 10**6)],
        },
    ),
    "spec_draft_v1": Method(
        lambda side, s: {"rids": ["a"], "num_draft": 2},
        bad={"rids": _bad_rids(True), "num_draft": lambda side, s: [Bad("past-context", 10**6)]},
    ),
    "finish": Method(
        lambda side, s: {"rids": ["a"], "is_insert": True}, bad={"rids": _bad_rids(True)}
    ),
    "abort": Method(
        lambda side, s: {"rid": "a"}, bad={"rid": lambda side, s: [Bad("unknown", "zz")]}
    ),
    "retract": Method(lambda side, s: {"rid": "a"}, bad={"rid": _bad_rid}),
    "open_session": Method(
        lambda side, s: {"session_id": "new"},
        bad={"session_id": lambda side, s: [Bad("existing", "e"), Bad("unhashable", ["s"])]},
    ),
    "close_session": Method(
        lambda side, s: {"session_id": "e"},
        bad={"session_id": lambda side, s: _session(s)},
    ),
    "evict": Method(lambda side, s: {"num_tokens": 1}),
    "hicache_ack_writes": Method(lambda side, s: {"num_acks": 0}),
    "hicache_ack_loads": Method(lambda side, s: {"num_acks": 0}),
    "get_req": Method(
        lambda side, s: {"rid": "a"},
        bad={"rid": lambda side, s: [Bad("unknown", "zz"), Bad("unhashable", ["a"])]},
    ),
    "hiradix": Method(reads=True),
    "snapshot": Method(reads=True),
    # the SGLang-named primitives (LifecyclePrimitives)
    "alloc_req_slots": Method(
        lambda side, s: {"reqs": [_fresh_req(side)]}, bad={"reqs": _bad_reqs}
    ),
    "alloc_for_extend": Method(
        lambda side, s: {"reqs": [_fresh_req(side)], "seq_lens": [3]},
        bad={"reqs": _bad_reqs, "seq_lens": _seq_lens},
    ),
    "alloc_for_decode": Method(
        lambda side, s: {"reqs": [_a(s)]},
        bad={
            "reqs": lambda side, s: [
                *_bad_reqs(side, s),
                Bad("no-row", [_fresh_req(side, "x")]),
                Bad("twice", [_a(s), _a(s)]),
            ]
        },
    ),
    "release_kv_cache": Method(
        lambda side, s: {"req": _a(s), "is_insert": True}, bad={"req": _bad_req}
    ),
    "write_kv": Method(
        lambda side, s: {
            "req": _a(s),
            "start": _a(s).kv_committed_len,
            "stop": _a(s).kv_committed_len,
        },
        bad={
            "req": _bad_req,
            "start": lambda side, s: [Bad("after-stop", _a(s).kv_committed_len + 1)],
            "stop": lambda side, s: [Bad("past-allocation", 10**3)],
        },
    ),
    "write_kv_batch": Method(
        lambda side, s: {
            "reqs": [_a(s)],
            "starts": [_a(s).kv_committed_len],
            "stops": [_a(s).kv_committed_len],
            "slots": None,
        },
        bad={
            "reqs": lambda side, s: [
                *_bad_reqs(side, s),
                Bad("count-mismatch", [_a(s), _req(s, "c")]),
            ],
            "stops": lambda side, s: [
                Bad("past-allocation", [10**3]),
                Bad("count-mismatch", [1, 1]),
            ],
            "starts": lambda side, s: [Bad("after-stop", [_a(s).kv_committed_len + 1])],
            "slots": lambda side, s: [Bad("too-many", torch.tensor([1, 2]))],
        },
    ),
}

SWA_MANAGER_METHODS = {
    "SWAMemoryManager.decode_steps": Method(
        lambda side, s: {"rid": "a"}, bad={"rid": lambda side, s: [Bad("unhashable", ["a"])]}
    ),
    "SWAMemoryManager.swa_evicted_seqlen": Method(
        lambda side, s: {"rid": "a"}, bad={"rid": lambda side, s: [Bad("unhashable", ["a"])]}
    ),
}


# --------------------------------------------------------------------------- Mamba hooks
def _w(s: Subject) -> Any:
    return _req(s, "w")


def _key(side: Twin, tokens: tuple[int, ...] = (1, 2, 3)) -> Any:
    return klass(side, "RadixKey")(list(tokens))


def _bad_key(side: Twin, s: Subject) -> list[Bad]:
    other = Twin("optimized") if side.is_ref else Twin("reference")
    return [Bad("key-of-other-twin", _key(other)), Bad("token-list", [1, 2, 3])]


HOOK_METHODS = {
    "MambaHooks.after_admission": Method(
        lambda side, s: {"reqs": [_a(s)]}, bad={"reqs": _bad_reqs}
    ),
    "MambaHooks.after_write": Method(
        lambda side, s: {"req": _a(s), "stop": _a(s).kv_committed_len},
        bad={
            "req": _bad_req,
            "stop": lambda side, s: [Bad("past-tokens", 10**3), Bad("zero", 0)],
        },
    ),
    "MambaHooks.after_writes": Method(
        lambda side, s: {"reqs": [_a(s)], "stops": [_a(s).kv_committed_len]},
        bad={
            "reqs": _bad_reqs,
            "stops": lambda side, s: [Bad("past-tokens", [10**3]), Bad("count-mismatch", [1, 1])],
        },
    ),
    "MambaHooks.before_release": Method(lambda side, s: {"req": _a(s)}, bad={"req": _bad_req}),
    "MambaHooks.check_admission": Method(
        lambda side, s: {"reqs": [_fresh_req(side)], "chunks": 0}, bad={"reqs": _bad_reqs}
    ),
    "MambaHooks.evict_for_admission": Method(
        lambda side, s: {"reqs": [_fresh_req(side)]}, bad={"reqs": _bad_reqs}
    ),
    "MambaHooks.reclaim_before_alloc": Method(
        lambda side, s: {"reqs": [_fresh_req(side)]}, bad={"reqs": _bad_reqs}
    ),
    "MambaHooks.stage_cow": Method(lambda side, s: {"reqs": [_w(s)]}, bad={"reqs": _bad_reqs}),
    "MambaHooks.match": Method(
        lambda side, s: {"key": _key(side), "req": _fresh_req(side)},
        bad={"key": _bad_key, "req": lambda side, s: [Bad("running", _a(s))]},
    ),
    "MambaHooks.release_waiting": Method(
        lambda side, s: {"req": _w(s)}, bad={"req": lambda side, s: [Bad("running", _a(s))]}
    ),
    "MambaHooks.snapshot": Method(
        lambda side, s: {
            "reqs": list(_mm(s).reqs.values()),
            "sessions": list(_mm(s).sessions.values()),
            "tree": None,
        },
        bad={
            "reqs": lambda side, s: [Bad("int", 3), Bad("None", None), Bad("int-items", [3])],
            "sessions": lambda side, s: [Bad("int", 3), Bad("None", None), Bad("int-items", [3])],
        },
    ),
}


# --------------------------------------------------------------------------- sessions
def _pools(s: Subject) -> dict[str, Any]:
    mm = _mm(s)
    return {"req_to_token_pool": mm.req_to_token_pool, "allocator": mm.token_to_kv_pool_allocator}


SESSION_METHODS = {
    "SessionSlot.close": Method(
        lambda side, s: {**_pools(s), "segments": False},
    ),
    "SessionSlot.orphan_tail_tokens": Method(
        lambda side, s: {"page_size": _mm(s).page_size},
        bad={"page_size": lambda side, s: [Bad("zero", 0), Bad("not-a-power-of-2", 3)]},
    ),
    "SessionSlot.restore_into": Method(
        lambda side, s: {
            "req": _fresh_req(side),
            **_pools(s),
            "page_size": _mm(s).page_size,
            "segments": False,
            **({} if side.is_ref else {"row_read": None}),
        },
        bad={
            "req": lambda side, s: [Bad("holds-a-row", _a(s)), *_bad_req(side, s)[1:]],
            "page_size": lambda side, s: [Bad("zero", 0), Bad("not-the-pools", 2)],
            "row_read": lambda side, s: [Bad("too-short", torch.tensor([1]))],
        },
    ),
    "SessionSlot.take_from": Method(
        lambda side, s: {"req": _a(s)},
        bad={"req": lambda side, s: [Bad("no-row", _fresh_req(side, "x"))]},
    ),
    "SessionSlot.read_rows": Method(
        lambda side, s: {
            "slots": [s.obj],
            "req_to_token_pool": _mm(s).req_to_token_pool,
            "device": torch.device("cpu"),
        },
        bad={
            "slots": lambda side, s: [
                Bad("int-items", [3]),
                Bad("empty-slot", [klass(side, "SessionSlot")("z")]),
            ]
        },
    ),
    "SessionSlot.holds_kv": Method(reads=True),
}


# --------------------------------------------------------------------------- SWA trees
def _node(s: Subject) -> Any:
    return _a(s).last_node


def _bad_node(side: Twin, s: Subject) -> list[Bad]:
    """A node of another manager's tree (its running request's locked node)."""
    other = _manager(side, True, 3 if _cls_name(s) == "UnifiedSWARadixLifecycle" else 1)
    node = other.reqs["a"].last_node
    return [] if node is None else [Bad("node-of-other-tree", node)]


def _unlocked(side: Twin, s: Subject) -> list[Bad]:
    """Besides :func:`_bad_node`: a node of this tree holding no lifecycle lock."""
    tree, held = s.obj.tree, s.obj._uuids
    todo = list(tree.root_node.children.values())
    while todo:
        node = todo.pop(0)
        if node.node_id not in held:
            return [*_bad_node(side, s), Bad("unlocked-node", node)]
        todo += node.children.values()
    return _bad_node(side, s)


def _cls_name(s: Subject) -> str:
    return type(s.obj).__name__


def _c(s: Subject) -> Any:
    return _req(s, "c")


TREE_METHODS = {
    "cache_finished_req": Method(
        lambda side, s: {"req": _a(s), "is_insert": True, "row_read": None},
        bad={"req": _bad_req, "row_read": lambda side, s: [Bad("too-short", side.idx([1]))]},
    ),
    "cache_unfinished_req": Method(
        lambda side, s: {"req": _c(s), "chunked": True, "row_read": None},
        bad={"req": _bad_req, "row_read": lambda side, s: [Bad("too-short", side.idx([1]))]},
    ),
    "inc_lock_ref": Method(lambda side, s: {"node": _node(s)}, bad={"node": _bad_node}),
    "dec_lock_ref": Method(lambda side, s: {"node": _node(s)}, bad={"node": _unlocked}),
    "full_hit_length": Method(lambda side, s: {"key": _key(side)}, bad={"key": _bad_key}),
    "branching_seqlen": Method(
        lambda side, s: {"key": _key(side), "device_prefix_len": 0}, bad={"key": _bad_key}
    ),
    "checkpoint": Method(
        lambda side, s: {"req": _c(s), "stop": len(_c(s).fill_ids), "swa_evicted_seqlen": 0},
        bad={
            "req": _bad_req,
            "stop": lambda side, s: [Bad("past-allocation", 10**3)],
        },
    ),
    "evictable_size": Method(reads=True),
    "protected_size": Method(reads=True),
    "swa_evictable_size": Method(reads=True),
    # the manager-named entries (evict, match_prefix, snapshot) take other arguments here
    **{
        f"{cls}.{name}": contract
        for cls in ("SWARadixLifecycle", "UnifiedSWARadixLifecycle")
        for name, contract in (
            ("evict", Method(lambda side, s: {"num_tokens": 1, "swa_num_tokens": 0})),
            ("match_prefix", Method(lambda side, s: {"key": _key(side)}, bad={"key": _bad_key})),
            ("snapshot", Method(reads=True)),
        )
    },
}

FAMILY = Family(
    name="lifecycle",
    classes=(
        "LifecyclePrimitives",
        "MemoryManager",
        "SWAMemoryManager",
        "MambaHooks",
        "SessionSlot",
        "SWARadixLifecycle",
        "UnifiedSWARadixLifecycle",
    ),
    build=_build,
    methods={
        **MANAGER_METHODS,
        **SWA_MANAGER_METHODS,
        **HOOK_METHODS,
        **SESSION_METHODS,
        **TREE_METHODS,
    },
    exempt={
        "SessionSlot.forget": "drops the slot's fields after its owner released them: no "
        "argument to refuse (the manager calls it once the resources went back)",
        "reset": "drops the whole tree with its locks, the owner's reset: no argument to refuse",
    },
    abstract=("LifecyclePrimitives",),
)
