"""Contracts of the ``mamba`` family, its pools: ``MambaSlotAllocator``, ``MambaPool`` and
``HybridReqToTokenPool`` (the states they reach are on
:mod:`tests.contract.families.mamba`'s docstring, which assembles the family), with the request
fields the whole family reads.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from tests.bad_inputs.harness import Twin
from tests.contract.families.pools import REQ_TABLE_METHODS
from tests.contract.machinery import Bad, Method, Subject, make, rng


def _is_none(got: Any) -> bool:
    return got is None


def _fields(req: Any) -> tuple[Any, ...]:
    """Everything of a request a call may change (its node by id: nodes are not comparable)."""
    out: list[Any] = []
    for name, value in sorted(vars(req).items()):
        if name.startswith("_"):
            continue  # the twin's token caches: they only grow, and mean nothing new
        if name == "last_node":
            value = None if value is None else value.node_id
        elif hasattr(value, "tolist"):
            value = value.tolist()
        elif isinstance(value, list):
            value = list(value)
        out.append((name, value))
    return tuple(out)


# --------------------------------------------------------------------------- slot allocator
def _slot_allocator(side: Twin, seed: int) -> Subject:
    a = make(side, "MambaSlotAllocator", 8)
    r = rng(seed)
    held: list[int] = []
    for _ in range(r.randint(2, 4)):
        got = a.alloc(r.randint(1, 2))
        held += got or []
    if len(held) > 1 and r.random() < 0.5:
        a.free([held.pop(0)])
    if r.random() < 0.5:
        a.alloc_group_begin(r.randint(1, 2))
    free = a.snapshot().free_slots
    return Subject(a, a.snapshot, {"held": held, "free": free[0] if free else None})


def _not_held(side: Twin, s: Subject) -> list[Bad]:
    h = s.handles
    out = [
        Bad("slot-0", [0]),
        Bad("past-pool", [9]),
        Bad("duplicate", [h["held"][0], h["held"][0]]),
    ]
    if h["free"] is not None:
        out.append(Bad("free-slot", [h["free"]]))
    group = s.obj.snapshot().group_slots
    if group:
        out.append(Bad("prefetched-slot", [group[0]]))
    return out


SLOT_ALLOCATOR_METHODS = {
    "alloc": Method(lambda side, s: {"need_size": 1}, unbounded=("need_size",), answer=_is_none),
    "alloc_group_begin": Method(lambda side, s: {"num_reqs": 1}, unbounded=("num_reqs",)),
    "free": Method(lambda side, s: {"indices": s.handles["held"][:1]}, bad={"indices": _not_held}),
    "available_size": Method(reads=True),
    "schedulable_available_size": Method(reads=True),
    "snapshot": Method(reads=True),
}
SLOT_ALLOCATOR_EXEMPT = {
    "MambaSlotAllocator.alloc_group_end": "closes the group (a no-op when none is open): legal "
    "in every state",
    "MambaSlotAllocator.clear": "a reset without arguments: legal in every state",
}


# --------------------------------------------------------------------------- state pool
def _pool(side: Twin, seed: int) -> Subject:
    p = make(side, "MambaPool", 6, 2)
    r = rng(seed)
    slots = r.sample(range(1, 7), r.randint(1, 4))
    p.write_state(side.idx(slots), side.idx([r.randint(1, 1000) for _ in slots]))
    return Subject(p, p.snapshot, {"slots": slots})


def _pool_slots_bad(side: Twin, s: Subject) -> list[Bad]:
    """Slot 0 and one past the pool: a range check (a device read for the twin's tensors)."""
    dev = not side.is_ref
    return [Bad("slot-0", side.idx([0]), dev), Bad("past-pool", side.idx([7]), dev)]


def _pool_distinct_bad(side: Twin, s: Subject) -> list[Bad]:
    dev = not side.is_ref
    return [*_pool_slots_bad(side, s), Bad("duplicate", side.idx([1, 1]), dev)]


POOL_METHODS = {
    "check_slots": Method(
        lambda side, s: {"indices": side.idx([1])}, bad={"indices": _pool_slots_bad}
    ),
    "check_slots_host": Method(
        lambda side, s: {"slots": [1]},
        bad={"slots": lambda side, s: [Bad("slot-0", [0]), Bad("past-pool", [7])]},
    ),
    "clear_slots": Method(
        lambda side, s: {"indices": side.idx([1])}, bad={"indices": _pool_slots_bad}
    ),
    "copy_from": Method(
        lambda side, s: {"src_indices": side.idx([1]), "dst_indices": side.idx([2])},
        bad={
            "src_indices": lambda side, s: [
                *_pool_slots_bad(side, s),
                Bad("overlaps-dst", side.idx([2]), not side.is_ref),
                Bad("too-many", side.idx([1, 3])),
            ],
            "dst_indices": _pool_distinct_bad,
        },
    ),
    "write_state": Method(
        lambda side, s: {"indices": side.idx([1]), "tags": side.idx([5])},
        bad={
            "indices": _pool_distinct_bad,
            "tags": lambda side, s: [Bad("too-many", side.idx([5, 6])), Bad("past-2**24", [2**24])],
        },
    ),
    "state_tags": Method(
        lambda side, s: {"indices": side.idx([1])}, bad={"indices": _pool_slots_bad}
    ),
    "snapshot": Method(reads=True),
}


# --------------------------------------------------------------------------- hybrid pool
def mreq(rid: str, **fields: Any) -> SimpleNamespace:
    """A request as the hybrid pool reads it (no row, no Mamba slot unless ``fields`` say)."""
    base: dict[str, Any] = {
        "rid": rid,
        "req_pool_idx": None,
        "is_chunked": 0,
        "kv_committed_len": 0,
        "mamba_pool_idx": None,
        "mamba_needs_clear": False,
        "mamba_cow_src_index": None,
        "mamba_ping_pong_track_buffer": None,
        "mamba_next_track_idx": None,
    }
    base.update(fields)
    return SimpleNamespace(**base)


def _hybrid(side: Twin, seed: int) -> Subject:
    r = rng(seed)
    track = r.randint(0, 2)
    pool = make(side, "HybridReqToTokenPool", 4, 8, 12, 1, track)  # room for 3 with 2 tracks
    reqs = [mreq(f"r{i}") for i in range(r.randint(1, 3))]
    pool.alloc(reqs)
    for q in reqs:
        n = r.randint(1, 8)
        pool.write((q.req_pool_idx, slice(0, n)), side.idx(list(range(1, n + 1))))
    rows = [(row, 8) for row in range(1, 5)]
    return Subject(
        pool,
        lambda: (pool.hybrid_snapshot(rows), tuple(_fields(q) for q in reqs)),
        {"reqs": reqs, "track": track, "free_row": next(iter(pool.free_slots))},
    )


def _free_mamba_of(pool: Any) -> int:
    return int(pool.mamba_allocator.snapshot().free_slots[0])


def _free_mamba(s: Subject) -> int:
    return _free_mamba_of(s.obj)


def _bad_mamba_reqs(side: Twin, s: Subject) -> list[Bad]:
    held = s.handles["reqs"][0].mamba_pool_idx
    fresh = mreq("dup")
    return [
        Bad("same-request-twice", [fresh, fresh]),
        Bad("holds-a-row", [mreq("x", req_pool_idx=s.handles["reqs"][0].req_pool_idx)]),
        Bad("row-out-of-range", [mreq("x", req_pool_idx=99, is_chunked=1)]),
        Bad("not-a-request", [3]),
        Bad("keeps-a-free-slot", [mreq("x", mamba_pool_idx=_free_mamba(s))]),
        Bad("keeps-slot-999", [mreq("x", mamba_pool_idx=999)]),
        Bad("keeps-slot-0", [mreq("x", mamba_pool_idx=0)]),
        Bad("keeps-bool-slot", [mreq("x", mamba_pool_idx=True)]),
        Bad("keeps-float-slot", [mreq("x", mamba_pool_idx=1.5)]),
        Bad("shares-a-slot", [mreq("x", mamba_pool_idx=held), mreq("y", mamba_pool_idx=held)]),
        Bad("track-not-a-list", [mreq("x", mamba_ping_pong_track_buffer=3)]),
        Bad("track-slot-999", [mreq("x", mamba_ping_pong_track_buffer=[999, 999])]),
        Bad("track-wrong-length", [mreq("x", mamba_ping_pong_track_buffer=[1, 2, 3])]),
    ]


def _not_requests(side: Twin, s: Subject) -> list[Bad]:
    """Batches that do not read as requests (a count needs no more: rows and kept slots are
    ``check_alloc``'s to judge)."""
    return [
        Bad("not-a-request", [3]),
        Bad("bool-slot", [mreq("x", mamba_pool_idx=True)]),
        Bad("float-slot", [mreq("x", mamba_pool_idx=1.5)]),
        Bad("track-not-a-list", [mreq("x", mamba_ping_pong_track_buffer=3)]),
    ]


def _bad_mamba_req(side: Twin, s: Subject) -> list[Bad]:
    return [
        Bad("no-slot", mreq("x")),
        Bad("free-slot", mreq("x", mamba_pool_idx=_free_mamba(s))),
        Bad("slot-999", mreq("x", mamba_pool_idx=999)),
        Bad("bool-slot", mreq("x", mamba_pool_idx=True)),
        Bad(
            "track-of-free-slots",
            mreq("x", mamba_pool_idx=_free_mamba(s), mamba_ping_pong_track_buffer=[_free_mamba(s)]),
        ),
        Bad("not-a-request", 3),
    ]


def _new_mamba_reqs(side: Twin, s: Subject) -> dict[str, Any]:
    return {"reqs": [mreq("new")]}


HYBRID_METHODS = {
    **{f"HybridReqToTokenPool.{k}": v for k, v in REQ_TABLE_METHODS.items()},
    "HybridReqToTokenPool.alloc": Method(
        _new_mamba_reqs, bad={"reqs": _bad_mamba_reqs}, answer=_is_none
    ),
    "HybridReqToTokenPool.check_alloc": Method(_new_mamba_reqs, bad={"reqs": _bad_mamba_reqs}),
    "HybridReqToTokenPool.mamba_slots_needed": Method(_new_mamba_reqs, bad={"reqs": _not_requests}),
    "HybridReqToTokenPool.get_mamba_indices": Method(
        lambda side, s: {"rows": side.idx([s.handles["reqs"][0].req_pool_idx])},
        bad={
            "rows": lambda side, s: [
                Bad("row-0", side.idx([0]), not side.is_ref),
                Bad("past-table", side.idx([5]), not side.is_ref),
            ]
        },
    ),
    "HybridReqToTokenPool.free_mamba_cache": Method(
        lambda side, s: {"req": s.handles["reqs"][0], "mamba_ping_pong_track_buffer_to_keep": None},
        bad={
            "req": _bad_mamba_req,
            "mamba_ping_pong_track_buffer_to_keep": lambda side, s: [Bad("past-track", 2)],
        },
    ),
    "HybridReqToTokenPool.hybrid_snapshot": Method(
        lambda side, s: {"rows": [(1, 8)]},
        bad={"rows": lambda side, s: [Bad("row-out-of-range", [(9, 8)]), Bad("None", None)]},
    ),
}
HYBRID_EXEMPT = {"HybridReqToTokenPool.clear": "a reset without arguments: legal in every state"}
