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
stacks. The configs, the builder, ``state()`` and the shared bad values are in
:mod:`tests.contract.families.lifecycle_build`; this module holds the method tables and
assembles the family.
"""

from __future__ import annotations

from typing import Any

import torch

from tests.bad_inputs.harness import Twin
from tests.contract.families.lifecycle_build import (
    _bad_accepted,
    _bad_chunks,
    _bad_req,
    _bad_reqs,
    _bad_rid,
    _bad_rids,
    _bad_tokens,
    _build,
    _busy,
    _fresh_req,
    _manager,
    _mm,
    _req,
    _seq_lens,
    _session,
)
from tests.contract.machinery import Bad, Family, Method, Subject, klass


# --------------------------------------------------------------------------- manager methods
def _a(s: Subject) -> Any:
    return _req(s, "a")


def _bad_stops(side: Twin, s: Subject) -> list[Bad]:
    """Stops out of range or of the wrong shape; with a sliding window, a stop a whole window
    or more before ``a``'s last committed token (not modelled; a hybrid model's session turn,
    the other refused stop, is tests/reference/test_stop_inside.py's)."""
    out = [
        Bad("past-output", [10**6]),
        Bad("negative", [-1]),
        Bad("two-for-one", [None, None]),
        Bad("float-item", [1.5]),
        Bad("bool-item", [True]),
        Bad("str-item", ["1"]),
    ]
    mm, a = _mm(s), _a(s)
    window = getattr(mm, "sliding_window", None)
    if window is not None and len(a.output_ids) >= window:
        out.append(Bad("stop-a-window-back", [len(a.output_ids) - window]))
    return out


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
        lambda side, s: {"rids": ["a"], "is_insert": True, "finished_lens": None},
        bad={"rids": _bad_rids(True), "finished_lens": _bad_stops},
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
    "SessionSlot.restore_into": Method(
        lambda side, s: {
            "req": _fresh_req(side),
            "req_to_token_pool": _mm(s).req_to_token_pool,
            **({} if side.is_ref else {"row_read": None}),
        },
        bad={
            "req": lambda side, s: [Bad("holds-a-row", _a(s)), *_bad_req(side, s)[1:]],
            "req_to_token_pool": lambda side, s: [Bad("no-read", object())],
            "row_read": lambda side, s: [Bad("too-short", torch.tensor([1]))],
        },
    ),
    "SessionSlot.take_from": Method(
        lambda side, s: {
            "req": _a(s),
            **_pools(s),
            "page_size": _mm(s).page_size,
            "segments": False,
        },
        bad={
            "req": lambda side, s: [Bad("no-row", _fresh_req(side, "x"))],
            "page_size": lambda side, s: [Bad("zero", 0), Bad("not-the-pools", 2)],
            "allocator": lambda side, s: [Bad("no-free", object())],
        },
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
