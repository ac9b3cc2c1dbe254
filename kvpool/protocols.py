"""The contract of every component, as ``typing.Protocol`` classes both twins satisfy.

``IdxT`` is the index-container type of a twin: ``list[int]`` in :mod:`kvpool.reference`,
``torch.Tensor`` (int64 for slots, int32 for table rows) in :mod:`kvpool.optimized`. Results are
compared across twins after converting with ``list(x)`` / ``x.tolist()``; they must be equal
element by element, in order.

Shared rules (both twins, every method):
- Misuse raises a subclass of :class:`kvpool.errors.KVPoolError` and changes nothing.
- A pool allocation that does not fit returns ``None`` and changes nothing.
- A lifecycle helper (memory manager) that cannot get memory even after eviction raises
  :class:`kvpool.errors.OutOfMemoryError`, again leaving every pool, lock and size unchanged
  (a ``match_prefix`` split or access-time refresh done on the way may remain).
- Index 0 (:data:`kvpool.constants.RESERVED_INDEX`) is never handed out: not row 0, not slot 0,
  not page 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable

from kvpool.snapshot import (
    AllocatorSnapshot,
    HostPoolSnapshot,
    HostTierSnapshot,
    HybridReqToTokenSnapshot,
    MambaAllocatorSnapshot,
    MambaPoolSnapshot,
    MambaTreeSnapshot,
    PoolSnapshot,
    ReqToTokenSnapshot,
    SWAAllocatorSnapshot,
    TreeSnapshot,
)

IdxT = TypeVar("IdxT")
# Variance-specific twins of IdxT for protocols that only take (or only return) index containers.
IdxT_contra = TypeVar("IdxT_contra", contravariant=True)
IdxT_co = TypeVar("IdxT_co", covariant=True)


@runtime_checkable
class ReqLike(Protocol):
    """What :meth:`ReqToTokenPoolProtocol.alloc` reads of a request.

    A request may keep its row (``req_pool_idx`` already set) only when ``is_chunked > 0`` (between
    prefill chunks) or ``kv_committed_len > 0`` (committed KV, e.g. a session continuation)."""

    req_pool_idx: int | None
    is_chunked: int
    kv_committed_len: int


class MambaReqLike(ReqLike, Protocol):
    """What ``HybridReqToTokenPool`` reads and writes of a request besides :class:`ReqLike`:
    its Mamba slot, whether that slot must be cleared before the next forward, the slot of a
    cached state to copy into it first (copy-on-write), and its speculative track buffers."""

    mamba_pool_idx: int | None
    mamba_needs_clear: bool
    mamba_cow_src_index: int | None
    mamba_ping_pong_track_buffer: list[int] | None
    mamba_next_track_idx: int | None


class ReqToTokenPoolProtocol(Protocol[IdxT]):
    """Request-to-token table: ``req_to_token[row, col]`` is the slot of token ``col`` of the
    request in ``row``. Rows ``1..size`` are allocatable; row 0 is reserved.

    Free rows form a stack: ``alloc`` pops from the tail, ``free`` pushes on the tail (LIFO: a freed
    row is reused first). A fresh pool's stack is ``[size, ..., 2, 1]``, so rows come out 1, 2, 3...
    ``req_generation[row]`` is bumped each time the row is handed out and never goes backwards."""

    size: int
    max_context_len: int

    def alloc(self, reqs: Sequence[ReqLike]) -> list[int] | None:
        """Give every request without a row a fresh row, in batch order; keep the rows of the
        (legally) reusing ones. Sets ``req.req_pool_idx``. Returns every request's row in batch
        order, or ``None`` (nothing changed) when fewer rows are free than needed.
        Raises :class:`~kvpool.errors.RowReuseError` for an illegal reuse."""
        ...

    def check_alloc(self, reqs: Sequence[ReqLike]) -> int:
        """Validate a batch for :meth:`alloc` without changing anything (the reuse rule
        above); returns the number of fresh rows it needs. The manager calls it before its
        first change."""
        ...

    def free(self, req: ReqLike) -> None:
        """Return the request's row and clear ``req.req_pool_idx``; table contents untouched.
        Raises :class:`~kvpool.errors.DoubleFreeError` if the row is already free."""
        ...

    def write(self, index: tuple[int, slice], values: IdxT) -> None:
        """``req_to_token[row, start:stop] = values``. ``index`` is ``(row, slice(start, stop))``
        with explicit bounds; ``stop <= max_context_len`` else
        :class:`~kvpool.errors.ContextOverflowError`; row 0 or a row out of range is refused."""
        ...

    def read(self, row: int, start: int, stop: int) -> IdxT:
        """``req_to_token[row, start:stop]`` (a copy)."""
        ...

    def available_size(self) -> int:
        """Number of free rows."""
        ...

    def clear(self) -> None:
        """Free every row. Generations are kept (they never go backwards)."""
        ...

    def snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> ReqToTokenSnapshot:
        """Plain snapshot; ``rows`` lists ``(row, length)`` pairs whose contents to include."""
        ...


class TokenAllocatorProtocol(Protocol[IdxT]):
    """Slot allocator. ``size`` tokens in ``size // page_size`` pages with ids ``1..num_pages``.

    Page size 1 (``TokenToKVPoolAllocator``): ``alloc`` takes from the head of ``free_pages`` and
    ``free`` appends (FIFO). Page size > 1 (``PagedTokenToKVPoolAllocator``): ``free`` prepends the
    sorted unique pages of the freed slots (LIFO by page). With ``need_sort`` frees go to
    ``release_pages`` and are merged (sorted) into ``free_pages`` when an allocation finds it short.
    """

    size: int
    page_size: int
    need_sort: bool

    def available_size(self) -> int:
        """Free tokens: ``(len(free_pages) + len(release_pages)) * page_size``."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """``need_size`` slots (whole pages when paged: ``need_size % page_size == 0`` else
        :class:`~kvpool.errors.AlignmentError`), or ``None`` if they do not fit."""
        ...

    def free(self, free_index: IdxT) -> None:
        """Return slots. Paged: freeing any slot of a page frees the whole page; duplicates within
        one call (or one free group) name the same page once. Page size 1: duplicates are a double
        free. Freeing slot/page 0, an out-of-range slot or one not allocated raises before any
        change. Inside a free group the slots are buffered until :meth:`free_group_end`."""
        ...

    def free_group_begin(self) -> None:
        """Start buffering frees (not nestable)."""
        ...

    def free_group_end(self) -> None:
        """Perform the buffered frees as ONE :meth:`free` of their concatenation."""
        ...

    def backup_state(self) -> Any:
        """Opaque copy of the free lists (EAGLE v1 borrows draft slots with it)."""
        ...

    def restore_state(self, state: Any) -> None:
        """Put back free lists taken by :meth:`backup_state`."""
        ...

    def merge_and_sort_free(self) -> None:
        """``free_pages = sorted(free_pages + release_pages)``; ``release_pages = []``."""
        ...

    def clear(self) -> None:
        """Every page free again (ids ascending), no release pages, no open group."""
        ...

    def snapshot(self) -> AllocatorSnapshot:
        """Plain snapshot of the free lists and group state."""
        ...


class PagedAllocatorProtocol(TokenAllocatorProtocol[IdxT], Protocol[IdxT]):
    """Paged allocator batch operations (SGLang's call shapes; ``*_cpu`` are host copies of the
    lengths, so that the twin never needs a device-to-host sync; the reference takes lists)."""

    def alloc_extend(
        self,
        prefix_lens: IdxT,
        prefix_lens_cpu: Sequence[int],
        seq_lens: IdxT,
        seq_lens_cpu: Sequence[int],
        last_loc: IdxT,
        extend_num_tokens: int,
    ) -> IdxT | None:
        """Slots for tokens ``[P_i, S_i)`` of each request, in batch order (three parts: finish
        the prefix's partial page, whole new pages, the tail on the last new page). ``last_loc`` is
        the slot of token ``P_i - 1`` or -1 when ``P_i == 0``. ``None`` if the new pages do not fit.
        """
        ...

    def alloc_decode(
        self, seq_lens: IdxT, seq_lens_cpu: Sequence[int], last_loc: IdxT
    ) -> IdxT | None:
        """One slot per request for token ``S_i - 1`` (``seq_lens`` counts it): ``last_loc + 1``,
        or the first slot of the next free page when ``(S_i - 1) % page_size == 0``."""
        ...


class KVCacheProtocol(Protocol):
    """KV buffers: per layer ``size + page_size`` rows (row = slot). Layers are addressed by global
    id ``start_layer..end_layer`` (inclusive). MHA keeps K and V; MLA one fused buffer whose value
    view is its first ``kv_lora_rank`` channels. Buffer types are the twin's own."""

    size: int
    page_size: int
    start_layer: int
    end_layer: int

    def set_kv_buffer(
        self,
        layer_id: int,
        loc: Any,
        cache_k: Any,
        cache_v: Any,
        k_scale: float | None = None,
        v_scale: float | None = None,
    ) -> None:
        """Store ``cache_k / k_scale`` (and V likewise) at slots ``loc`` of layer ``layer_id``.
        Never mutates ``cache_k`` or ``cache_v``. MLA ignores ``cache_v``."""
        ...

    def get_key_buffer(self, layer_id: int) -> Any: ...

    def get_value_buffer(self, layer_id: int) -> Any: ...

    def get_kv_buffer(self, layer_id: int) -> tuple[Any, Any]: ...

    def move_kv_cache(self, tgt_loc: Any, src_loc: Any) -> None:
        """Copy every layer's rows ``src_loc`` to ``tgt_loc``."""
        ...

    def read_tags(self, loc: Sequence[int]) -> list[int]:
        """The KV tag (:mod:`kvpool.tags`) stored at each slot (layer ``start_layer``, K channel
        0); 0 for a slot never written."""
        ...


class RadixCacheProtocol(Protocol[IdxT_contra]):
    """Prefix cache (SGLang's RadixCache; ``disable=True`` gives the ChunkCache behaviour).

    Sizes are tokens. The root has an empty key and ``lock_ref`` 1 forever. Keys are page-aligned
    (a trailing partial page is never inserted nor matched). Node ids come from a counter."""

    page_size: int
    disable: bool

    def match_prefix(self, key: Any) -> Any:
        """Longest cached page-aligned prefix of ``key`` (a RadixKey). Splits the node where the
        match ends inside it; refreshes access times. Returns a MatchResult with
        ``device_indices`` (IdxT) and ``last_device_node``."""
        ...

    def insert(self, key: Any, value: IdxT_contra | None = None) -> int:
        """Insert the page-aligned part; returns the length that was already cached. Frees
        nothing: the caller frees its duplicate slots."""
        ...

    def inc_lock_ref(self, node: Any) -> int: ...

    def dec_lock_ref(self, node: Any) -> int: ...

    def evict(self, num_tokens: int) -> int:
        """Evict whole unlocked leaves by policy until ``num_tokens`` are freed or nothing is
        evictable. Returns the tokens actually freed (may exceed the request)."""
        ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...

    def reset(self) -> None: ...

    def pretty_print(self) -> str: ...

    def cache_finished_req(
        self, req: Any, is_insert: bool = True, row_read: Any = None
    ) -> None: ...

    def cache_unfinished_req(
        self, req: Any, chunked: bool = False, row_read: Any = None
    ) -> None: ...

    def snapshot(self) -> TreeSnapshot: ...


class MemoryManagerProtocol(Protocol[IdxT_co]):
    """The request lifecycle over one set of pools (``req_to_token_pool``,
    ``token_to_kv_pool_allocator``, ``tree_cache``, ``kv_cache``), built from a
    :class:`kvpool.config.PoolConfig`. This request-level API is what the lockstep harness drives;
    every result is compared exactly across twins.

    Request states: ``waiting`` -> (``match_prefix`` may lock a prefix while still waiting) ->
    ``running`` (after its first ``extend``; ``is_chunked > 0`` while its prompt is only partly
    prefilled) -> ``finished`` or ``aborted``; ``retract`` sends a running request back to
    ``waiting`` with its KV released and its generated tokens appended to its prompt.

    KV content: whenever a token's KV is computed (extend, decode, accepted speculative tokens) the
    manager writes its tag (:func:`kvpool.tags.kv_tags` of the request's full token list and
    ``extra_key``) into that token's slot on every layer.
    """

    def new_req(
        self,
        rid: str,
        input_ids: Sequence[int],
        extra_key: str | None = None,
        session_id: str | None = None,
    ) -> None:
        """Register a waiting request. With ``session_id`` the request is the session's next
        turn: its full token list is the session's committed tokens followed by ``input_ids``,
        and its first ``extend`` restores the session's row, KV and lock."""
        ...

    def match_prefix(self, rid: str) -> int:
        """For a waiting request: match its tokens (capped at ``len - 1``) in the tree, lock the
        last matched node (releasing any lock it held before) and remember the prefix. Returns
        the prefix length in tokens (0 with the radix cache disabled)."""
        ...

    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> IdxT_co:
        """One prefill batch. Each request is waiting (matched here if it was not) or a chunked
        request continuing. ``chunk_sizes[i]`` caps the new tokens of request ``i`` this step
        (``None``: all remaining prompt tokens). Evicts what it needs first, then
        ``alloc_for_extend``. A request left with prompt tokens to go becomes chunked and goes
        through ``cache_unfinished_req(chunked=True)``. Returns ``out_cache_loc``: the new slots
        of every request, in batch order."""
        ...

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> IdxT_co:
        """One decode step: request ``i`` (running, prompt fully prefilled) appends
        ``token_ids[i]``; one slot each (``alloc_for_decode``), unless speculative over-allocation
        already covers it. Returns the slots, in batch order."""
        ...

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> IdxT_co:
        """EAGLE v2 step: grow each allocation to ``ceil_align(kv_committed_len + 2 * reserve,
        page_size)`` (never shrinking), then commit ``accepted[i]`` (at most ``2 * reserve``
        tokens). Returns the newly allocated slots (batch order); the excess stays allocated
        until release."""
        ...

    def spec_draft_v1(self, rids: Sequence[str], num_draft: int) -> IdxT_co:
        """EAGLE v1: borrow ``num_draft`` slots per request with backup_state / alloc /
        restore_state and write draft tags there; the slots stay officially free. Returns them."""
        ...

    def finish(self, rids: Sequence[str], is_insert: bool = True) -> None:
        """Release a batch inside ``free_group_begin/end``: ``release_kv_cache`` for each (or the
        session takes the row, KV and lock when the request is a session turn)."""
        ...

    def abort(self, rid: str) -> None:
        """Abort a waiting (maybe locked) or running request: locks dropped, everything it holds
        freed without inserting into the tree."""
        ...

    def retract(self, rid: str) -> None:
        """Running -> waiting: release without insert; its tokens so far become its prompt."""
        ...

    def open_session(self, session_id: str) -> None: ...

    def close_session(self, session_id: str) -> None:
        """Drop the session's lock, free ``[cache_protected_len, allocated)`` and its row."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Evict from the tree (tokens actually freed)."""
        ...

    def snapshot(self) -> PoolSnapshot:
        """The whole state for :mod:`kvpool.invariants`."""
        ...


class SegmentAllocatorProtocol(TokenAllocatorProtocol[IdxT], Protocol[IdxT]):
    """A token allocator that also frees SGLang 0.5.23's way (``Rules.tree_free == "segment"``,
    :class:`kvpool.reference.pools.allocator.BaseTokenToKVPoolAllocator`): what the radix cache
    and the sessions hand slots to."""

    def free_page_ids(self, page_ids: IdxT) -> None:
        """Free exactly these pages (page ids, not slots), in the given order."""
        ...

    def free_segment(self, free_index: IdxT, start_pos: int = 0) -> None:
        """Free the pages of a row segment starting at column ``start_pos`` (a multiple of
        ``page_size`` tokens): one page per ``page_size`` slots, in order."""
        ...


# ----------------------------------------------------------------- host tier (hicache/)
# The host-tier family: a host KV pool, the controller of device <-> host transfers, and what the
# request lifecycle uses of a tree with a host tier (kvpool's HiRadixCache of either twin, or an
# injected tree such as an SGLang adapter). Units: tokens; device slots and host slots.

AckT = TypeVar("AckT")
NodeT = TypeVar("NodeT")


class TaggedKVPoolProtocol(Protocol[IdxT_contra]):
    """What the host tier uses of a device KV pool: its geometry and the KV tags
    (:mod:`kvpool.tags`) stored at its slots."""

    @property
    def size(self) -> int:
        """Usable device slots (tokens)."""
        ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        ...

    def read_tags(self, loc: IdxT_contra) -> list[int]:
        """The tag stored at each slot of ``loc`` (0 for a slot never written)."""
        ...

    def write_tags(self, loc: IdxT_contra, tags: IdxT_contra) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every layer."""
        ...


class HostPoolProtocol(Protocol[IdxT]):
    """A host KV pool: host slots ``0..size-1`` handed out in whole pages, each holding one KV
    tag (``tags``) copied from or to ``device_pool``'s slots. ``alloc`` returns None (nothing
    changed) when fewer slots are free; ``free`` of a slot not held raises
    :class:`kvpool.errors.DoubleFreeError` and changes nothing."""

    tags: IdxT

    @property
    def page_size(self) -> int: ...

    @property
    def device_pool(self) -> TaggedKVPoolProtocol[IdxT]:
        """The device KV pool this pool backs."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """``need_size`` host slots (a page multiple), or None."""
        ...

    def free(self, indices: IdxT) -> int:
        """Release held host slots; returns how many."""
        ...

    def available_size(self) -> int:
        """Free host slots (tokens)."""
        ...

    def clear(self) -> None:
        """Every slot free, every tag 0."""
        ...

    def backup_from_device_all_layer(
        self, device_pool: TaggedKVPoolProtocol[IdxT], host_indices: IdxT, device_indices: IdxT
    ) -> None:
        """Copy the device slots' content into the host slots, slot for slot, all layers."""
        ...

    def load_to_device_all_layer(
        self, device_pool: TaggedKVPoolProtocol[IdxT], host_indices: IdxT, device_indices: IdxT
    ) -> None:
        """Copy the host slots' content into the device slots, slot for slot, all layers."""
        ...

    def snapshot(self) -> HostPoolSnapshot: ...


class HostControllerProtocol(Protocol[IdxT, AckT]):
    """The transfers between device slots and host slots (SGLang's ``HiCacheController``):
    ``AckT`` is one transfer in flight. Writes are issued at once (or queued with
    ``flush=False`` until ``start_writing``); loads are queued until ``start_loading``;
    ``complete`` copies a transfer's content when it has finished."""

    ack_write_queue: list[AckT]
    ack_load_queue: list[AckT]

    def write(self, device_indices: IdxT, node_id: int = -1, *, flush: bool = True) -> IdxT | None:
        """Reserve host slots for ``device_indices`` and queue the copy; None when full."""
        ...

    def start_writing(self) -> None:
        """Issue the queued writes as one transfer."""
        ...

    def load(self, host_indices: IdxT, node_id: int = -1) -> IdxT | None:
        """Reserve device slots for ``host_indices`` and queue the copy; None when full."""
        ...

    def start_loading(self) -> int:
        """Issue the queued loads as one transfer; its producer index (-1: none queued)."""
        ...

    def complete(self, ack: AckT) -> None:
        """The transfer ``ack`` has finished: copy its content."""
        ...


class HostTierTreeProtocol(Protocol[IdxT, NodeT, AckT]):
    """What the request lifecycle uses of a tree cache with a host tier (``NodeT``: the tree's
    node type): restoring a host-only prefix at admission, issuing loads before a forward and
    writes after a batch, and delivering acknowledgements."""

    @property
    def unified(self) -> bool:
        """Whether SGLang 0.5.23's host tier runs (writes queued until the end of a batch)."""
        ...

    @property
    def cache_controller(self) -> HostControllerProtocol[IdxT, AckT]: ...

    def init_load_back(self, node: NodeT, mem_quota: int | None = None) -> tuple[IdxT, NodeT]:
        """Restore ``node``'s host-only path into device slots; the restored slots (empty when
        nothing moved) and the deepest node on device the request should lock."""
        ...

    def ready_to_load_host_cache(self) -> int:
        """Issue the queued loads (one transfer); its producer index, -1 if none."""
        ...

    def writing_check(self, num_acks: int | None = None, write_back: bool = False) -> int:
        """Deliver the first ``num_acks`` write acknowledgements (all when None)."""
        ...

    def loading_check(self, num_acks: int | None = None) -> int:
        """Deliver the first ``num_acks`` load acknowledgements (all when None)."""
        ...

    def host_snapshot(self) -> HostTierSnapshot:
        """The whole host tier for :mod:`kvpool.invariants`."""
        ...


# ----------------------------------------------------------------- SWA family (swa/)
# What the SWA lifecycle (SWAMemoryManager and the window steps), the SWA radix tree and the
# unified FULL+SWA tree use of a sliding-window hybrid allocator, and what the lifecycle uses of a
# sliding-window prefix tree besides its walks (``match_prefix`` / ``insert`` take the twin's own
# key). kvpool's classes of either twin and SGLang's adapters (kvpool/sglang/swa.py,
# swa_radix.py) offer them. Units: tokens; full slots name tokens, SWA slots their window KV.

SWANodeT_contra = TypeVar("SWANodeT_contra", contravariant=True)
"""A sliding-window tree's own node class (each implementation's)."""


class SWAAllocatorProtocol(Protocol[IdxT]):
    """A full pool and a smaller SWA pool of the same page size, allocated in step and joined by
    a full-to-SWA slot mapping (0: no SWA slot; see :mod:`kvpool.reference.swa.allocator`)."""

    @property
    def page_size(self) -> int: ...

    @property
    def size(self) -> int:
        """Tokens both pools can hold: the smaller pool's size."""
        ...

    def available_size(self) -> int:
        """Tokens allocatable now in both pools: the smaller free count."""
        ...

    def full_available_size(self) -> int: ...

    def swa_available_size(self) -> int: ...

    def translate_loc_from_full_to_swa(self, kv_indices: IdxT) -> IdxT:
        """The SWA slot of each full slot (0 where it has none; -1 stays -1)."""
        ...

    def set_full_to_swa_mapping(self, full_indices: IdxT, swa_indices: IdxT) -> None:
        """``mapping[full_indices[i]] = swa_indices[i]`` (0 unmaps)."""
        ...

    def alloc(self, need_size: int) -> IdxT | None:
        """Page size 1: ``need_size`` full slots, each mapped to a new SWA slot; ``None`` (no
        change) unless both pools have room."""
        ...

    def alloc_extend(
        self,
        prefix_lens: IdxT,
        prefix_lens_cpu: Sequence[int],
        seq_lens: IdxT,
        seq_lens_cpu: Sequence[int],
        last_loc: IdxT,
        extend_num_tokens: int,
    ) -> IdxT | None:
        """Page size > 1: :meth:`PagedAllocatorProtocol.alloc_extend` on both pools in step."""
        ...

    def alloc_decode(
        self, seq_lens: IdxT, seq_lens_cpu: Sequence[int], last_loc: IdxT
    ) -> IdxT | None:
        """Page size > 1: :meth:`PagedAllocatorProtocol.alloc_decode` on both pools in step."""
        ...

    def free(self, free_index: IdxT) -> None:
        """Free full slots and the SWA slots their mapping names, zeroing those entries."""
        ...

    def free_swa(self, free_index: IdxT) -> None:
        """Free only the SWA slots of full slots (tokens that slid out of the window)."""
        ...

    def free_group_begin(self) -> None: ...

    def free_group_end(self) -> None: ...

    def backup_state(self) -> object:
        """Opaque copy of both free lists and the mapping."""
        ...

    def restore_state(self, state: object) -> None: ...

    def clear(self) -> None: ...

    def snapshot(self) -> SWAAllocatorSnapshot: ...


class SWATreeProtocol(Protocol[SWANodeT_contra]):
    """A sliding-window prefix tree's locks, eviction and sizes (see
    :mod:`kvpool.reference.swa.radix_cache`): a lock takes full locks up to the root and SWA
    locks only as far as the window reaches (returning the uuid its unlock stops at)."""

    @property
    def page_size(self) -> int: ...

    @property
    def sliding_window_size(self) -> int: ...

    def inc_lock_ref(self, node: SWANodeT_contra) -> int | None: ...

    def dec_lock_ref(
        self, node: SWANodeT_contra, swa_uuid_for_lock: int | None = None, skip_swa: bool = False
    ) -> None: ...

    def dec_swa_lock_only(
        self, node: SWANodeT_contra, swa_uuid_for_lock: int | None = None
    ) -> None: ...

    def evict(self, num_tokens: int, swa_num_tokens: int = 0) -> tuple[int, int]:
        """Free at least ``num_tokens`` full and ``swa_num_tokens`` SWA tokens if the tree
        allows; returns (full tokens freed, SWA tokens freed)."""
        ...

    def full_evictable_size(self) -> int: ...

    def full_protected_size(self) -> int: ...

    def swa_evictable_size(self) -> int: ...

    def swa_protected_size(self) -> int: ...

    def reset(self) -> None: ...

    def snapshot(self) -> TreeSnapshot: ...


# ----------------------------------------------------------------- Mamba family (mamba/)
# What the lifecycle (MambaHooks) and the unified FULL+MAMBA tree use of a hybrid (Mamba) model's
# request table, its state slots and their allocator, and of the Mamba radix tree. kvpool's
# classes of either twin and SGLang's adapters (kvpool/sglang/hybrid.py, mamba_radix.py) offer
# them. Units: tokens for KV; one Mamba slot holds one request's (or one checkpoint's) state.

MambaNodeT_contra = TypeVar("MambaNodeT_contra", contravariant=True)
"""A Mamba tree's own node class (each implementation's)."""


class MambaSlotAllocatorProtocol(Protocol):
    """Mamba state slots ``1..size`` (slot 0 reserved), with SGLang's allocation groups."""

    def available_size(self) -> int: ...

    def schedulable_available_size(self) -> int:
        """Free slots a new batch may count on (an open group's reservation excluded)."""
        ...

    def alloc(self, need_size: int) -> list[int] | None: ...

    def free(self, indices: Sequence[int]) -> None: ...

    def alloc_group_begin(self, num_reqs: int) -> None: ...

    def alloc_group_end(self) -> None: ...

    def clear(self) -> None: ...

    def snapshot(self) -> MambaAllocatorSnapshot: ...


class MambaPoolProtocol(Protocol[IdxT_contra]):
    """The state buffers of the Mamba slots: what the lifecycle writes, copies and reads."""

    def clear_slots(self, indices: IdxT_contra) -> None: ...

    def copy_from(self, src_indices: IdxT_contra, dst_indices: IdxT_contra) -> None:
        """Copy each source slot's state into the destination slot (copy-on-write)."""
        ...

    def write_state(self, indices: IdxT_contra, tags: IdxT_contra) -> None: ...

    def state_tags(self, indices: Sequence[int]) -> list[int]:
        """The tag of the state each slot holds (:func:`kvpool.tags.mamba_state_tag`)."""
        ...

    def snapshot(self) -> MambaPoolSnapshot: ...


class HybridReqToTokenPoolProtocol(Protocol):
    """What the lifecycle uses of a hybrid model's request table besides the plain table's
    calls: its Mamba slots (one per request holding a row, plus copy-on-write and track
    buffers), their allocator and a snapshot of both."""

    @property
    def mamba_allocator(self) -> MambaSlotAllocatorProtocol: ...

    def mamba_slots_needed(self, reqs: Sequence[MambaReqLike]) -> int:
        """Mamba slots an admission of ``reqs`` takes (those not holding one yet)."""
        ...

    def free_mamba_cache(
        self, req: MambaReqLike, mamba_ping_pong_track_buffer_to_keep: int | None = None
    ) -> None: ...

    def available_size(self) -> int: ...

    def clear(self) -> None: ...

    def hybrid_snapshot(self, rows: Sequence[tuple[int, int]] = ()) -> HybridReqToTokenSnapshot: ...


class MambaTreeProtocol(Protocol[MambaNodeT_contra]):
    """A Mamba radix tree's locks, eviction and sizes (see
    :mod:`kvpool.reference.mamba.radix_cache`): a lock covers the node's state and the KV of its
    path to the root; eviction frees KV tokens and cached states."""

    def inc_lock_ref(self, node: MambaNodeT_contra) -> None: ...

    def dec_lock_ref(self, node: MambaNodeT_contra) -> None: ...

    def evict_mamba(self, mamba_num: int) -> int:
        """Free at least ``mamba_num`` cached states if the tree allows; returns those freed."""
        ...

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> tuple[int, int]: ...

    def full_evictable_size(self) -> int: ...

    def mamba_evictable_size(self) -> int: ...

    def full_protected_size(self) -> int: ...

    def mamba_protected_size(self) -> int: ...

    def all_mamba_values(self) -> list[int]:
        """Every Mamba slot the tree holds (its checkpoints)."""
        ...

    def reset(self) -> None: ...

    def snapshot(self) -> MambaTreeSnapshot: ...


# ----------------------------------------------------------------- KV pools (kv/)
# The KV-pool family: the MHA and MLA pools and their storage variants (FP4, MXFP8, page-major,
# no-op) of either twin. KVCacheProtocol above is the buffer interface the attention layers use;
# what follows is what the request lifecycle and the host tier use of a pool beyond it: the
# geometry, the KV tags written at allocation and checked at every read, and the layer-wise
# loading hook. Units: tokens (slots); layers by global id.


class LayerTransferCounter(Protocol):
    """The layer-wise loading hook (pipeline / disaggregation): a pool's buffer reads wait on it
    until their layer has loaded (:mod:`kvpool.reference.kv.layer_transfer`)."""

    def wait_until(self, threshold: int) -> None:
        """Return once local layer ``threshold`` (``layer_id - start_layer``) has loaded."""
        ...


class KVPoolProtocol(Protocol[IdxT_contra]):
    """A KV pool as the lifecycle and the host tier use it (every storage variant of either twin
    satisfies it; ``IdxT_contra``: the twin's slot containers, ``Sequence[int]`` in the reference,
    a tensor or a sequence in the optimized twin)."""

    @property
    def size(self) -> int:
        """Usable slots (tokens); the buffers hold ``size + page_size`` rows."""
        ...

    @property
    def page_size(self) -> int: ...

    @property
    def num_rows(self) -> int:
        """Rows per layer buffer: ``size + page_size``."""
        ...

    @property
    def layer_num(self) -> int: ...

    @property
    def start_layer(self) -> int: ...

    @property
    def end_layer(self) -> int:
        """``start_layer + layer_num - 1`` (inclusive)."""
        ...

    @property
    def head_num(self) -> int:
        """Heads per row (1 for MLA's fused row)."""
        ...

    @property
    def store_dtype(self) -> object:
        """What a row element is stored as: a dtype name in the reference, a ``torch.dtype`` in
        the optimized twin (fp8 and FP4 store bytes)."""
        ...

    def write_tags(self, loc: IdxT_contra, tags: IdxT_contra) -> None:
        """Store ``tags[i]`` at slot ``loc[i]`` on every held layer (K channel 0 of every head,
        other channels 0; the variants encode it in their own format)."""
        ...

    def read_tags(self, loc: IdxT_contra) -> list[int]:
        """The tag stored at each slot of ``loc`` (layer ``start_layer``; 0 if never written)."""
        ...

    def register_layer_transfer_counter(self, counter: LayerTransferCounter) -> None:
        """Make every later buffer read of layer ``l`` first call
        ``counter.wait_until(l - start_layer)``."""
        ...
