"""Plain, torch-free snapshots of pool state: the common language of both twins and the invariants.

Either twin produces these (``snapshot()`` on each component, and on the memory manager for the
whole picture); :mod:`kvpool.invariants` checks them without importing either twin. Every field is
a Python int, str, bool, tuple or None, so snapshots compare with ``==`` and print readably.

Units: ``*_size`` and ``*_len`` fields are tokens; ``free_pages``/``release_pages`` are page ids
(equal to slot ids when ``page_size == 1``); ``slots`` are token-slot ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from kvpool.records import fast_record


@dataclass(frozen=True)
class AllocatorSnapshot:
    """State of a token allocator (page size 1) or a paged allocator.

    ``num_pages`` allocatable pages have ids ``1..num_pages``; page ``p`` owns slots
    ``[p * page_size, (p + 1) * page_size)``. ``size == num_pages * page_size`` tokens.
    ``pending_free`` holds the slots buffered by an open free group (``in_free_group``).
    """

    page_size: int
    num_pages: int
    size: int
    free_pages: tuple[int, ...]
    release_pages: tuple[int, ...]
    need_sort: bool
    in_free_group: bool = False
    pending_free: tuple[int, ...] = ()

    def available_size(self) -> int:
        """Tokens free right now: ``(len(free_pages) + len(release_pages)) * page_size``."""
        return (len(self.free_pages) + len(self.release_pages)) * self.page_size


@dataclass(frozen=True)
class SWAAllocatorSnapshot:
    """State of a sliding-window (SWA) hybrid allocator: two page allocators and the mapping.

    ``full`` allocates the slots of full-attention layers (``full.size`` tokens) and ``swa`` the
    slots of sliding-window layers (``swa.size`` tokens, usually fewer). ``full_to_swa[f]`` is
    the SWA slot holding full slot ``f``'s sliding-window KV, or 0 (the sentinel: none); it has
    ``full.size + page_size + 1`` entries, the last one ``-1`` so that a ``last_loc`` of -1
    translates to -1. ``pure``: a pure-SWA model (every layer sliding-window); then ``full`` is
    ``swa`` and the mapping is the identity.
    """

    full: AllocatorSnapshot
    swa: AllocatorSnapshot
    full_to_swa: tuple[int, ...]
    pure: bool = False
    resolves_at_group_end: bool = False
    """``Rules.swa_free_resolve == "group_end"``: the full slots pending in a free group keep
    their entries until ``free_group_end``."""

    def available_size(self) -> int:
        """Tokens allocatable in both pools: the smaller of the two free counts."""
        return min(self.full.available_size(), self.swa.available_size())


@dataclass(frozen=True)
class ReqToTokenSnapshot:
    """State of the request-to-token table.

    ``free_slots`` is the free-row stack in pop order's reverse (the next row handed out is
    ``free_slots[-1]``). ``req_generation[r]`` counts how often row ``r`` was handed out
    (length ``size + 1``; entry 0 belongs to the reserved row). ``rows`` holds, for each row
    the snapshot's producer was asked about, the table contents it asked for (see the memory
    manager snapshot), keyed by row.
    """

    size: int
    max_context_len: int
    free_slots: tuple[int, ...]
    req_generation: tuple[int, ...]
    rows: tuple[tuple[int, tuple[int, ...]], ...] = ()


@dataclass(frozen=True)
class NodeSnapshot:
    """One radix-tree node. ``node_id`` is assigned from a per-cache counter at creation (a split
    creates a new node for the upper half), so both twins number nodes identically.
    ``child_keys`` are the dict keys of ``children`` in insertion order: the first token id
    (page size 1) or the first page of token ids (page size > 1), as a tuple."""

    node_id: int
    parent_id: int | None
    key: tuple[int, ...]
    extra_key: str | None
    value: tuple[int, ...]
    lock_ref: int
    child_ids: tuple[int, ...]
    child_keys: tuple[tuple[int, ...], ...]
    last_access_time: float
    hit_count: int = 0
    priority: int = 0
    swa_tombstone: bool = False
    """SWA radix cache only: the node's SWA slots were evicted (its full slots remain)."""
    swa_lock_ref: int = 0
    """SWA radix cache only: requests whose sliding window still reads this node."""
    evicted: bool = False
    """HiRadixCache only: the node has no device copy (``value`` is empty) and lives on host."""
    host_value: tuple[int, ...] | None = None
    """HiRadixCache only: the host slots of the node's backup (None: not backed up)."""
    host_ref_counter: int = 0
    """HiRadixCache only: pins on the host copy (a load, a write-back or a prefetch using it)."""
    write_pending: bool = False
    """HiRadixCache only: a write of this node to host was issued and is not acknowledged yet."""


_NODE = fast_record(NodeSnapshot)
"""Builds a :class:`NodeSnapshot` (every field by keyword: :func:`~kvpool.records.fast_record`)."""


@dataclass(frozen=True)
class TreeSnapshot:
    """A radix cache (or, with ``disabled=True``, a chunk cache with no tree and no nodes).

    ``nodes[0]`` is the root (empty key, ``lock_ref`` 1 forever)."""

    page_size: int
    disabled: bool
    eviction_policy: str
    evictable_size: int
    protected_size: int
    nodes: tuple[NodeSnapshot, ...] = ()
    swa_evictable_size: int = 0
    """SWA radix cache only: SWA tokens of unlocked, non-tombstoned nodes."""
    swa_protected_size: int = 0
    """SWA radix cache only: SWA tokens of SWA-locked, non-tombstoned nodes."""


@dataclass(frozen=True)
class ReqSnapshot:
    """A request the memory manager knows about.

    ``state`` is one of ``waiting``, ``running`` (holds a row and slots; ``is_chunked > 0`` while
    between prefill chunks), ``finished`` (released) or ``aborted``.
    ``row`` is ``req_to_token[req_pool_idx, :kv_allocated_len]`` when the request holds a row.
    ``cache_protected_len``: leading tokens whose slots belong to the tree (locked through
    ``last_node_id``); ``[cache_protected_len, ceil_align(kv_allocated_len))`` are the
    request's own. ``kv_tags[i]`` is what the KV buffers hold at ``row[i]`` for every committed
    token and ``expected_tags[i]`` what they must hold (:func:`kvpool.tags.kv_tags`)."""

    rid: str
    state: str
    req_pool_idx: int | None
    input_len: int
    output_len: int
    prefix_len: int
    kv_committed_len: int
    kv_allocated_len: int
    cache_protected_len: int
    is_chunked: int
    last_node_id: int | None
    session_id: str | None
    extra_key: str | None
    row: tuple[int, ...] = ()
    kv_tags: tuple[int, ...] = ()
    expected_tags: tuple[int, ...] = ()
    swa_evicted_seqlen: int = 0
    """Hybrid sliding-window managers only: leading tokens whose SWA slots the window released
    (``row[:swa_evicted_seqlen]`` map to no SWA slot, the rest of the row does)."""


@dataclass(frozen=True)
class SessionSnapshot:
    """A streaming session slot holding a finished turn's row, KV and tree lock between turns.

    ``row`` is ``req_to_token[req_pool_idx, :kv_allocated_len]`` while the slot holds a row."""

    session_id: str
    req_pool_idx: int | None
    kv_committed_len: int
    kv_allocated_len: int
    cache_protected_len: int
    last_node_id: int | None
    row: tuple[int, ...] = ()
    busy_with: str | None = None
    swa_evicted_seqlen: int = 0
    """Hybrid SWA managers: leading tokens of the held row whose SWA slots the turn's window
    released (tokens, a page multiple)."""


@dataclass(frozen=True)
class PoolSnapshot:
    """Everything the invariants need about one memory manager at one instant.

    ``max_total_num_tokens`` is the allocator's ``size``. ``in_free_group`` is True when the
    snapshot was taken inside a batch finish (accounting is then checked with pending frees)."""

    allocator: AllocatorSnapshot
    req_to_token: ReqToTokenSnapshot
    tree: TreeSnapshot
    reqs: tuple[ReqSnapshot, ...] = ()
    sessions: tuple[SessionSnapshot, ...] = ()
    max_total_num_tokens: int = 0
    extra: dict[str, int] = field(default_factory=dict, compare=False, hash=False)
    mamba: HybridStateSnapshot | None = None
    """Hybrid (Mamba) models only: the Mamba slots and states."""
    swa: SWAAllocatorSnapshot | None = None
    """Hybrid sliding-window managers only: both pools and the mapping (``allocator`` is then
    the full pool's snapshot)."""
    host: HostTierSnapshot | None = None
    """Managers with the host tier only (``enable_hierarchical_cache``): the hierarchical
    cache's own snapshot (its ``tree`` lists host-only nodes too; ``tree`` above is the same
    tree)."""


@dataclass(frozen=True)
class MambaAllocatorSnapshot:
    """State of a Mamba slot allocator: slots ``1..size`` (slot 0 is reserved).

    ``free_slots`` is in hand-out order (the next slot handed out is ``free_slots[0]``; freed
    slots join the tail). ``group_slots`` are the slots an open alloc group took in advance and
    has not handed out yet (they are neither free nor held by anyone)."""

    size: int
    free_slots: tuple[int, ...]
    group_slots: tuple[int, ...] = ()
    in_group: bool = False


@dataclass(frozen=True)
class MambaPoolSnapshot:
    """State tags of the Mamba buffers: ``conv[layer][slot]`` and ``temporal[layer][slot]``
    (``size + 1`` entries per layer; slot 0 is the reserved dummy). A tag is what
    :func:`kvpool.tags.mamba_state_tag` gives for the token history whose state the slot holds;
    0 is a cleared state, -1 a slot whose buffers disagree within one layer."""

    size: int
    num_layers: int
    conv: tuple[tuple[int, ...], ...]
    temporal: tuple[tuple[int, ...], ...]

    def state_tag(self, slot: int) -> int:
        """The slot's tag when every layer's conv and temporal state agree, else -1."""
        tags = {layer[slot] for layer in self.conv} | {layer[slot] for layer in self.temporal}
        return tags.pop() if len(tags) == 1 else -1


@dataclass(frozen=True)
class HybridReqToTokenSnapshot:
    """State of a ``HybridReqToTokenPool``: the table, the Mamba allocator and buffers, and the
    per-row mappings. ``mamba_mapping[row]`` is the Mamba slot of the request holding ``row``
    (stale for free rows); ``track_mapping[row]`` its speculative track-buffer slots (-1: none;
    empty tuples when track buffers are off)."""

    table: ReqToTokenSnapshot
    mamba_allocator: MambaAllocatorSnapshot
    mamba_pool: MambaPoolSnapshot
    mamba_mapping: tuple[int, ...]
    track_mapping: tuple[tuple[int, ...], ...] = ()


@dataclass(frozen=True)
class MambaNodeSnapshot:
    """One node of a Mamba radix cache: its KV (``key`` tokens at ``value`` slots), its cached
    state (``mamba_value``, None for a tombstone) and both lock counts."""

    node_id: int
    parent_id: int | None
    key: tuple[int, ...]
    extra_key: str | None
    value: tuple[int, ...]
    mamba_value: int | None
    full_lock_ref: int
    mamba_lock_ref: int
    child_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class MambaTreeSnapshot:
    """A Mamba radix cache: nodes (``nodes[0]`` the root), the evictable and protected sizes
    (tokens for ``full_*``, states for ``mamba_*``) and both LRU orders (node ids, most recently
    used first)."""

    full_evictable_size: int
    mamba_evictable_size: int
    full_protected_size: int
    mamba_protected_size: int
    nodes: tuple[MambaNodeSnapshot, ...] = ()
    full_lru: tuple[int, ...] = ()
    mamba_lru: tuple[int, ...] = ()
    unified: bool = False
    """SGLang 0.5.23's FULL+MAMBA unified tree (``Rules.mamba_tree == "unified"``): the pool
    runs the ``"unified_mamba_tree"`` invariants on it instead of the ``"mamba_tree"`` ones."""

    def as_tree_snapshot(self) -> TreeSnapshot:
        """The tree's KV side as a radix :class:`TreeSnapshot` (page size 1, LRU, ``lock_ref``
        the KV lock), so that the lifecycle's tree and pool invariants read it."""
        by_id = {n.node_id: n for n in self.nodes}
        nodes = tuple(
            _NODE(
                node_id=n.node_id,
                parent_id=n.parent_id,
                key=n.key,
                extra_key=n.extra_key,
                value=n.value,
                lock_ref=n.full_lock_ref,
                child_ids=n.child_ids,
                child_keys=tuple([by_id[c].key[:1] if c in by_id else () for c in n.child_ids]),
                last_access_time=0.0,
                hit_count=0,
                priority=0,
                swa_tombstone=False,
                swa_lock_ref=0,
                evicted=False,
                host_value=None,
                host_ref_counter=0,
                write_pending=False,
            )
            for n in self.nodes
        )
        return TreeSnapshot(1, False, "lru", self.full_evictable_size, self.full_protected_size,
                            nodes)  # fmt: skip


@dataclass(frozen=True)
class MambaReqSnapshot:
    """A live request's Mamba state as the lifecycle sees it: its row (None: waiting), running
    slot, track-buffer slots and the state tag its slot must hold (None: not known)."""

    rid: str
    row: int | None
    slot: int | None
    track: tuple[int, ...] = ()
    expected_tag: int | None = None


@dataclass(frozen=True)
class HybridStateSnapshot:
    """The Mamba side of a hybrid memory manager: the hybrid pool, every live request's Mamba
    slots and, with the radix cache on, the Mamba radix cache."""

    pool: HybridReqToTokenSnapshot
    reqs: tuple[MambaReqSnapshot, ...] = ()
    tree: MambaTreeSnapshot | None = None
    """The Mamba radix cache when the lifecycle runs one (None: the radix cache is off); the
    states it caches are the prefix cache's slots."""


@dataclass(frozen=True)
class HostPoolSnapshot:
    """A host KV pool (``HostKVCache``): ``size`` slots ``0..size-1`` (none reserved), handed out
    in pages of ``page_size`` tokens. ``free_slots`` in hand-out order, then ``release_slots``:
    the freed chunks not merged yet (flattened, in order). ``tags[h]`` is host slot ``h``'s
    content tag (0: never written)."""

    size: int
    page_size: int
    free_slots: tuple[int, ...]
    release_slots: tuple[int, ...] = ()
    tags: tuple[int, ...] = ()

    def available_size(self) -> int:
        """Free host slots (tokens)."""
        return len(self.free_slots) + len(self.release_slots)


@dataclass(frozen=True)
class HostTransferSnapshot:
    """A host transfer issued and not acknowledged yet: a write (device -> host) or a load
    (host -> device) of ``host_indices`` <-> ``device_indices`` (same length, slot for slot),
    for the nodes named by ``node_ids`` (the ids the acknowledgement will carry)."""

    kind: str
    node_ids: tuple[int, ...]
    host_indices: tuple[int, ...]
    device_indices: tuple[int, ...]


@dataclass(frozen=True)
class PrefetchSnapshot:
    """A prefetch from storage into host memory still owned by the cache: the request, the node
    it hangs below (whose host copy it pins), the tokens asked for, the host slots reserved
    (empty until the storage hit is known) and the tokens fetched so far."""

    rid: str
    last_host_node_id: int
    num_tokens: int
    host_indices: tuple[int, ...] = ()
    completed_tokens: int = 0
    terminated: bool = False


@dataclass(frozen=True)
class HostTierSnapshot:
    """A hierarchical cache (``HiRadixCache``): the device allocator and the tree (nodes carry
    the host fields), the host pool, the transfers in flight, the prefetches, and the host slots
    queued for release (``release_queue``: freed by the next drain, in order). Slots a finished
    prefetch transfer left to its worker and the worker has not released yet are in
    ``worker_held``. ``device_tags[s]`` is device slot ``s``'s content tag."""

    write_policy: str
    device: AllocatorSnapshot
    tree: TreeSnapshot
    host: HostPoolSnapshot
    transfers: tuple[HostTransferSnapshot, ...] = ()
    prefetches: tuple[PrefetchSnapshot, ...] = ()
    release_queue: tuple[int, ...] = ()
    worker_held: tuple[int, ...] = ()
    device_tags: tuple[int, ...] = ()
    device_held: tuple[int, ...] = ()
    """Device pages held outside the tree (the lifecycle's requests and sessions: their private
    ranges); a component run holds none. Not leaked, for ``INV-HOST-DEVICE-ACCOUNTING``."""
    bigram_keys: bool = False
    """Whether the tree's node keys are EAGLE bigram codes (``PoolConfig.is_eagle``: element
    ``i`` is ``t[i] * 2**31 + t[i + 1]``, so token ``i`` is ``code >> 31``), which the tag
    checks decode."""


def _same_fields(self: object, other: object) -> object:
    """``__eq__`` of a record whose every field is compared: the same class and equal instance
    dicts (which hold exactly the fields)."""
    if other.__class__ is self.__class__:
        return self.__dict__ == other.__dict__
    return NotImplemented


def _compare_by_fields() -> None:
    """Every record of this module whose fields all take part in ``==`` compares through
    :func:`_same_fields`: the answer of the generated ``__eq__`` (same class, every field equal)
    from one C-level dict comparison
    instead of two tuples of fields built in Python (the harness compares whole snapshots at
    every step). The generated ``__hash__`` stays. :class:`PoolSnapshot` keeps its own
    (``extra`` is not compared)."""
    for record in list(globals().values()):
        if isinstance(record, type) and record.__module__ == __name__:
            table = getattr(record, "__dataclass_fields__", None)
            if table is not None and all(f.compare for f in fields(record)):
                record.__eq__ = _same_fields  # type: ignore[assignment, method-assign]


_compare_by_fields()
