"""Contracts of the ``radix`` family: the radix prefix cache and the chunk cache.

Reachable state (both classes): a request table of 4 rows of 16 columns and a page-size-1
allocator of 48 slots. The radix cache holds 1 to 3 seeded token sequences (vocabulary 1..4, so
they share prefixes and split nodes), each inserted at freshly allocated slots whose duplicates
the caller then freed. One live request ("running") holds a row: its prefix was matched and
locked, its other tokens got new slots, and the row maps all of its tokens. The chunk cache
gets the same request (it matches nothing, so the request owns every slot).

``state()`` reads the tree's snapshot (lock counts included), the allocator's snapshot (the tree
frees into it), the request table and every pool field of the live request.

The request builders (:func:`live_request`, :func:`request_bad`) are shared with the ``swa``
family's chunk cache.
"""

from __future__ import annotations

import copy
from typing import Any

from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Family, Method, Subject, klass, make, rng

VOCAB = 4
ROWS, COLUMNS = 4, 16


def key(side: Twin, tokens: list[int], extra: str | None = None) -> Any:
    return klass(side, "RadixKey")(tokens, extra)


def as_list(values: Any) -> list[int]:
    return [int(v) for v in values]


def plain(values: Any) -> Any:
    """``values`` as a list of ints when it is one, else its repr (a bad call may have stored
    anything there: the state must still be readable to show it changed)."""
    try:
        return as_list(values)
    except (TypeError, ValueError):
        return repr(values)


def req_fields(req: Any) -> tuple[Any, ...]:
    """Every pool field of a request, as plain values."""
    node = req.last_node
    return (
        req.rid,
        req.state,
        req.req_pool_idx,
        plain(req.prefix_indices),
        None if node is None else node.node_id,
        plain(req.fill_ids),
        req.kv_committed_len,
        req.kv_allocated_len,
        req.cache_protected_len,
        req.cache_inserted_len,
        req.is_chunked,
    )


def live_request(side: Twin, r: Any, cache: Any, table: Any, alloc: Any, ps: int = 1) -> Any:
    """A running request over ``cache``: a row, its matched prefix locked, new slots for the
    rest (allocated page by page through ``alloc_extend`` above page size 1), the row written."""
    tokens = [r.randint(1, VOCAB) for _ in range(r.randint(3, 8) * ps)]
    req = klass(side, "Req")(f"live{r.randint(0, 99)}", tokens)
    table.alloc([req])
    match = cache.match_prefix(key(side, tokens))
    prefix = as_list(match.device_indices)
    if match.last_device_node is not None:
        cache.inc_lock_ref(match.last_device_node)
    need = len(tokens) - len(prefix)
    if ps == 1:
        own = as_list(alloc.alloc(need)) if need else []
    else:
        last = prefix[-1] if prefix else -1
        own = as_list(
            alloc.alloc_extend(
                side.idx([len(prefix)]),
                [len(prefix)],
                side.idx([len(tokens)]),
                [len(tokens)],
                side.idx([last]),
                need,
            )
        )
    slots = prefix + own
    table.write((req.req_pool_idx, slice(0, len(slots))), side.idx(slots))
    req.prefix_indices = match.device_indices
    req.last_node = match.last_device_node
    req.fill_ids = list(tokens)
    req.kv_committed_len = req.kv_allocated_len = len(tokens)
    req.cache_protected_len = len(prefix)
    req.state = "running"
    return req


def table_rows() -> list[tuple[int, int]]:
    return [(row, COLUMNS) for row in range(1, ROWS + 1)]


def _with(req: Any, **fields: Any) -> Any:
    out = copy.copy(req)
    for name, value in fields.items():
        setattr(out, name, value)
    return out


def unfinished_bad(side: Twin, s: Subject) -> list[Bad]:
    """:func:`request_bad`, and a request whose ``fill_ids`` (what a chunk release reads) is
    no sequence."""
    return [*request_bad(side, s), Bad("fill-not-a-list", _with(s.handles["req"], fill_ids=None))]


def request_bad(side: Twin, s: Subject) -> list[Bad]:
    """Requests a release must refuse: no row, a free row, a row out of range, lengths that
    break ``cache_protected_len <= kv_committed_len <= len(tokens)``, fields of wrong types,
    and (for a tree) a lock node that is detached or of another tree."""
    req = s.handles["req"]
    free_row = next(r for r in range(1, ROWS + 1) if r != req.req_pool_idx)
    n = len(req.fill_ids)
    out = [
        Bad("no-row", _with(req, req_pool_idx=None)),
        Bad("free-row", _with(req, req_pool_idx=free_row)),
        Bad("row-out-of-range", _with(req, req_pool_idx=ROWS + 5)),
        Bad("row-0", _with(req, req_pool_idx=0)),
        Bad("bool-row", _with(req, req_pool_idx=True)),
        Bad("committed-past-tokens", _with(req, kv_committed_len=n + 1)),
        Bad("committed-past-row", _with(req, kv_committed_len=COLUMNS + 1)),
        Bad("negative-committed", _with(req, kv_committed_len=-1)),
        Bad("float-committed", _with(req, kv_committed_len=float(n))),
        Bad("protected-past-committed", _with(req, cache_protected_len=n + 1)),
        Bad("str-protected", _with(req, cache_protected_len="0")),
        Bad("tokens-not-a-list", _with(req, origin_input_ids=None)),
    ]
    if "other_node" in s.handles:
        out += [
            Bad("node-of-another-tree", _with(req, last_node=s.handles["other_node"])),
            Bad("detached-node", _with(req, last_node=s.handles["detached"])),
            Bad("node-not-a-node", _with(req, last_node=3)),
        ]
    return out


def row_read_bad(side: Twin, s: Subject) -> list[Bad]:
    """A row read of the wrong length (one column short, one too many)."""
    req = s.handles["req"]
    slots = as_list(s.obj.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len))
    return [Bad("short", side.idx(slots[:-1])), Bad("long", side.idx([*slots, slots[-1]]))]


def _row_read(side: Twin, s: Subject) -> Any:
    req = s.handles["req"]
    return s.obj.req_to_token_pool.read(req.req_pool_idx, 0, req.kv_committed_len)


# --------------------------------------------------------------------------- builders
def _other_tree(side: Twin) -> tuple[Any, Any]:
    """(a node of another tree, a node evicted from that tree)."""
    alloc = make(side, "TokenToKVPoolAllocator", 8)
    other = make(side, "RadixCache", None, alloc, 1)
    other.insert(key(side, [1, 2]), alloc.alloc(2))
    other.insert(key(side, [3]), alloc.alloc(1))
    node = other.match_prefix(key(side, [1, 2])).last_device_node
    detached = other.match_prefix(key(side, [3])).last_device_node
    other.inc_lock_ref(node)
    other.evict(1)
    assert detached.parent is None
    return node, detached


def _build(side: Twin, cls: str, seed: int) -> Subject:
    r = rng(seed)
    table = make(side, "ReqToTokenPool", ROWS, COLUMNS)
    alloc = make(side, "TokenToKVPoolAllocator", 48)
    cache = make(side, cls, table, alloc, 1)
    handles: dict[str, Any] = {}
    if cls == "RadixCache":
        for _ in range(r.randint(1, 3)):
            tokens = [r.randint(1, VOCAB) for _ in range(r.randint(2, 6))]
            slots = alloc.alloc(len(tokens))
            done = cache.insert(key(side, tokens), slots)
            if done:
                alloc.free(slots[:done])
        handles["other_node"], handles["detached"] = _other_tree(side)
    req = live_request(side, r, cache, table, alloc)
    handles["req"] = req
    if cls == "RadixCache":
        leaves = [n for n in _nodes(cache) if not n.children and n.lock_ref == 0]
        handles["unlocked"] = leaves[0] if leaves else None
        handles["node"] = req.last_node

    def state() -> Any:
        return (cache.snapshot(), alloc.snapshot(), table.snapshot(table_rows()), req_fields(req))

    return Subject(cache, state, handles)


def _nodes(cache: Any) -> list[Any]:
    out, stack = [], list(cache.root_node.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


# --------------------------------------------------------------------------- methods
def _insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    """Two new tokens (outside the vocabulary: a new leaf) at two held slots."""
    held = as_list(s.obj.req_to_token_pool.read(s.handles["req"].req_pool_idx, 0, 2))
    return {
        "key": key(side, [VOCAB + 1, VOCAB + 2]),
        "value": side.idx(held),
        "priority": 0,
        "chunked": False,
        "inserted_len": None,
    }


def _insert_value_bad(side: Twin, s: Subject) -> list[Bad]:
    held = as_list(s.obj.req_to_token_pool.read(s.handles["req"].req_pool_idx, 0, 2))
    return [
        Bad("slot-0", side.idx([held[0], 0]), device_read=True),
        Bad("past-pool", side.idx([held[0], 48 + 1]), device_read=True),
        Bad("too-few", side.idx(held[:1])),
        Bad("duplicate", side.idx([held[0], held[0]]), device_read=True),
        Bad("free-slots", side.idx([47, 48]), device_read=True),
    ]


def _node_bad(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    out = [Bad("node-of-another-tree", h["other_node"]), Bad("detached", h["detached"])]
    if "unlocked" in h and h["unlocked"] is not None:
        out.append(Bad("match-result", klass(side, "MatchResult")([], None, None)))
    return out


def _unlock_bad(side: Twin, s: Subject) -> list[Bad]:
    out = _node_bad(side, s)
    if s.handles.get("unlocked") is not None:
        out.append(Bad("unlocked-node", s.handles["unlocked"]))
    return out


def _key_bad(side: Twin, s: Subject) -> list[Bad]:
    return [Bad("token-list", [1, 2]), Bad("tensor", side.idx([1, 2]))]


def _release_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"req": s.handles["req"], "is_insert": True, "row_read": _row_read(side, s)}


def _unfinished_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {"req": s.handles["req"], "chunked": False, "row_read": _row_read(side, s)}


def _checkpoint_bad(side: Twin, s: Subject) -> list[Bad]:
    req = s.handles["req"]
    out = [Bad("past-tokens", len(req.fill_ids) + 1), Bad("past-row", COLUMNS + 1)]
    if req.cache_protected_len:  # else every count up to the tokens is a legal checkpoint
        out.append(Bad("below-protected", req.cache_protected_len - 1))
    return out


COMMON = {
    "match_prefix": Method(lambda side, s: {"key": key(side, [1, 2])}, bad={"key": _key_bad}),
    "insert": Method(
        _insert_args,
        bad={"value": _insert_value_bad, "key": _key_bad},
        signed=("priority",),
    ),
    "evict": Method(lambda side, s: {"num_tokens": 1}),
    "cache_finished_req": Method(_release_args, bad={"req": request_bad, "row_read": row_read_bad}),
    "cache_unfinished_req": Method(
        _unfinished_args, bad={"req": unfinished_bad, "row_read": row_read_bad}
    ),
    "evictable_size": Method(reads=True),
    "protected_size": Method(reads=True),
    "total_size": Method(reads=True),
    "pretty_print": Method(reads=True),
    "snapshot": Method(reads=True),
}

RADIX = {
    "RadixCache.inc_lock_ref": Method(
        lambda side, s: {"node": s.handles["node"]}, bad={"node": _node_bad}
    ),
    "RadixCache.dec_lock_ref": Method(
        lambda side, s: {"node": s.handles["node"]}, bad={"node": _unlock_bad}
    ),
    "RadixCache.checkpoint": Method(
        lambda side, s: {
            "req": s.handles["req"],
            "up_to": s.handles["req"].kv_committed_len,
            "chunked": False,
        },
        bad={"req": request_bad, "up_to": _checkpoint_bad},
    ),
}


def _chunk_node_bad(side: Twin, s: Subject) -> list[Bad]:
    """A chunk cache has no nodes: any node is foreign."""
    return [Bad("a-tree-node", _other_tree(side)[0])]


CHUNK_LOCKS = {
    "inc_lock_ref": Method(lambda side, s: {"node": None}, bad={"node": _chunk_node_bad}),
    "dec_lock_ref": Method(lambda side, s: {"node": None}, bad={"node": _chunk_node_bad}),
}

EXEMPT = {"reset": "forgets the tree (or nothing, for a chunk cache): legal in every state"}

FAMILY = Family(
    name="radix",
    classes=(
        "RadixCache",
        "ChunkCache",
    ),
    build=_build,
    methods={**COMMON, **CHUNK_LOCKS, **RADIX},
    exempt=EXEMPT,
)
