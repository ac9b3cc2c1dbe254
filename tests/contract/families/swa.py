"""Contracts of the ``swa`` family: the sliding-window family.

Reachable states:

- allocators: the hybrid allocator (full pool 8 pages, SWA pool 4 pages; page size 4 for even
  seeds, 1 for odd ones) and the pure-SWA one (16 slots): 1 to 3 seeded requests allocated
  (``alloc`` or ``alloc_extend``), one of them released from the window (``free_swa``) for
  even seeds, another freed for some seeds;
- the SWA KV pool (full 16 slots, SWA 8, layers 0 full and 1 SWA) over the mapping of a
  page-size-1 hybrid allocator holding 3 seeded slots, with seeded tags written;
- the SWA radix tree (page size 4, window 4; full 48 slots, SWA 32) with 1 to 3 seeded
  sequences inserted (the tree frees their duplicates), some SWA-evicted (tombstones), one
  path locked (its swa_uuid kept), and 4 held slots for a new insert;
- the SWA chunk cache: the radix family's chunk cache state over a page-size-1 hybrid allocator;
- a tree node and a match result of that tree.

``state()`` reads the tree's snapshot (both lock counts, tombstones), every node's swa_uuid,
and the allocator's snapshot (both pools and the mapping); for the KV pool, every row's tags on
both sides and the registered mapping.
"""

from __future__ import annotations

from typing import Any

from tests.bad_inputs.harness import Twin
from tests.contract.families.radix import (
    COLUMNS,
    ROWS,
    _chunk_node_bad,
    _release_args,
    _unfinished_args,
    as_list,
    key,
    live_request,
    plain,
    req_fields,
    request_bad,
    row_read_bad,
    table_rows,
    unfinished_bad,
)
from tests.contract.machinery import Bad, Family, Method, Subject, klass, make, rng

# --------------------------------------------------------------------------- allocators
ALLOCATORS = ("SWATokenToKVPoolAllocator", "PureSWATokenToKVPoolAllocator")


def _grab(side: Twin, a: Any, ps: int, n: int) -> list[int] | None:
    """``n`` tokens (a page multiple) for a new request: ``alloc`` at page size 1, else one
    ``alloc_extend`` from no prefix."""
    if ps == 1:
        got = a.alloc(n)
    else:
        got = a.alloc_extend(side.idx([0]), [0], side.idx([n]), [n], side.idx([-1]), n)
    return None if got is None else as_list(got)


def _allocator(side: Twin, cls: str, seed: int) -> Subject:
    r = rng(seed)
    pure = cls == "PureSWATokenToKVPoolAllocator"
    ps = 1 if pure or seed % 2 else 4
    size = 16 if pure else 8 * ps
    a = make(side, cls, 16) if pure else make(side, cls, size, 4 * ps, ps)
    held: list[list[int]] = []
    for _ in range(r.randint(1, 3)):
        got = _grab(side, a, ps, ps * r.randint(1, 2))
        if got:
            held.append(got)
    h: dict[str, Any] = {"ps": ps, "size": size, "pure": pure}
    if len(held) > 1 and r.random() < 0.5:
        a.free(side.idx(held.pop()))
    if not pure and len(held) > 1:
        gone = held.pop()
        a.free_swa(side.idx(gone))
        h["swa_gone"] = gone
    h["held"] = held[0]
    taken = {s // ps for run in held for s in run} | {s // ps for s in h.get("swa_gone", [])}
    free_pages = sorted(set(range(1, size // ps + 1)) - taken)
    h["free_page"] = free_pages[0] if free_pages else None
    h["rebuild"] = lambda: _allocator(side, cls, seed)
    return Subject(a, a.snapshot, h)


def _group_open(side: Twin, s: Subject) -> list[tuple[str, Subject]]:
    """The same state with a free group open (a second ``free_group_begin`` and, on the
    hybrid allocator, ``backup_state`` are refused there)."""
    wrong: Subject = s.handles["rebuild"]()
    wrong.obj.free_group_begin()
    return [("group-open", wrong)]


def _first_page(s: Subject) -> list[int]:
    held: list[int] = s.handles["held"]
    return held[: s.handles["ps"]]


def _not_held(side: Twin, s: Subject, padding_ok: bool = False) -> list[Bad]:
    """Slots the caller does not hold: slot 0 (unless it is padding there), past the pool, a
    repeat (page size 1: above, a page named twice is freed once, as SGLang), a free slot."""
    h = s.handles
    own = _first_page(s)
    ps = h["ps"]
    out = [Bad("past-pool", side.idx([h["size"] + ps + 1] * ps), device_read=True)]
    if ps == 1:
        out.append(Bad("duplicate", side.idx(own + own), device_read=True))
    if not (h["pure"] or padding_ok):  # the pure allocator drops slot 0 (padding), as SGLang
        out.append(Bad("slot-0", side.idx([0] * ps), device_read=True))
    if h["free_page"] is not None:
        free = [h["free_page"] * ps + i for i in range(ps)]
        out.append(Bad("free-slot", side.idx(free), device_read=True))
    return out


def _extend_args(side: Twin, s: Subject) -> dict[str, Any]:
    n = s.handles["ps"]
    return {
        "prefix_lens": side.idx([0]),
        "prefix_lens_cpu": [0],
        "seq_lens": side.idx([n]),
        "seq_lens_cpu": [n],
        "last_loc": side.idx([-1]),
        "extend_num_tokens": n,
    }


def _decode_args(side: Twin, s: Subject) -> dict[str, Any]:
    """The held request grows by one token after its last slot."""
    held = s.handles["held"]
    n = len(held) + 1
    return {"seq_lens": side.idx([n]), "seq_lens_cpu": [n], "last_loc": side.idx(held[-1:])}


def _is_none(got: Any) -> bool:
    return got is None


def _swa_gone_args(side: Twin, s: Subject) -> dict[str, Any]:
    gone = s.handles.get("swa_gone", s.handles["held"])
    return {"free_index": side.idx(gone[: s.handles["ps"]])}


def _mapped(side: Twin, s: Subject) -> list[Bad]:
    """Full slots whose SWA slot is still mapped (free_full refuses them), and not-held ones."""
    still = Bad("still-mapped", side.idx(_first_page(s)), device_read=True)
    return [still, *_not_held(side, s)]


def _segment_start_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("mid-page", 1)] if s.handles["ps"] > 1 else []


def _state_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("None", None), Bad("int", 3), Bad("tuple", ((), (), ()))]


def _translate_bad(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    return [
        Bad("past-pool", side.idx([h["size"] + h["ps"] + 1]), device_read=True),
        Bad("minus-2", side.idx([-2]), device_read=True),
    ]


def _mapping_args(side: Twin, s: Subject) -> dict[str, Any]:
    """Map the held slots to the SWA slots they map to already (a no-op write)."""
    full = _first_page(s)
    swa = as_list(s.obj.translate_loc_from_full_to_swa(side.idx(full)))
    return {"full_indices": side.idx(full), "swa_indices": side.idx(swa)}


def _mapping_bad(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    return [
        Bad("other-length", side.idx([1] * (h["ps"] + 1))),
        Bad("past-pool", side.idx([10**6] * h["ps"]), device_read=True),
    ]


ALLOCATOR_METHODS = {
    "alloc": Method(lambda side, s: {"need_size": 1}, unbounded=("need_size",), answer=_is_none),
    "alloc_extend": Method(
        _extend_args,
        bad={
            "last_loc": lambda side, s: (
                [Bad("free-slot", side.idx([s.handles["size"] + 1]), device_read=True)]
            ),
            "extend_num_tokens": lambda side, s: [Bad("not-the-sum", s.handles["ps"] + 1)],
        },
        signed=("last_loc",),
        answer=_is_none,
    ),
    "alloc_extend_swa_tail": Method(
        lambda side, s: {**_extend_args(side, s), "swa_tail_len": s.handles["ps"]},
        bad={
            "swa_tail_len": lambda side, s: [
                Bad("past-extend", s.handles["ps"] + 1),
                *([Bad("mid-page", 1)] if s.handles["ps"] > 1 else []),
            ],
            "extend_num_tokens": lambda side, s: [Bad("not-the-sum", s.handles["ps"] + 1)],
        },
        signed=("last_loc",),
        answer=_is_none,
    ),
    "alloc_decode": Method(
        _decode_args,
        bad={
            "seq_lens_cpu": lambda side, s: (
                [Bad("disagrees", [len(s.handles["held"]) + 2], device_read=True)]
            )
        },
        answer=_is_none,
    ),
    "free": Method(
        lambda side, s: {"free_index": side.idx(_first_page(s))}, bad={"free_index": _not_held}
    ),
    "free_swa": Method(
        lambda side, s: {"free_index": side.idx(_first_page(s))},
        bad={"free_index": lambda side, s: _not_held(side, s, padding_ok=True)},
    ),
    "free_full": Method(_swa_gone_args, bad={"free_index": _mapped}),
    "free_full_segment": Method(
        lambda side, s: {**_swa_gone_args(side, s), "start_pos": 0},
        bad={"free_index": _mapped, "start_pos": _segment_start_bad},
    ),
    "free_segment": Method(
        lambda side, s: {"free_index": side.idx(_first_page(s)), "start_pos": 0},
        bad={"free_index": _not_held, "start_pos": _segment_start_bad},
    ),
    "free_swa_segment": Method(
        lambda side, s: {"free_index": side.idx(_first_page(s)), "start_pos": 0},
        bad={
            "free_index": lambda side, s: _not_held(side, s, padding_ok=True),
            "start_pos": _segment_start_bad,
        },
    ),
    "translate_loc_from_full_to_swa": Method(
        lambda side, s: {"kv_indices": side.idx(_first_page(s))},
        bad={"kv_indices": _translate_bad},
        signed=("kv_indices",),
    ),
    "set_full_to_swa_mapping": Method(
        _mapping_args, bad={"full_indices": _mapping_bad, "swa_indices": _mapping_bad}
    ),
    "restore_state": Method(
        lambda side, s: {"state": s.obj.backup_state()}, bad={"state": _state_bad}
    ),
    "available_size": Method(reads=True),
    "full_available_size": Method(reads=True),
    "swa_available_size": Method(reads=True),
    "backup_state": Method(reads=True),
    "snapshot": Method(reads=True),
    "free_group_begin": Method(refused_in=_group_open),
    "free_group_end": Method(refused_in=lambda side, s: [("no-open-group", s)]),
}

ALLOCATOR_EXEMPT = {
    "clear": "a reset without arguments: legal in every state",
    "merge_and_sort_free": "sorts both free lists: legal in every state",
}


# --------------------------------------------------------------------------- KV pool
def _kv_pool(side: Twin, cls: str, seed: int) -> Subject:
    r = rng(seed)
    pool = make(side, "SWAKVPool", 16, 8, 1, "float32", 1, 2, [1], [0])
    a = make(side, "SWATokenToKVPoolAllocator", 16, 8, 1)
    pool.register_mapping(a.full_to_swa_index_mapping)
    held = as_list(a.alloc(r.randint(2, 4)))
    pool.write_tags(side.idx(held), side.idx([r.randint(1, 9) for _ in held]))
    mapping = a.full_to_swa_index_mapping

    def state() -> Any:
        full = list(range(16 + 1))
        tags = (as_list(pool.full_kv_pool.read_tags(side.idx(full))),
                as_list(pool.swa_kv_pool.read_tags(side.idx(list(range(8 + 1))))))  # fmt: skip
        return (
            tags,
            plain(pool.full_to_swa_index_mapping),
            pool.full_to_swa_index_mapping is mapping,
        )

    return Subject(pool, state, {"held": held, "mapping": mapping})


def _loc_bad(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("past-pool", side.idx([17]), device_read=True),
        Bad("minus-2", side.idx([-2]), device_read=True),
    ]


def _layer_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("unknown-layer", 5)]


def _loc(side: Twin, s: Subject) -> Any:
    return side.idx(s.handles["held"][:1])


KV_METHODS = {
    "get_key_buffer": Method(lambda side, s: {"layer_id": 0}, bad={"layer_id": _layer_bad}),
    "get_value_buffer": Method(lambda side, s: {"layer_id": 1}, bad={"layer_id": _layer_bad}),
    "get_kv_buffer": Method(lambda side, s: {"layer_id": 1}, bad={"layer_id": _layer_bad}),
    "set_kv_buffer": Method(
        lambda side, s: {
            "layer_id": 1,
            "loc": _loc(side, s),
            "cache_k": side.data((1, 1, 2)),
            "cache_v": side.data((1, 1, 2)),
        },
        bad={
            "layer_id": _layer_bad,
            "loc": _loc_bad,
            "cache_k": lambda side, s: [Bad("wrong-shape", side.data((2, 1, 2)))],
        },
        generic=("layer_id", "loc"),
    ),
    "move_kv_cache": Method(
        lambda side, s: {"tgt_loc": _loc(side, s), "src_loc": _loc(side, s)},
        bad={
            "tgt_loc": _loc_bad,
            "src_loc": lambda side, s: [*_loc_bad(side, s), Bad("other-length", side.idx([1, 2]))],
        },
    ),
    "write_tags": Method(
        lambda side, s: {"loc": _loc(side, s), "tags": side.idx([5])},
        bad={"loc": _loc_bad, "tags": lambda side, s: [Bad("other-length", side.idx([5, 6]))]},
        signed=("tags",),
        unbounded=("tags",),
    ),
    "read_tags": Method(lambda side, s: {"loc": _loc(side, s)}, bad={"loc": _loc_bad}),
    "read_swa_tags": Method(lambda side, s: {"loc": _loc(side, s)}, bad={"loc": _loc_bad}),
    "translate_loc_from_full_to_swa": Method(
        lambda side, s: {"kv_indices": _loc(side, s)},
        bad={"kv_indices": _loc_bad},
        signed=("kv_indices",),
    ),
    "register_mapping": Method(
        lambda side, s: {"full_to_swa_index_mapping": s.handles["mapping"]},
        bad={
            "full_to_swa_index_mapping": lambda side, s: [
                Bad("None", None),
                Bad("short", side.idx([0, 0])),
                Bad("int", 3),
            ]
        },
    ),
}

# --------------------------------------------------------------------------- SWA radix tree
PS, WINDOW, FULL, SWA = 4, 4, 48, 32


def _tree_state(cache: Any, alloc: Any) -> Any:
    uuids, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        uuids.append((node.node_id, node.swa_uuid))
        stack.extend(node.children.values())
    return cache.snapshot(), sorted(uuids, key=lambda p: p[0]), alloc.snapshot()


def _swa_tree(side: Twin, seed: int) -> tuple[Any, Any, dict[str, Any]]:
    r = rng(seed)
    alloc = make(side, "SWATokenToKVPoolAllocator", FULL, SWA, PS)
    cache = make(side, "SWARadixCache", alloc, PS, WINDOW)
    for _ in range(r.randint(1, 3)):
        tokens = [r.randint(1, 3) for _ in range(PS * r.randint(1, 2))]
        slots = _grab(side, alloc, PS, len(tokens))
        assert slots is not None
        cache.insert(key(side, tokens), side.idx(slots))
    if r.random() < 0.5:
        cache.evict(0, PS)  # one node loses its SWA slots (a tombstone) or is deleted
    nodes = _swa_nodes(cache)
    live = [n for n in nodes if not n.swa_tombstone]
    h: dict[str, Any] = {}
    if live:
        node = live[r.randrange(len(live))]
        h["node"], h["uuid"] = node, cache.inc_lock_ref(node)
    unlocked = [n for n in nodes if n.full_lock_ref == 0 and not n.children]
    h["unlocked"] = unlocked[0] if unlocked else None
    h["new"] = _grab(side, alloc, PS, PS)
    other_alloc = make(side, "SWATokenToKVPoolAllocator", 16, 8, PS)
    other = make(side, "SWARadixCache", other_alloc, PS, WINDOW)
    other.insert(key(side, [1] * PS), side.idx(_grab(side, other_alloc, PS, PS) or []))
    other.insert(key(side, [2] * PS), side.idx(_grab(side, other_alloc, PS, PS) or []))
    h["other_node"] = other.match_prefix(key(side, [1] * PS)).last_device_node
    detached = other.match_prefix(key(side, [2] * PS)).last_device_node
    other.inc_lock_ref(h["other_node"])
    other.evict(PS)
    assert detached.parent is None
    h["detached"] = detached
    return cache, alloc, h


def _swa_nodes(cache: Any) -> list[Any]:
    out, stack = [], list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def _swa_key_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("token-list", [1] * PS), Bad("tensor", side.idx([1] * PS))]


def _swa_insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    """A new page of tokens (outside the seeded vocabulary) at the held page."""
    return {
        "key": key(side, [7] * PS),
        "value": side.idx(s.handles["new"]),
        "prev_prefix_len": 0,
        "swa_evicted_seqlen": 0,
    }


def _swa_value_bad(side: Twin, s: Subject) -> list[Bad]:
    new = s.handles["new"]
    free = [(FULL // PS) * PS + i for i in range(PS)]  # the last page: never allocated here
    return [
        Bad("slot-0", side.idx([0, *new[1:]]), device_read=True),
        Bad("past-pool", side.idx([FULL + PS + 1, *new[1:]]), device_read=True),
        Bad("too-few", side.idx(new[:1])),
        Bad("duplicate", side.idx([new[0], new[0], *new[2:]]), device_read=True),
        Bad("free-slots", side.idx(free), device_read=True),
    ]


def _swa_node_bad(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    return [Bad("node-of-another-tree", h["other_node"]), Bad("detached", h["detached"])]


def _swa_unlock_bad(side: Twin, s: Subject) -> list[Bad]:
    out = _swa_node_bad(side, s)
    if s.handles["unlocked"] is not None and s.handles["unlocked"] is not s.handles.get("node"):
        out.append(Bad("unlocked-node", s.handles["unlocked"]))
    return out


def _unlock_args(side: Twin, s: Subject) -> dict[str, Any]:
    h = s.handles
    return {"node": h.get("node", s.obj.root_node), "swa_uuid_for_lock": h.get("uuid")}


SWA_TREE_METHODS = {
    "SWARadixCache.match_prefix": Method(
        lambda side, s: {"key": key(side, [1] * PS)}, bad={"key": _swa_key_bad}
    ),
    "SWARadixCache.insert": Method(
        _swa_insert_args,
        bad={
            "key": _swa_key_bad,
            "value": _swa_value_bad,
            "swa_evicted_seqlen": lambda side, s: [Bad("mid-page", 1), Bad("past-key", 2 * PS)],
            "prev_prefix_len": lambda side, s: [Bad("past-key", 2 * PS)],
        },
    ),
    "SWARadixCache.inc_lock_ref": Method(
        lambda side, s: {"node": s.handles.get("node", s.obj.root_node)},
        bad={"node": _swa_node_bad},
    ),
    "SWARadixCache.dec_lock_ref": Method(
        lambda side, s: {**_unlock_args(side, s), "skip_swa": False},
        bad={"node": _swa_unlock_bad},
        signed=("swa_uuid_for_lock",),
    ),
    "SWARadixCache.dec_swa_lock_only": Method(
        _unlock_args, bad={"node": _swa_unlock_bad}, signed=("swa_uuid_for_lock",)
    ),
    "SWARadixCache.evict": Method(lambda side, s: {"num_tokens": PS, "swa_num_tokens": PS}),
    "full_evictable_size": Method(reads=True),
    "full_protected_size": Method(reads=True),
    "swa_evictable_size": Method(reads=True),
    "swa_protected_size": Method(reads=True),
    "depth": Method(reads=True),
}

# --------------------------------------------------------------------------- chunk cache
CHUNK_METHODS = {
    f"SWAChunkCache.{name}": method
    for name, method in {
        "match_prefix": Method(
            lambda side, s: {"key": key(side, [1, 2])}, bad={"key": _swa_key_bad}
        ),
        "insert": Method(
            lambda side, s: {
                "key": key(side, [8, 9]),
                "value": side.idx(
                    as_list(s.obj.req_to_token_pool.read(s.handles["req"].req_pool_idx, 0, 2))
                ),
                "priority": 0,
                "chunked": False,
                "inserted_len": None,
            },
            signed=("priority",),
        ),
        "evict": Method(lambda side, s: {"num_tokens": 1}),
        "inc_lock_ref": Method(lambda side, s: {"node": None}, bad={"node": _chunk_node_bad}),
        "dec_lock_ref": Method(lambda side, s: {"node": None}, bad={"node": _chunk_node_bad}),
        "cache_finished_req": Method(
            _release_args, bad={"req": request_bad, "row_read": row_read_bad}
        ),
        "cache_unfinished_req": Method(
            _unfinished_args, bad={"req": unfinished_bad, "row_read": row_read_bad}
        ),
        "evictable_size": Method(reads=True),
        "protected_size": Method(reads=True),
        "total_size": Method(reads=True),
        "pretty_print": Method(reads=True),
    }.items()
}


def _chunk(side: Twin, seed: int) -> Subject:
    r = rng(seed)
    table = make(side, "ReqToTokenPool", ROWS, COLUMNS)
    alloc = make(side, "SWATokenToKVPoolAllocator", 48, 24, 1)
    cache = make(side, "SWAChunkCache", table, alloc, 1, 4)
    req = live_request(side, r, cache, table, alloc)

    def state() -> Any:
        return (cache.snapshot(), alloc.snapshot(), table.snapshot(table_rows()), req_fields(req))

    return Subject(cache, state, {"req": req})


# --------------------------------------------------------------------------- family
def _build(side: Twin, cls: str, seed: int) -> Subject:
    if cls in ALLOCATORS:
        return _allocator(side, cls, seed)
    if cls == "SWAKVPool":
        return _kv_pool(side, cls, seed)
    if cls == "SWAChunkCache":
        return _chunk(side, seed)
    cache, alloc, h = _swa_tree(side, seed)
    if cls == "SWATreeNode":
        node = h.get("node", cache.root_node)
        return Subject(node, lambda: (node.depth(), _tree_state(cache, alloc)), h)
    if cls == "SWAMatchResult":
        match = cache.match_prefix(key(side, [1] * PS))
        return Subject(match, lambda: _tree_state(cache, alloc), h)
    return Subject(cache, lambda: _tree_state(cache, alloc), h)


FAMILY = Family(
    name="swa",
    classes=(
        "SWAChunkCache",
        "SWAKVPool",
        "SWATokenToKVPoolAllocator",
        "PureSWATokenToKVPoolAllocator",
        "SWARadixCache",
        "SWATreeNode",
        "SWAMatchResult",
    ),
    build=_build,
    methods={
        **{
            f"{c}.{k}": v
            for c in ALLOCATORS
            for k, v in ALLOCATOR_METHODS.items()
            if hasattr(klass(Twin("reference"), c), k)
        },
        "SWATokenToKVPoolAllocator.backup_state": Method(reads=True, refused_in=_group_open),
        **{f"SWAKVPool.{k}": v for k, v in KV_METHODS.items()},
        **SWA_TREE_METHODS,
        **CHUNK_METHODS,
        "snapshot": Method(reads=True),
    },
    exempt={
        **ALLOCATOR_EXEMPT,
        "reset": "forgets the tree (or nothing, for a chunk cache): legal in every state",
    },
)
