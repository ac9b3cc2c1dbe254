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

from kvpool.constants import RESERVED_INDEX
from kvpool.errors import (
    ConfigError,
    DoubleFreeError,
    IndexOutOfRangeError,
    InvalidArgumentError,
    ReservedIndexError,
)
from kvpool.host_checks import as_int, int_list
from kvpool.protocols.requests import MambaReqLike
from kvpool.reference.mamba.allocator import MambaSlotAllocator
from kvpool.reference.mamba.pool import MambaPool
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.rules import Rules
from kvpool.snapshot import HybridReqToTokenSnapshot

NO_TRACK_SLOT = -1
"""A track-buffer entry that holds no slot."""


MAMBA_FIELDS = ("mamba_pool_idx", "mamba_ping_pong_track_buffer")
"""The fields a Mamba slot's release reads of a request."""
REQ_FIELDS = ("req_pool_idx", "is_chunked", "kv_committed_len", *MAMBA_FIELDS)
"""The fields an allocation reads of a request."""
_MISSING = object()


def check_mamba_req(name: str, req: object, fields: tuple[str, ...] = REQ_FIELDS) -> MambaReqLike:
    """``req`` if it reads as a hybrid request (pure, both twins): it has ``fields`` (of
    :class:`~kvpool.protocols.requests.MambaReqLike`), its ``mamba_pool_idx`` and
    ``req_pool_idx`` are None or ints (not bools, not floats), its track buffer None or a list
    of ints. InvalidArgumentError naming ``name`` otherwise (nothing read changes anything)."""
    for field in fields:
        if getattr(req, field, _MISSING) is _MISSING:
            raise InvalidArgumentError(f"{name} must be a request (no {field}), got {req!r}")
    for field in ("req_pool_idx", "mamba_pool_idx"):
        value = getattr(req, field, None)
        if value is not None:
            as_int(f"{name}.{field}", value)
    track = getattr(req, "mamba_ping_pong_track_buffer", None)
    if track is not None:
        if not isinstance(track, list):
            raise InvalidArgumentError(
                f"{name}.mamba_ping_pong_track_buffer must be a list of slots, got {track!r}"
            )
        for slot in track:
            as_int(f"{name}.mamba_ping_pong_track_buffer", slot)
    return req  # type: ignore[return-value]


def check_mamba_reqs(name: str, reqs: object) -> list[MambaReqLike]:
    """``reqs`` as a list after :func:`check_mamba_req` of each (a sequence, not a string);
    InvalidArgumentError otherwise."""
    if isinstance(reqs, str | bytes) or not isinstance(reqs, Sequence):
        raise InvalidArgumentError(f"{name} must be a sequence of requests, got {reqs!r}")
    return [check_mamba_req(f"{name}[{i}]", r) for i, r in enumerate(reqs)]


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
        plus ``track_buffers`` per request without track buffers (a count: the batch's rows and
        kept slots are :meth:`check_alloc`'s to check). InvalidArgumentError when ``reqs`` is
        not a sequence of requests (:func:`check_mamba_reqs`)."""
        reqs = check_mamba_reqs("reqs", reqs)
        need = sum(1 for r in reqs if r.mamba_pool_idx is None)
        if self.track_buffers:
            need += self.track_buffers * sum(
                1 for r in reqs if r.mamba_ping_pong_track_buffer is None
            )
        return need

    def check_alloc(self, reqs: Sequence[MambaReqLike]) -> int:  # type: ignore[override]
        """:meth:`ReqToTokenPool.check_alloc` after checking that each request reads as a hybrid
        request (:func:`check_mamba_req`) and that the Mamba slots and track buffers it keeps
        are held, in ``1..mamba_size`` and kept by one request only (a track buffer has
        ``track_buffers`` entries); returns the fresh rows needed. Nothing changes."""
        checked = check_mamba_reqs("reqs", reqs)
        fresh = super().check_alloc(checked)
        self._check_kept_slots(checked)
        return fresh

    def _check_slot(self, what: str, slot: int) -> None:
        """A Mamba slot named by a request: in ``1..size`` (slot 0 ReservedIndexError)."""
        if slot == RESERVED_INDEX:
            raise ReservedIndexError(f"{what}: Mamba slot {RESERVED_INDEX} is reserved")
        if not RESERVED_INDEX < slot <= self.mamba_allocator.size:
            raise IndexOutOfRangeError(
                f"{what}: Mamba slot {slot} outside 1..{self.mamba_allocator.size}"
            )

    def _check_kept_slots(self, reqs: Sequence[MambaReqLike]) -> None:
        """A request arriving with a Mamba slot (a chunked request, or one given a slot by a
        prefix match) keeps it; the slot must be in range, held (not free, not prefetched by an
        open group), and named by one request only."""
        kept: set[int] = set()
        group = set(self.mamba_allocator._group or ())
        for i, req in enumerate(reqs):
            held = [] if req.mamba_pool_idx is None else [req.mamba_pool_idx]
            track = req.mamba_ping_pong_track_buffer
            if track is not None and len(track) != self.track_buffers:
                raise InvalidArgumentError(
                    f"request {i} keeps {len(track)} track buffers, the pool has "
                    f"{self.track_buffers}"
                )
            held += [s for s in track or () if s != NO_TRACK_SLOT]
            for slot in held:
                self._check_slot(f"request {i}", slot)
                if slot in self.mamba_allocator._free_set or slot in group or slot in kept:
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
        """The Mamba slot mapped to each row (stale for a free row); rows in ``1..size``
        (InvalidArgumentError for a non-integer, ReservedIndexError / IndexOutOfRangeError)."""
        checked = [self._check_row(r) for r in int_list("rows", rows)]
        return [self.req_index_to_mamba_index_mapping[r] for r in checked]

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None:
        """Free the request's Mamba slot and its track buffers, except the track entry
        ``mamba_ping_pong_track_buffer_to_keep`` (0 or 1: its slot was donated to the prefix
        cache and now belongs to the tree). Clears the request's Mamba fields. DoubleFreeError
        when the request holds no slot (or, from the allocator, a free one: nothing changes);
        InvalidArgumentError for a bad keep index (an int in ``0..track_buffers-1``, not a
        bool) or for something that is not a request (:func:`check_mamba_req`)."""
        check_mamba_req("req", req, MAMBA_FIELDS)
        if req.mamba_pool_idx is None:
            raise DoubleFreeError("request holds no Mamba slot (mamba_pool_idx is None)")
        keep = mamba_ping_pong_track_buffer_to_keep
        if keep is not None:
            keep = as_int("mamba_ping_pong_track_buffer_to_keep", keep)
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


__all__ = [
    "MAMBA_FIELDS",
    "NO_TRACK_SLOT",
    "REQ_FIELDS",
    "HybridReqToTokenPool",
    "check_mamba_req",
    "check_mamba_reqs",
    "mamba_calls",
    "mamba_calls_fit",
]
