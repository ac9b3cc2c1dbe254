"""Contracts of the ``lifecycle`` family, its reachable states: the configs, the builder that
drives a manager into the state :mod:`tests.contract.families.lifecycle`'s docstring describes,
``state()`` (:func:`mm_state`) and the bad values the method tables share.
:mod:`tests.contract.families.lifecycle` holds the method tables and assembles the family.
"""

from __future__ import annotations

from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.rules import Rules
from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Subject, klass, make, rng

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
