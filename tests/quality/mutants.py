"""The seeded bugs of the quality suite (specs/sglang_behaviour.md, section 10): :data:`MUTANTS`.

Each entry is a :class:`~kvpool.testing.quality.Mutant`: a name, the bug kind, the detectors
expected to catch it, its patch (from :mod:`tests.quality.mutants_allocator`,
:mod:`tests.quality.mutants_lifecycle` or :mod:`tests.quality.mutants_tree`) and the focus of
its runs. :func:`kvpool.testing.quality.hunt` and :func:`kvpool.testing.quality.format_table`
run them.
"""

from __future__ import annotations

from kvpool.testing.quality import Mutant
from tests.quality import mutants_allocator as alloc
from tests.quality import mutants_lifecycle as life
from tests.quality import mutants_tree as tree

_RADIX = {"disable_radix_cache": False}
_ROOMY = {"disable_radix_cache": False, "size": 48, "req_pool_size": 6}
_PREFILL = ("new_req", "twin_req", "extend", "extend", "finish")
_SPLITS = ("new_req", "match_prefix", "extend", "extend", "decode", "finish")
_SPEC = ("new_req", "extend", "spec_step", "spec_step", "finish", "abort", "retract")
_FINISH = ("new_req", "extend", "decode", "spec_step", "finish", "finish")
_SESSIONS = ("session_turn", "session_turn", "extend", "extend", "finish")
_STOPS = ("new_req", "extend", "extend", "spec_step", "spec_step", "finish", "finish")
_SESSION_STOPS = ("session_turn", "session_turn", "extend", "spec_step", "spec_step", "finish")
_SESSION_SPEC = ("session_turn", "session_turn", "extend", "spec_step", "finish")
_HYBRID = {
    "disable_radix_cache": False,
    "mamba_slots": 6,
    "size": 48,
    "req_pool_size": 4,
    "eviction_policy": "lru",
}

MUTANTS: tuple[Mutant, ...] = (
    Mutant("paged-free-no-dedup", "double free through pages named twice in one free",
           ("INV-NO-DOUBLE-FREE",), alloc.paged_free_no_dedup, (2, 4)),
    Mutant("group-frees-separately", "free group not performed as one free",
           ("lockstep-diff",), alloc.group_frees_separately, (2, 4), {}, _FINISH),
    Mutant("finish-frees-twice", "a finish path that frees twice",
           ("INV-NO-DOUBLE-FREE",), life.finish_frees_twice, (1,)),
    Mutant("leak-partial-tail", "leak of a partial page",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), life.leak_partial_tail, (2, 4), _RADIX,
           _FINISH),
    Mutant("leak-spec-overalloc", "leak of speculative slots",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), life.leak_spec_overalloc, (1, 2), {},
           _SPEC),
    Mutant("chunked-row-reused", "a row handed to another request while a chunked one uses it",
           ("INV-ROW-OWNERS", "INV-ROW-ACCOUNTING", "INV-PAGE-CONTIGUITY"), life.chunked_row_reused,
           (1, 2, 4)),
    Mutant("lock-wrong-node", "lock counts walked from the wrong node",
           ("INV-LOCKS",), tree.lock_wrong_node, (1, 2), _ROOMY, _SPLITS),
    Mutant("lock-lost-on-split", "lock count lost on a node split",
           ("INV-LOCKS",), tree.lock_lost_on_split, (1, 2), _ROOMY, _SPLITS),
    Mutant("sizes-drift", "evictable/protected sizes updated by different amounts",
           ("INV-LOCKS", "INV-POOL-ACCOUNTING"), tree.sizes_drift, (1, 2), _RADIX),
    Mutant("row-not-rewritten", "duplicates freed but the row not rewritten (use after free)",
           ("INV-ROW-SLOTS", "INV-ONE-OWNER", "INV-KV-INTEGRITY"), life.row_not_rewritten,
           (1,), _ROOMY, _PREFILL),
    Mutant("slot0-allocatable", "index 0 made allocatable",
           ("INV-RESERVED-ZERO",), alloc.slot0_allocatable, (1, 2, 4)),
    Mutant("failed-alloc-consumes", "a failed allocation that consumed pages",
           ("INV-POOL-ACCOUNTING", "INV-TOKEN-ACCOUNTING"), alloc.failed_alloc_consumes, (1, 2, 4)),
    Mutant("extend-partial-write", "extend kernel writes part of its output, takes all pages",
           ("INV-RESERVED-ZERO", "INV-ROW-SLOTS", "lockstep-diff"), alloc.extend_partial_write,
           (2, 4)),
    Mutant("session-extra-lock", "session restore takes a lock nobody releases",
           ("INV-LOCKS", "INV-IDLE"), life.session_extra_lock, (1, 2), _ROOMY, _SESSIONS),
    Mutant("free-order-swapped", "LIFO/FIFO free order swapped",
           ("lockstep-diff",), alloc.order_swapped, (1, 2, 4)),
    Mutant("evict-locked-node", "eviction evicts a locked node",
           ("INV-LOCKS", "INV-TREE-SHAPE", "INV-ROW-SLOTS", "INV-ONE-OWNER"), tree.evict_locked,
           (1, 2), _RADIX),
    Mutant("generation-not-bumped", "row generation not bumped on hand-out",
           ("INV-GENERATION-MONOTONIC", "lockstep-diff"), life.generation_not_bumped, (1,)),
    Mutant("decode-no-new-page", "decode does not open a new page at a page boundary",
           ("INV-ROW-SLOTS", "INV-ONE-OWNER", "INV-POOL-ACCOUNTING"), alloc.decode_no_new_page,
           (2, 4)),
    Mutant("release-keeps-overshoot", "a stop inside a speculative run ignored by the release",
           ("lockstep-diff",), life.release_keeps_overshoot, (1, 4), _RADIX, _STOPS, stops=True),
    Mutant("handover-keeps-overshoot", "a session turn's overshoot handed to its session",
           ("lockstep-diff",), life.handover_keeps_overshoot, (1, 4), {}, _SESSION_STOPS,
           stops=True),
    Mutant("handover-keeps-reserve", "a session keeps its turn's over-allocation until the next",
           ("INV-SESSION-TRIMMED", "lockstep-diff"), life.handover_keeps_reserve, (1, 4), {},
           _SESSION_SPEC),
    Mutant("hybrid-stop-caches-state", "a hybrid request's state cached past its stop",
           ("INV-MAMBA-CHECKPOINT", "lockstep-diff"), life.hybrid_stop_caches_state, (1,),
           _HYBRID, _STOPS, stops=True),
)  # fmt: skip
"""Every seeded bug of the quality suite."""
