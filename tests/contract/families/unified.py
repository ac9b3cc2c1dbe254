"""Contracts of the ``unified`` family: SGLang 0.5.23's unified tree and its components.

Each class is its legacy family's tree under 0.5.23's rules, so each reaches the state its
legacy family's builder reaches, built the same way (seeded legal calls):

- ``UnifiedRadixCache``: the ``radix`` family's state (a request table of 4 rows, 48 token slots,
  1 to 3 seeded sequences inserted, one running request whose prefix is matched and locked).
- ``UnifiedSWARadixCache``: the ``swa`` family's tree state (page size 4, window 4, full 48 and
  SWA 32 slots, seeded sequences, some SWA-evicted, one path locked, a held page).
- ``UnifiedMambaRadixCache`` / ``UnifiedMambaLifecycleCache``: the ``mamba`` family's tree state
  (a hybrid pool of 6 Mamba slots over 24 token slots, seeded keys with states, a node locked,
  sometimes a tombstone; the lifecycle tree also a running request).

``state()`` is the legacy family's: the tree's snapshot, its allocator's, the request table or
hybrid pool (Mamba slots and state tags) and every field of the requests the builder made.
The method tables are the legacy families', with this family's own signatures: the FULL set's
``insert`` takes ``prev_prefix_len`` (the tree frees the duplicates), the FULL+SWA set's
``insert`` takes ``inserted_len``.
"""

from __future__ import annotations

from typing import Any

from tests.bad_inputs.harness import Twin
from tests.contract.families import mamba, radix, swa
from tests.contract.machinery import Bad, Family, Method, Subject, make, rng

# --------------------------------------------------------------------------- FULL
FULL_SLOTS = 48


def _full(side: Twin, seed: int) -> Subject:
    """The ``radix`` family's reachable state, over the unified FULL tree."""
    r = rng(seed)
    table = make(side, "ReqToTokenPool", radix.ROWS, radix.COLUMNS)
    alloc = make(side, "TokenToKVPoolAllocator", FULL_SLOTS)
    cache = make(side, "UnifiedRadixCache", table, alloc, 1)
    for _ in range(r.randint(1, 3)):
        tokens = [r.randint(1, radix.VOCAB) for _ in range(r.randint(2, 6))]
        slots = alloc.alloc(len(tokens))
        cache.insert(radix.key(side, tokens), slots, prev_prefix_len=0)  # frees duplicates
    handles: dict[str, Any] = {}
    handles["other_node"], handles["detached"] = radix._other_tree(side)
    req = radix.live_request(side, r, cache, table, alloc)
    handles["req"] = req
    leaves = [n for n in radix._nodes(cache) if not n.children and n.lock_ref == 0]
    handles["unlocked"] = leaves[0] if leaves else None
    handles["node"] = req.last_node

    def state() -> Any:
        return (
            cache.snapshot(),
            alloc.snapshot(),
            table.snapshot(radix.table_rows()),
            radix.req_fields(req),
        )

    return Subject(cache, state, handles)


def _full_insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {**radix._insert_args(side, s), "prev_prefix_len": 0}


FULL_METHODS = {
    **{f"UnifiedRadixCache.{k}": v for k, v in radix.COMMON.items()},
    **{f"UnifiedRadixCache.{k.split('.')[1]}": v for k, v in radix.RADIX.items()},
    "UnifiedRadixCache.insert": Method(
        _full_insert_args,
        bad={
            "value": radix._insert_value_bad,
            "key": radix._key_bad,
            "prev_prefix_len": lambda side, s: [Bad("past-key", 3)],
        },
        signed=("priority",),
    ),
}

# --------------------------------------------------------------------------- FULL + SWA
PS, WINDOW = swa.PS, swa.WINDOW


def _full_swa(side: Twin, seed: int) -> Subject:
    """The ``swa`` family's tree state, over the unified FULL+SWA tree."""
    r = rng(seed)
    alloc = make(side, "SWATokenToKVPoolAllocator", swa.FULL, swa.SWA, PS)
    cache = make(side, "UnifiedSWARadixCache", alloc, PS, WINDOW)
    for _ in range(r.randint(1, 3)):
        tokens = [r.randint(1, 3) for _ in range(PS * r.randint(1, 2))]
        slots = swa._grab(side, alloc, PS, len(tokens))
        assert slots is not None
        cache.insert(radix.key(side, tokens), side.idx(slots))
    if r.random() < 0.5:
        cache.evict(0, PS)  # one node loses its SWA slots (a tombstone) or is deleted
    nodes = swa._swa_nodes(cache)
    live = [n for n in nodes if not n.swa_tombstone]
    h: dict[str, Any] = {}
    if live:
        node = live[r.randrange(len(live))]
        h["node"], h["uuid"] = node, cache.inc_lock_ref(node)
    unlocked = [n for n in nodes if n.full_lock_ref == 0 and n.swa_lock_ref == 0]
    h["unlocked"] = unlocked[0] if unlocked else None
    h["new"] = swa._grab(side, alloc, PS, PS)
    _, _, other = swa._swa_tree(side, seed + 1)
    h["other_node"], h["detached"] = other["other_node"], other["detached"]
    return Subject(cache, lambda: swa._tree_state(cache, alloc), h)


def _full_swa_insert_args(side: Twin, s: Subject) -> dict[str, Any]:
    return {**swa._swa_insert_args(side, s), "inserted_len": 0}


FULL_SWA_METHODS = {
    **{
        f"UnifiedSWARadixCache.{k.split('.')[1]}": v
        for k, v in swa.SWA_TREE_METHODS.items()
        if k.startswith("SWARadixCache.")
    },
    "UnifiedSWARadixCache.insert": Method(
        _full_swa_insert_args,
        bad={
            "key": swa._swa_key_bad,
            "value": swa._swa_value_bad,
            "swa_evicted_seqlen": lambda side, s: [Bad("mid-page", 1), Bad("past-key", 2 * PS)],
        },
        # prev_prefix_len and inserted_len past the key are legal (they free / count nothing)
        unbounded=("prev_prefix_len", "inserted_len"),
    ),
    **{
        f"UnifiedSWARadixCache.{k}": swa.SWA_TREE_METHODS[k]
        for k in (
            "full_evictable_size",
            "full_protected_size",
            "swa_evictable_size",
            "swa_protected_size",
        )
    },
    "UnifiedSWARadixCache.snapshot": Method(reads=True),
}

# --------------------------------------------------------------------------- FULL + MAMBA
MAMBA_TREES = ("UnifiedMambaRadixCache", "UnifiedMambaLifecycleCache")

MAMBA_METHODS = {
    **{f"{c}.{k}": v for c in MAMBA_TREES for k, v in mamba.TREE_METHODS.items()},
    **{f"UnifiedMambaLifecycleCache.{k}": v for k, v in mamba.LIFECYCLE_METHODS.items()},
}
MAMBA_EXEMPT = {
    **{f"{c}.{k}": v for c in MAMBA_TREES for k, v in mamba.TREE_EXEMPT.items()},
    **{f"UnifiedMambaLifecycleCache.{k}": v for k, v in mamba.LIFECYCLE_EXEMPT.items()},
}

EXEMPT = {
    "UnifiedRadixCache.reset": "forgets the tree without freeing anything: legal in every state",
    "UnifiedSWARadixCache.reset": "forgets the tree without freeing anything: legal in every state",
    **MAMBA_EXEMPT,
}


def _build(side: Twin, cls: str, seed: int) -> Subject:
    if cls == "UnifiedRadixCache":
        return _full(side, seed)
    if cls == "UnifiedSWARadixCache":
        return _full_swa(side, seed)
    return mamba._tree(side, cls, seed)


FAMILY = Family(
    name="unified",
    classes=(
        "UnifiedRadixCache",
        "UnifiedSWARadixCache",
        "UnifiedMambaRadixCache",
        "UnifiedMambaLifecycleCache",
    ),
    build=_build,
    methods={**FULL_METHODS, **FULL_SWA_METHODS, **MAMBA_METHODS},
    exempt=EXEMPT,
)
