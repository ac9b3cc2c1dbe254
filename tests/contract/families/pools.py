"""Contracts of the ``pools`` wing: the token-slot allocators (page size 1 and paged) and the
request table.

Reachable states (seeded, legal calls only):

- an allocator of 8 pages (page size 1, or 4), ``need_sort`` on for some seeds, after a mix of
  allocations and frees; some slots held, some pages free, and for some seeds a free group left
  open with one held allocation buffered in it (its slots are then no longer the caller's);
- a request table of 4 rows and 8 columns with 1 to 3 requests holding rows (written), one of
  them freed again for some seeds, so that at least one row is free.

Bad values that only a device read refuses (slot and page values inside a tensor, ``last_loc``,
a device length that disagrees with its host copy) are marked ``device_read``: the unchecked
twin may take them (README, "Checked mode"). Values given as Python lists are host values and
are refused on every side.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

from kvpool.errors import KVPoolError
from tests.bad_inputs.harness import Twin
from tests.contract.machinery import Bad, Family, Method, Subject, make, rng

# --------------------------------------------------------------------------- allocators
ALLOCATORS = ("BaseTokenToKVPoolAllocator", "TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator")
PAGES = 8


def _page_size(cls: str) -> int:
    return 1 if cls == "TokenToKVPoolAllocator" else 4


def _allocator(side: Twin, cls: str, seed: int) -> Subject:
    """8 pages; 2 to 5 allocations of 1 or 2 pages, maybe one freed, maybe a group left open."""
    ps = _page_size(cls)
    size = PAGES * ps
    r = rng(seed)
    need_sort = r.random() < 0.4
    args: tuple[Any, ...] = (size,) if ps == 1 else (size, ps)
    a = make(side, cls, *args, need_sort)
    held: list[list[int]] = []
    for _ in range(r.randint(2, 5)):
        got = a.alloc(ps * r.randint(1, 2))
        if got is not None:
            held.append([int(x) for x in got])
    if len(held) > 2 and r.random() < 0.5:
        a.free(side.idx(held.pop(0)))
    if len(held) > 2 and r.random() < 0.3:
        a.free_group_begin()
        a.free(side.idx(held.pop(0)))  # buffered: these slots are no longer the caller's
    slots = sorted(x for h in held for x in h)
    pages = sorted({s // ps for s in slots})
    free_pages = sorted(set(range(1, PAGES + 1)) - {s // ps for h in held for s in h})
    free_pages = [p for p in free_pages if p not in _buffered_pages(a, ps)]
    return Subject(
        a,
        lambda: (a.snapshot(), a.available_size()),
        {
            "held": slots,
            "held_pages": pages,
            "free_page": free_pages[0] if free_pages else None,
            "buffered": _buffered_pages(a, ps),
            "ps": ps,
            "size": size,
        },
    )


def _buffered_pages(a: Any, ps: int) -> list[int]:
    return sorted({int(s) // ps for s in a.snapshot().pending_free})


def _held(side: Twin, s: Subject) -> Any:
    return side.idx(s.handles["held"][:1])


def _slot_values(side: Twin, s: Subject) -> list[Bad]:
    """Slots the caller does not hold (a device read on the twin): the reserved page, past the
    pool, negative, a free slot, a slot buffered in the open group, a held slot with a free one,
    and (page size 1) a slot named twice."""
    h = s.handles
    ps = h["ps"]
    out = [
        Bad("slot-0", side.idx([0]), device_read=True),
        Bad("past-pool", side.idx([h["size"] + ps]), device_read=True),
        Bad("negative-slot", side.idx([-1]), device_read=True),
    ]
    if ps == 1:
        out.append(Bad("duplicate", side.idx([h["held"][0], h["held"][0]]), device_read=True))
    if h["free_page"] is not None:
        free_slot = h["free_page"] * ps
        out.append(Bad("free-slot", side.idx([free_slot]), device_read=True))
        out.append(Bad("held-and-free", side.idx([h["held"][0], free_slot]), device_read=True))
    if h["buffered"] and ps == 1:  # paged: a page named again in a group is freed once
        out.append(Bad("buffered-slot", side.idx([h["buffered"][0]]), device_read=True))
    # A float that truncates to a held slot: only a type check refuses it (a range or
    # ownership check would take it for that slot).
    out += [Bad("float-of-held", [float(h["held"][0])]), Bad("held+0.5", [h["held"][0] + 0.5])]
    return out


def _segment_values(side: Twin, s: Subject) -> list[Bad]:
    """As :func:`_slot_values`, and (paged) a run of ``page_size`` slots spread over two pages:
    the segment would free the first page only."""
    out = _slot_values(side, s)
    h = s.handles
    ps = h["ps"]
    if ps > 1 and len(h["held_pages"]) > 1:
        a, b = h["held_pages"][:2]
        run = [a * ps, b * ps] + [a * ps + k for k in range(2, ps)]
        out.append(Bad("run-over-two-pages", side.idx(run), device_read=True))
    return out


def _page_values(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    out = [
        Bad("page-0", side.idx([0]), device_read=True),
        Bad("past-pool", side.idx([PAGES + 1]), device_read=True),
        Bad("negative-page", side.idx([-1]), device_read=True),
    ]
    if h["free_page"] is not None:
        out.append(Bad("free-page", side.idx([h["free_page"]]), device_read=True))
    page = h["held_pages"][0]
    out.append(Bad("duplicate", side.idx([page, page]), device_read=True))
    if h["buffered"] and h["ps"] == 1:
        out.append(Bad("buffered-page", side.idx([h["buffered"][0]]), device_read=True))
    out += [Bad("float-of-held", [float(page)]), Bad("held+0.5", [page + 0.5])]  # type only
    return out


def _extend_args(side: Twin, s: Subject) -> dict[str, Any]:
    """One request whose 1-token prefix ends at the first slot of a held page, growing to 2."""
    loc = s.handles["held_pages"][0] * s.handles["ps"]
    return {
        "prefix_lens": side.idx([1]),
        "prefix_lens_cpu": [1],
        "seq_lens": side.idx([2]),
        "seq_lens_cpu": [2],
        "last_loc": side.idx([loc]),
        "extend_num_tokens": 1,
    }


def _decode_args(side: Twin, s: Subject) -> dict[str, Any]:
    """The same request's decode step: 2 tokens, the first at the first slot of a held page."""
    loc = s.handles["held_pages"][0] * s.handles["ps"]
    return {"seq_lens": side.idx([2]), "seq_lens_cpu": [2], "last_loc": side.idx([loc])}


def _last_loc_values(side: Twin, s: Subject) -> list[Bad]:
    """``last_loc`` of a request with a 1-token prefix that is not its prefix's last slot."""
    h = s.handles
    ps = h["ps"]
    out = [
        Bad("no-last-loc", side.idx([-1]), device_read=True),
        Bad("slot-0", side.idx([0]), device_read=True),
    ]
    if ps == 1:  # a prefix never ends mid-page: only its presence is read (as SGLang)
        return out
    out.append(Bad("past-pool", side.idx([h["size"] + ps]), device_read=True))
    out.append(Bad("mid-page", side.idx([h["held_pages"][0] * ps + 1]), device_read=True))
    if h["free_page"] is not None:
        out.append(Bad("free-page", side.idx([h["free_page"] * ps]), device_read=True))
    return out


def _is_none(got: Any) -> bool:
    return got is None


def _restore_values(side: Twin, s: Subject) -> list[Bad]:
    """Free lists no backup could hold: a repeated page, page 0, a page past the pool (device
    reads on the twin), and shapes that are not two lists of page ids."""
    empty = side.idx([])
    return [
        Bad("repeated-page", (side.idx([1, 1]), empty), device_read=True),
        Bad("page-0", (side.idx([0]), empty), device_read=True),
        Bad("past-pool", (side.idx([PAGES + 1]), empty), device_read=True),
        Bad("three-parts", (empty, empty, empty)),
        Bad("None-part", (None, empty)),
        Bad("float-pages", (side.floats([1.5]), empty)),
        Bad("list-not-tuple", [empty, empty]),
        Bad("int", 3),
    ]


ALLOCATOR_METHODS = {
    "alloc": Method(
        lambda side, s: {"need_size": s.handles["ps"]},
        bad={
            "need_size": lambda side, s: (
                [Bad("more-than-the-pool", s.handles["size"] + 8)]
                + ([Bad("unaligned", s.handles["ps"] + 1)] if s.handles["ps"] > 1 else [])
            )
        },
        answer=_is_none,
    ),
    "alloc_extend": Method(
        _extend_args,
        bad={
            "prefix_lens": lambda side, s: [
                Bad("disagrees-with-host", side.idx([0]), device_read=True)
            ],
            "prefix_lens_cpu": lambda side, s: [Bad("past-seq", [3]), Bad("longer", [1, 1])],
            "seq_lens": lambda side, s: [
                Bad("disagrees-with-host", side.idx([3]), device_read=True)
            ],
            "seq_lens_cpu": lambda side, s: [Bad("shorter", []), Bad("below-prefix", [0])],
            "last_loc": _last_loc_values,
            "extend_num_tokens": lambda side, s: [Bad("not-the-sum", 3), Bad("zero", 0)],
        },
        signed=("last_loc",),
        answer=_is_none,
    ),
    "alloc_decode": Method(
        _decode_args,
        bad={
            "seq_lens": lambda side, s: [
                Bad("disagrees-with-host", side.idx([3]), device_read=True)
            ],
            "seq_lens_cpu": lambda side, s: [Bad("zero", [0]), Bad("longer", [2, 2])],
            "last_loc": _last_loc_values,
        },
        signed=("last_loc",),
        answer=_is_none,
    ),
    "free": Method(
        lambda side, s: {"free_index": _held(side, s)}, bad={"free_index": _slot_values}
    ),
    "free_segment": Method(
        lambda side, s: {"free_index": _held(side, s), "start_pos": 0},
        bad={
            "free_index": _segment_values,
            "start_pos": lambda side, s: [Bad("unaligned", 1)] if s.handles["ps"] > 1 else [],
        },
    ),
    "free_page_ids": Method(
        lambda side, s: {"page_ids": side.idx(s.handles["held_pages"][:1])},
        bad={"page_ids": _page_values},
    ),
    "restore_state": Method(
        lambda side, s: {"state": s.obj.backup_state()}, bad={"state": _restore_values}
    ),
    "available_size": Method(reads=True),
    "backup_state": Method(reads=True),
    "snapshot": Method(reads=True),
    "free_group_begin": Method(refused_in=lambda side, s: _group_open(s)),
    "free_group_end": Method(refused_in=lambda side, s: _no_group(s)),
}


def _group_open(s: Subject) -> list[tuple[str, Subject]]:
    """The subject with a free group open (opened here unless the builder left one open): a
    second begin is refused."""
    with contextlib.suppress(KVPoolError):
        s.obj.free_group_begin()
    return [("group-open", s)]


def _no_group(s: Subject) -> list[tuple[str, Subject]]:
    """The subject with no free group open (its open one closed here): an end is refused."""
    with contextlib.suppress(KVPoolError):
        s.obj.free_group_end()
    with contextlib.suppress(KVPoolError):
        s.obj.free_group_begin()
        s.obj.free_group_end()
        return [("no-group", s)]
    return []


ALLOCATOR_EXEMPT = {
    "clear": "a reset without arguments: legal in every state",
    "merge_and_sort_free": "sorts the free list; legal in every state",
}

# --------------------------------------------------------------------------- request table
ROWS, CONTEXT = 4, 8


def _request(row: object = None, rid: str = "x", chunked: object = 0, committed: int = 0) -> Any:
    return SimpleNamespace(
        req_pool_idx=row, rid=rid, is_chunked=chunked, kv_committed_len=committed
    )


def _req_table(side: Twin, cls: str, seed: int) -> Subject:
    """4 rows; 1 to 3 requests take rows and write 1 to 8 columns; maybe one frees its row."""
    pool = make(side, "ReqToTokenPool", ROWS, CONTEXT)
    r = rng(seed)
    reqs = [_request(rid=f"r{i}") for i in range(r.randint(1, 3))]
    pool.alloc(reqs)
    for q in reqs:
        n = r.randint(1, CONTEXT)
        q.kv_committed_len = n
        pool.write((q.req_pool_idx, slice(0, n)), side.idx(list(range(1, n + 1))))
    if len(reqs) > 1 and r.random() < 0.5:
        pool.free(reqs.pop())
    rows = [(row, CONTEXT) for row in range(1, ROWS + 1)]

    def state() -> Any:
        return pool.snapshot(rows), [(q.req_pool_idx, q.kv_committed_len) for q in reqs]

    return Subject(pool, state, {"reqs": reqs, "free_row": pool.free_slots[0]})


def _new_reqs(side: Twin, s: Subject) -> dict[str, Any]:
    return {"reqs": [_request(rid="new")]}


def _bad_reqs(side: Twin, s: Subject) -> list[Bad]:
    fresh = _request(rid="dup")
    held = s.handles["reqs"][0]
    row, free_row = held.req_pool_idx, s.handles["free_row"]
    return [
        Bad("same-request-twice", [fresh, fresh]),
        Bad("holds-a-row", [_request(row)]),
        Bad("keeps-a-free-row", [_request(free_row, chunked=1)]),
        Bad("keeps-a-row-twice", [_request(row, chunked=1), _request(row, committed=1)]),
        Bad("row-out-of-range", [_request(99, chunked=1)]),
        Bad("row-0", [_request(0, chunked=1)]),
        Bad("float-row", [_request(1.0, chunked=1)]),
        Bad("str-chunked", [_request(row, chunked="1")]),
        Bad("not-a-request", [3]),
    ]


def _too_many_reqs(side: Twin, s: Subject) -> list[Bad]:
    """More fresh requests than rows: ``alloc`` answers ``None`` (``check_alloc`` only counts)."""
    return [*_bad_reqs(side, s), Bad("more-than-the-rows", [_request() for _ in range(ROWS + 1)])]


def _row(s: Subject) -> int:
    return int(s.handles["reqs"][0].req_pool_idx)


def _rows(s: Subject) -> list[Bad]:
    return [Bad("free-row", s.handles["free_row"]), Bad("row-0", 0), Bad("past-rows", ROWS + 1)]


def _index_values(side: Twin, s: Subject) -> list[Bad]:
    row = _row(s)
    return [
        Bad("free-row", (s.handles["free_row"], slice(0, 1))),
        Bad("row-0", (0, slice(0, 1))),
        Bad("past-context", (row, slice(CONTEXT, CONTEXT + 1))),
        Bad("step-slice", (row, slice(0, 2, 2))),
        Bad("open-slice", (row, slice(None, 1))),
        Bad("reversed-slice", (row, slice(1, 0))),
        Bad("not-a-pair", 3),
        Bad("list-pair", [row, slice(0, 1)]),
        Bad("float-row", (1.5, slice(0, 1))),
        Bad("bool-row", (True, slice(0, 1))),
        Bad("float-bound", (row, slice(0.0, 1))),
    ]


def _slot_entries(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("too-many", side.idx([1, 2])),
        Bad("negative-slot", side.idx([-1]), device_read=True),
        Bad("past-int32", side.idx([2**31]), device_read=True),
    ]


REQ_TABLE_METHODS = {
    "alloc": Method(_new_reqs, bad={"reqs": _too_many_reqs}, answer=_is_none),
    "check_alloc": Method(_new_reqs, bad={"reqs": _bad_reqs}),
    "free": Method(
        lambda side, s: {"req": s.handles["reqs"][0]},
        bad={
            "req": lambda side, s: [
                Bad("no-row", _request()),
                Bad("free-row", _request(s.handles["free_row"])),
                Bad("row-0", _request(0)),
                Bad("bool-row", _request(True)),
                Bad("past-rows", _request(ROWS + 1)),
            ]
        },
    ),
    "read": Method(
        lambda side, s: {"row": _row(s), "start": 0, "stop": 1},
        bad={
            "row": lambda side, s: _rows(s),
            "start": lambda side, s: [Bad("after-stop", 2)],
            "stop": lambda side, s: [Bad("past-context", CONTEXT + 1), Bad("before-start", -1)],
        },
    ),
    "write": Method(
        lambda side, s: {"index": (_row(s), slice(0, 1)), "values": side.idx([1])},
        bad={"index": _index_values, "values": _slot_entries},
    ),
    "snapshot": Method(
        lambda side, s: {"rows": [(1, CONTEXT)]},
        bad={
            "rows": lambda side, s: [
                Bad("row-out-of-range", [(ROWS + 1, CONTEXT)]),
                Bad("row-0", [(0, 1)]),
                Bad("past-context", [(1, CONTEXT + 1)]),
                Bad("negative-length", [(1, -1)]),
                Bad("bool-length", [(1, True)]),
                Bad("not-pairs", [3]),
                Bad("triple", [(1, 2, 3)]),
                Bad("None", None),
                Bad("str", "12"),
            ]
        },
    ),
    "available_size": Method(reads=True),
}

REQ_TABLE_EXEMPT = {"ReqToTokenPool.clear": "a reset without arguments: legal in every state"}


def _build(side: Twin, cls: str, seed: int) -> Subject:
    return _req_table(side, cls, seed) if cls == "ReqToTokenPool" else _allocator(side, cls, seed)


FAMILY = Family(
    name="pools",
    classes=(*ALLOCATORS, "ReqToTokenPool"),
    build=_build,
    methods={
        **ALLOCATOR_METHODS,
        **{f"ReqToTokenPool.{k}": v for k, v in REQ_TABLE_METHODS.items()},
    },
    exempt={**ALLOCATOR_EXEMPT, **REQ_TABLE_EXEMPT},
    abstract=("BaseTokenToKVPoolAllocator",),
)
