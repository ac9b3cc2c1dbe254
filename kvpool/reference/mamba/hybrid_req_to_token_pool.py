"""``HybridReqToTokenPool``: the request table of a hybrid model, with a Mamba slot per request.

Units: rows as in :class:`~kvpool.reference.pools.req_to_token_pool.ReqToTokenPool`; Mamba slots
``1..mamba_size`` (slot 0 reserved). Every request holding a row also holds one Mamba slot (its
running recurrent state) and, with ``track_buffers`` > 0 (speculative decoding), that many more
slots of track buffers (SGLang's ping-pong buffer, where the state at the last tracked length is
kept for the prefix cache). ``req_index_to_mamba_index_mapping[row]`` is the slot of the request
holding ``row``; ``req_index_to_mamba_ping_pong_track_buffer_mapping[row]`` its track slots.

Differences from SGLang, on purpose: :meth:`alloc` checks the Mamba slots it needs before it
takes any row and returns None (nothing changed) when they are short, where SGLang asserts after
taking the rows; misuse (a kept slot that is free, a double :meth:`free_mamba_cache`) raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvpool.errors import ConfigError, DoubleFreeError, InvalidArgumentError
from kvpool.protocols.requests import MambaReqLike
from kvpool.reference.mamba.allocator import MambaSlotAllocator
from kvpool.reference.mamba.pool import MambaPool
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.rules import Rules
from kvpool.snapshot import HybridReqToTokenSnapshot

NO_TRACK_SLOT = -1
"""A track-buffer entry that holds no slot."""


def mamba_calls(reqs: Sequence[MambaReqLike], track_buffers: int) -> list[int]:
    """The sizes of the allocator calls SGLang's ``alloc`` makes for ``reqs``, in order: one
    slot for each request without a running slot, then ``track_buffers`` for its track buffers
    when it has none."""
    calls: list[int] = []
    for req in reqs:
        if req.mamba_pool_idx is None:
            calls.append(1)
        if track_buffers and req.mamba_ping_pong_track_buffer is None:
            calls.append(track_buffers)
    return calls


def mamba_calls_fit(calls: Sequence[int], group_left: int, available: int) -> bool:
    """Whether allocator calls of sizes ``calls`` all succeed with ``group_left`` slots
    prefetched by an open alloc group (each single-slot call takes the next of them) and
    ``available`` free slots (every other call takes from the free list)."""
    for n in calls:
        if n == 1 and group_left:
            group_left -= 1
        else:
            available -= n
            if available < 0:
                return False
    return True


class HybridReqToTokenPool(ReqToTokenPool):
    """The table plus ``mamba_pool`` (buffers), ``mamba_allocator`` (slots) and the mappings."""

    def __init__(
        self,
        size: int,
        max_context_len: int,
        mamba_size: int,
        num_mamba_layers: int = 1,
        track_buffers: int = 0,
        *,
        rules: Rules | None = None,
    ) -> None:
        if track_buffers not in (0, 1, 2):
            raise ConfigError(f"track_buffers must be 0, 1 or 2, got {track_buffers!r}")
        super().__init__(size, max_context_len, rules=rules)
        self.mamba_pool = MambaPool(mamba_size, num_mamba_layers)
        self.mamba_allocator = MambaSlotAllocator(mamba_size)
        self.track_buffers = track_buffers
        self.req_index_to_mamba_index_mapping: list[int] = [0] * (size + 1)
        self.req_index_to_mamba_ping_pong_track_buffer_mapping: list[list[int]] = [
            [0] * track_buffers for _ in range(size + 1)
        ]

    def mamba_slots_needed(self, reqs: Sequence[MambaReqLike]) -> int:
        """Mamba slots :meth:`alloc` would take for ``reqs``: one per request without a slot,
        plus ``track_buffers`` per request without track buffers."""
        need = sum(1 for r in reqs if r.mamba_pool_idx is None)
        if self.track_buffers:
            need += self.track_buffers * sum(
                1 for r in reqs if r.mamba_ping_pong_track_buffer is None
            )
        return need

    def _check_kept_slots(self, reqs: Sequence[MambaReqLike]) -> None:
        """A request arriving with a Mamba slot (a chunked request, or one given a slot by a
        prefix match) keeps it; the slot must be held, and named by one request only."""
        kept: set[int] = set()
        for i, req in enumerate(reqs):
            held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
            held += [s for s in req.mamba_ping_pong_track_buffer or () if s != NO_TRACK_SLOT]
            for slot in held:
                if slot in self.mamba_allocator._free_set or slot in kept:
                    raise InvalidArgumentError(
                        f"request {i} keeps Mamba slot {slot}, free or shared"
                    )
                kept.add(slot)

    def alloc(self, reqs: Sequence[MambaReqLike]) -> list[int] | None:  # type: ignore[override]
        """Rows as :meth:`ReqToTokenPool.alloc`, then, in batch order, a Mamba slot for each
        request without one (``mamba_needs_clear`` set: its stale state must be zeroed before
        the next forward) and track buffers for each request without them. ``None`` and no
        change when either rows or Mamba slots are short."""
        fresh_rows = self.check_alloc(reqs)
        self._check_kept_slots(reqs)
        if fresh_rows > len(self.free_slots):
            return None
        calls = mamba_calls(reqs, self.track_buffers)
        group = self.mamba_allocator._group or []
        if not mamba_calls_fit(calls, len(group), self.mamba_allocator.available_size()):
            return None
        rows = super().alloc(reqs)
        assert rows is not None  # checked above
        # SGLang's calls, in order: a missing running slot first, then missing track buffers,
        # request by request. Outside an alloc group one call for the whole batch hands out the
        # same slots (the head of the free list); inside one, single-slot calls take the
        # group's prefetched slots.
        slots: list[int] = []
        for n in calls if group else [sum(calls)]:
            got = self.mamba_allocator.alloc(n)
            assert got is not None  # counted above
            slots += got
        at = 0
        for req, row in zip(reqs, rows, strict=True):
            if req.mamba_pool_idx is None:
                req.mamba_pool_idx = slots[at]
                req.mamba_needs_clear = True
                at += 1
            if self.track_buffers and req.mamba_ping_pong_track_buffer is None:
                req.mamba_ping_pong_track_buffer = slots[at : at + self.track_buffers]
                req.mamba_next_track_idx = 0
                at += self.track_buffers
            self.req_index_to_mamba_index_mapping[row] = req.mamba_pool_idx
            if self.track_buffers:
                assert req.mamba_ping_pong_track_buffer is not None
                self.req_index_to_mamba_ping_pong_track_buffer_mapping[row] = list(
                    req.mamba_ping_pong_track_buffer
                )
        return rows

    def get_mamba_indices(self, rows: Sequence[int]) -> list[int]:
        """The Mamba slot mapped to each row (stale for a free row)."""
        return [self.req_index_to_mamba_index_mapping[self._check_row(r)] for r in rows]

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free the request's Mamba slot and its track buffers, except the track entry
        ``mamba_ping_pong_track_buffer_to_keep`` (0 or 1: its slot was donated to the prefix
        cache and now belongs to the tree). Clears the request's Mamba fields. DoubleFreeError
        when the request holds no slot; InvalidArgumentError for a bad keep index."""
        if req.mamba_pool_idx is None:
            raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep is not None and (not self.track_buffers or keep not in range(self.track_buffers)):
            raise InvalidArgumentError(f"track buffer to keep {keep!r} with {self.track_buffers}")
        track = list(req.mamba_ping_pong_track_buffer or ())
        freed = [req.mamba_pool_idx]
        freed += [s for i, s in enumerate(track) if i != keep]
        self.mamba_allocator.free(freed)
        req.mamba_pool_idx = None
        req.mamba_needs_clear = False
        req.mamba_cow_src_index = None
        if self.track_buffers:
            req.mamba_ping_pong_track_buffer = None
            req.mamba_next_track_idx = None

    def clear(self) -> None:
        """Every row and Mamba slot free; mappings zeroed (state tags kept)."""
        super().clear()
        if hasattr(self, "mamba_allocator"):  # the base constructor clears before we exist
            self.mamba_allocator.clear()
            self.req_index_to_mamba_index_mapping = [0] * (self.size + 1)
            self.req_index_to_mamba_ping_pong_track_buffer_mapping = [
                [0] * self.track_buffers for _ in range(self.size + 1)
            ]

    def hybrid_snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> HybridReqToTokenSnapshot:
        """Plain copy of the table (``rows`` as in :meth:`snapshot`), the allocator, the state
        tags and the mappings."""
        return HybridReqToTokenSnapshot(
            table=self.snapshot(rows),
            mamba_allocator=self.mamba_allocator.snapshot(),
            mamba_pool=self.mamba_pool.snapshot(),
            mamba_mapping=tuple(self.req_index_to_mamba_index_mapping),
            track_mapping=tuple(
                tuple(t) for t in self.req_index_to_mamba_ping_pong_track_buffer_mapping
            ),
        )


__all__ = ["NO_TRACK_SLOT", "HybridReqToTokenPool", "mamba_calls", "mamba_calls_fit"]
