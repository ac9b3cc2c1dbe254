"""Lifecycle promises checked across steps (scope ``"pool"``): what the manager promised a
request or session and must keep. Units: tokens.

- ``INV-SPEC-ALIGNED``: a paged request whose allocation runs ahead of its committed KV (the
  speculative over-allocation) holds a page-aligned allocation, so no partial page is left
  half-owned when it is released.
- ``INV-CAPACITY-HONOURED``: when the manager's capacity check passed, the allocator served the
  allocation (``snapshot.extra["capacity_refusals"]`` counts the refusals after a passed check).
- ``INV-SESSION-HELD``: a session's held length (committed tokens) never shrinks between two
  snapshots in which it holds KV (only closing it, or handing it to its next turn, lets it go).
- ``INV-SESSION-TRIMMED``: a session holding KV holds exactly its committed tokens
  (``kv_allocated_len == kv_committed_len``): the hand-over freed the turn's over-allocation, as
  both SGLang releases' streaming sessions do (``_trim_overshoot``), so nothing a finished turn
  reserved stays out of the pool until the next turn.
"""

from __future__ import annotations

from kvpool.errors import InvariantViolation
from kvpool.invariants.registry import invariant
from kvpool.snapshot import PoolSnapshot


@invariant(
    "INV-SPEC-ALIGNED",
    "a paged request allocated past its committed KV holds a page-aligned allocation",
    scope="pool",
)
def check_spec_aligned(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    ps = snap.allocator.page_size
    bad = [
        i
        for i, r in enumerate(snap.reqs)
        if r.req_pool_idx is not None
        and r.kv_allocated_len > r.kv_committed_len
        and r.kv_allocated_len % ps
    ]
    if bad:
        names = [snap.reqs[i].rid for i in bad]
        raise InvariantViolation(
            "INV-SPEC-ALIGNED", f"over-allocated requests {names} end mid-page", bad
        )


@invariant(
    "INV-CAPACITY-HONOURED",
    "an allocation the manager's capacity check admitted was served by the allocator",
    scope="pool",
)
def check_capacity_honoured(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    refusals = snap.extra.get("capacity_refusals", 0)
    before = previous.extra.get("capacity_refusals", 0) if previous is not None else 0
    if refusals > before:
        raise InvariantViolation(
            "INV-CAPACITY-HONOURED",
            f"the allocator refused {refusals - before} allocation(s) after the capacity check "
            "passed (available + evictable covered them)",
        )


@invariant(
    "INV-SESSION-HELD",
    "a session holding KV in two consecutive snapshots did not lose any of it",
    scope="pool",
)
def check_session_held(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    if previous is None or not previous.sessions or not snap.sessions:
        return  # (no session in one of them: nothing held in both)
    before = {s.session_id: s for s in previous.sessions if s.req_pool_idx is not None}
    bad = []
    for i, s in enumerate(snap.sessions):
        old = before.get(s.session_id)
        if old is None or s.req_pool_idx is None:
            continue
        # lengths only: a turn may swap duplicate slots for the tree's copies of the same tokens
        if s.kv_committed_len < old.kv_committed_len:
            bad.append(i)
    if bad:
        names = [snap.sessions[i].session_id for i in bad]
        raise InvariantViolation(
            "INV-SESSION-HELD", f"sessions {names} lost held KV between steps", bad
        )


@invariant(
    "INV-SESSION-TRIMMED",
    "a session holding KV holds exactly its committed tokens (no over-allocation)",
    scope="pool",
)
def check_session_trimmed(snap: PoolSnapshot, previous: PoolSnapshot | None) -> None:
    bad = [
        i
        for i, s in enumerate(snap.sessions)
        if s.req_pool_idx is not None and s.kv_allocated_len != s.kv_committed_len
    ]
    if bad:
        held = [
            (snap.sessions[i].session_id, snap.sessions[i].kv_committed_len,
             snap.sessions[i].kv_allocated_len)
            for i in bad
        ]  # fmt: skip
        raise InvariantViolation(
            "INV-SESSION-TRIMMED",
            f"sessions (id, committed, allocated) {held} hold more than their committed tokens",
            bad,
        )


__all__ = [
    "check_capacity_honoured",
    "check_session_held",
    "check_session_trimmed",
    "check_spec_aligned",
]
