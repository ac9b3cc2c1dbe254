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

from kvpool.snapshot import AllocatorSnapshot, PoolSnapshot, ReqToTokenSnapshot, TreeSnapshot

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
    :mod:`kvpool.reference.pools.segment_free`): what the radix cache and the sessions hand slots
    to."""

    def free_page_ids(self, page_ids: IdxT) -> None:
        """Free exactly these pages (page ids, not slots), in the given order."""
        ...

    def free_segment(self, free_index: IdxT, start_pos: int = 0) -> None:
        """Free the pages of a row segment starting at column ``start_pos`` (a multiple of
        ``page_size`` tokens): one page per ``page_size`` slots, in order."""
        ...
