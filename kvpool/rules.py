"""Rules: the documented knobs where kvpool's behaviour may differ from a given SGLang release.

kvpool reproduces SGLang's observable choices wherever SGLang's are deterministic. In a few places
kvpool is deliberately stricter (specs/fidelity.md, "Where kvpool is stricter"), and SGLang's own
releases differ from each other (row order, for one). Each such difference is a field of
:class:`Rules`; a :class:`~kvpool.config.PoolConfig` carries one ``Rules`` value and both twins
follow it. An adapter for another implementation (``kvpool.sglang``) selects the preset that
describes it: :meth:`Rules.for_sglang`. The default, ``Rules()``, is kvpool's own strict rules.

Torch-free: the reference imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvpool.errors import ConfigError
from kvpool.field_types import check_field_types

ROW_ORDERS = ("lifo", "fifo")
UNALIGNED_ALLOC = ("error", "floor")
GENERATION_ON_CLEAR = ("keep", "reset")
RELEASE_ORDERS = ("prepend", "append")
EVICTION_DEMANDS = ("exact", "bound")
EVICTION_AMOUNTS = ("shortfall", "demand")
TREE_FREES = ("free", "segment")
HIT_COUNTS = ("chunked", "inserted_len")
RELEASE_PATHS = ("finished_req", "checkpoint")
RELEASE_UPTOS = ("owned", "committed")
MAMBA_SLOT_SHORTAGES = ("refuse", "assert")
MAMBA_TREES = ("mamba_radix", "unified")
SWA_FREE_RESOLVES = ("free", "group_end")
SWA_FREE_UNMAPPED = ("skip", "caller")
SWA_WINDOW_RELEASES = ("decode", "scheduler", "maybe_evict")
SWA_TREES = ("swa_radix", "unified")
HICACHE_HOST_TIERS = ("hiradix", "unified")
PREFETCH_REFILLS = ("drop", "attach", "refill")
UNIFIED_FREES = ("segment", "free")
UNIFIED_SPLIT_RECENCIES = ("beside", "front")
UNIFIED_TOMBSTONE_LOCKS = ("count", "skip")
SGLANG_RELEASES = ("0.5.16", "0.5.23")
"""SGLang releases with a preset (:meth:`Rules.for_sglang`); audited in specs/fidelity.md."""


@dataclass(frozen=True)
class Rules:
    """Behaviour knobs (see specs/fidelity.md for each one's SGLang rule and kvpool's).

    - ``row_order``: ``free_slots`` starts as ``[1, ..., size]`` and a freed row is appended.
      ``"lifo"`` (kvpool; SGLang 0.5.18+): ``alloc`` takes the last ``n`` rows of the list, in
      list order, so the row freed last is reused first (and a fresh pool hands out its highest
      rows). ``"fifo"`` (SGLang <= 0.5.17): it takes the first ``n``.
    - ``refused_alloc_unchanged``: True (kvpool): an allocation that returns None leaves the
      allocator exactly as it was. False (SGLang): a ``need_sort`` merge made by the
      allocation's pre-test stays even when the allocation is then refused.
    - ``unaligned_paged_alloc``: ``"error"`` (kvpool): paged ``alloc(n)`` with ``n`` not a
      multiple of ``page_size`` raises AlignmentError. ``"floor"`` (SGLang): it hands out
      ``n // page_size`` whole pages.
    - ``generation_on_clear``: ``"keep"`` (kvpool; SGLang 0.5.23): ``ReqToTokenPool.clear``
      keeps ``req_generation`` (it never goes backwards). ``"reset"`` (SGLang 0.5.16): it
      zeroes it.
    - ``rejects_misuse``: True (kvpool): freeing a free, reserved or out-of-range slot, a
      nested free group and similar misuse raise a typed error and change nothing. False
      (SGLang): such calls silently corrupt the state, so a harness must not issue them to an
      implementation with these rules (the reference still refuses them).
    - ``release_order``: where the paged allocator puts freed pages under ``need_sort``.
      ``"prepend"`` (kvpool; SGLang 0.5.16): each free's sorted pages go in front of
      ``release_pages``. ``"append"`` (SGLang 0.5.23): they go behind (SGLang's staged pages).
      Only the order of ``release_pages`` differs: a merge sorts them either way.
    - ``eviction_demand`` (read by the lifecycle helpers): the token count an extend or decode
      step evicts for. ``"exact"`` (kvpool): the tokens of the new pages actually needed.
      ``"bound"`` (SGLang): paged extend ``extend_num_tokens + batch_size * page_size``, paged
      decode ``batch_size * page_size``; page size 1 the new tokens (the same as exact).
    - ``eviction_amount`` (read by the lifecycle helpers): how much is evicted when the demand
      exceeds ``available_size()``. ``"shortfall"`` (kvpool; SGLang 0.5.23): demand minus
      available. ``"demand"`` (SGLang 0.5.16): the whole demand.
    - ``tree_free``: how the radix cache returns an evicted node's slots and a finished
      request's duplicates. ``"free"`` (kvpool; SGLang 0.5.16): ``allocator.free`` (the sorted
      unique pages). ``"segment"`` (SGLang 0.5.23): ``allocator.free_segment`` (one page per
      ``page_size`` slots, in slot order, unsorted).
    - ``hit_count``: which nodes a request's insert counts a hit on. ``"chunked"`` (kvpool;
      SGLang 0.5.16): every node of the matched path and the new leaf, unless the insert is a
      prefill chunk's (``chunked``). ``"inserted_len"`` (SGLang 0.5.23): only the nodes that
      end past the request's ``cache_inserted_len`` (the tokens it inserted before), whatever
      ``chunked`` says; each insert raises ``cache_inserted_len`` to its key length.
    - ``release_path``: how a finished request's KV reaches the tree and the allocator.
      ``"finished_req"`` (kvpool; SGLang 0.5.16): ``cache_finished_req`` inserts the committed
      tokens and frees the duplicates, then (two frees) the rest of ``[cache_protected_len,
      committed)``; the over-allocation is one ``free``. ``"checkpoint"`` (SGLang 0.5.23):
      ``checkpoint`` inserts them, inserts the page-aligned prompt again when it is shorter
      (the leaf splits at the prompt boundary; the prompt part gets ``priority + 1``), frees
      the duplicates, matches again (one more clock read), rewrites the row and moves
      ``cache_protected_len`` and the lock; then ``free_kv_row`` frees ``[cache_protected_len,
      committed)`` and the over-allocation with ``free_segment`` (row order, unsorted). A chunk
      boundary runs the same ``checkpoint``; a disabled cache and ``ChunkCache`` free their row
      with ``free_segment``.
    - ``release_upto``: how much of a finished request's KV its release keeps when the request
      stopped before its last committed token (``finish``'s ``finished_lens``: a speculative
      step commits its whole accepted run, and a stop token may lie inside it). ``"owned"``
      (kvpool; SGLang 0.5.23's ``owned_kv_len``): the tokens through the stop, ``min(committed,
      prompt + finished_len)``; the tree gets those, and the overshoot is freed with the
      over-allocation from ``ceil_align(owned)``. ``"committed"`` (SGLang 0.5.16): every
      committed token, the overshoot the client never received included, enters the tree. A
      hybrid (Mamba) model's state holds every committed token: under ``"owned"`` such a
      request caches nothing (0.5.23's ``skip_radix_cache_insert``). A session turn hands its
      session the tokens through the stop under both (SGLang's streaming session trims the
      overshoot in both releases).
    - ``mamba_slot_shortage``: what a hybrid model's pool does when a batch needs more Mamba
      slots than are free. ``"refuse"`` (kvpool): ``HybridReqToTokenPool.alloc`` checks them
      before it takes any row and returns None, nothing changed; a copy-on-write match that
      finds no slot even after evicting a state leaves the request without one. ``"assert"``
      (SGLang): ``alloc`` takes the rows, then asserts; the match asserts. Like
      ``rejects_misuse``, kvpool still refuses; a harness does not drive an implementation
      with these rules into the shortage.
    - ``mamba_tree``: the prefix cache of a hybrid (Mamba) model with the radix cache on, in
      the lifecycle. ``"mamba_radix"`` (kvpool; SGLang 0.5.16): the ``MambaRadixCache`` with
      0.5.16's release path (``release_path="finished_req"``; a chunk's checkpoint re-matches;
      admission evicts cached states down to a headroom of three slots per request).
      ``"unified"`` (SGLang 0.5.23): the FULL+MAMBA ``UnifiedRadixCache`` (tombstone leaves,
      one eviction's two amounts counted together) with 0.5.23's release path
      (``release_path="checkpoint"``: a finished request's state is donated by ``checkpoint``,
      a chunk's checkpoint moves the lock without a re-match); admission
      (``ensure_mamba_capacity``) evicts exactly the shortfall of the slots the batch needs,
      before the KV is allocated. ``"unified"`` with ``release_path="finished_req"`` (SGLang
      0.5.16, whose registry builds its earlier unified tree, read with the ``unified_*``
      knobs below): that tree with 0.5.16's release (a chunk's checkpoint re-matches, a
      finish donates the state, admission keeps the headroom of three slots per request).
      The two knobs go together (``("mamba_radix", "checkpoint")`` is ConfigError for a
      hybrid configuration with the radix cache on).
    - ``swa_free_resolve``: when an SWA allocator's ``free`` inside a free group reads the
      mapping of the freed full slots. ``"free"`` (kvpool; SGLang 0.5.23): at the call (the
      SWA slots go to the SWA pool's group, the entries are zeroed at once). ``"group_end"``
      (SGLang 0.5.16): the full slots are buffered with their entries intact and
      ``free_group_end`` frees them and then the SWA slots their entries name then; the SWA
      pool is never in a group (a ``free_swa`` inside the group frees at once).
    - ``swa_restore_mapping``: True (kvpool): an SWA allocator's ``restore_state`` puts back
      the mapping too. False (SGLang 0.5.16): only the two free lists, so the entries of slots
      allocated since the backup stay, stale (INV-SWA-FREE-UNMAPPED; a later free of a page
      paired with another SWA page frees another request's SWA slots: specs/sglang.md). kvpool's
      twins always restore the mapping; a harness must not restore an implementation with
      these rules.
    - ``swa_decode_refusal_clean``: True (kvpool): an SWA allocator's ``alloc_decode`` that
      does not fit both pools returns None and changes nothing. False (SGLang 0.5.16, 0.5.23):
      it runs both page allocators' ``alloc_decode`` before it looks at either result, so the
      pages one pool handed out are dropped (leaked) when the other is short; SGLang's
      scheduler never gets there (a refused decode is its out-of-memory error). kvpool's twins
      always refuse cleanly; a harness must not issue a decode that does not fit to an
      implementation with these rules.
    - ``swa_free_unmapped``: what an SWA allocator's ``free`` does at page size 1 with a full
      slot whose SWA slot is gone already (mapping entry 0: it slid out of the window).
      ``"skip"`` (kvpool; SGLang 0.5.16): the entry is skipped, only the full slot is freed.
      ``"caller"`` (SGLang 0.5.23): ``free`` presumes every slot still holds its SWA slot and
      frees the SWA slot the entry names, so an entry 0 puts the sentinel slot 0 into the SWA
      free list (INV-SWA-SENTINEL; specs/sglang_findings.md); the caller frees such slots
      with ``free_full`` (0.5.23's ``free_kv_row_segments`` does: the window-dead range goes
      to ``free_full_segments``). kvpool's twins always skip and offer ``free_full``; a harness
      must split such a free for an implementation with these rules.
    - ``swa_window_release`` (with ``swa_eviction_interval``, tokens): how the SWA lifecycle
      (``SWAMemoryManager``) slides a request's window and releases its KV.
      ``"decode"`` (kvpool; SGLang 0.5.16's window frontier, slid at kvpool's own time): after
      every decode (its first too, at the tokens before the one just decoded),
      the window keeps ``sliding_window`` tokens (chunk cache) or ``max(sliding_window,
      page_size)`` (radix cache, the 0.5.16 ``SWARadixCache``); a release frees the row with
      the allocator's ``free``. ``"scheduler"`` (SGLang 0.5.23's ``maybe_evict_swa`` and
      ``free_kv_row_segments``): the window slides at the start of a decode's (or EAGLE v2
      step's) allocation, for the requests decoded at least once since their row was handed
      out, once ``swa_eviction_interval`` tokens (``SGLANG_SWA_EVICTION_INTERVAL``) left it;
      with the radix cache (the unified FULL+SWA tree, ``checkpoint`` release) it keeps
      ``ceil_align(max(sliding_window, page_size), page_size)`` tokens and a checkpoint of a
      running request slides it first; with the chunk cache it keeps ``sliding_window``
      tokens and also slides at a later prefill chunk's allocation; a release frees the
      window-dead columns ``[cache_protected_len, swa_evicted_seqlen)`` full-side only
      (``free_full_segment``) and the rest with ``free_segment``. ``"maybe_evict"`` (SGLang
      0.5.16's ``ScheduleBatch.maybe_evict_swa`` over ``free_swa_out_of_window_slots``): the
      ``"decode"`` frontier (``free_swa``; the window keeps ``sliding_window`` tokens with the
      chunk cache, ``max(sliding_window, page_size)`` with the radix cache) and release
      (``free``), at the ``"scheduler"`` times: at the start of a decode's (or EAGLE v2 step's)
      allocation for the requests decoded at least once since their row was handed out, at
      their committed length, whatever the cursor (no interval test), and with the chunk cache
      at a later prefill chunk's allocation, at its prefix length; no free group. 0.5.16 gates
      the whole batch on its scheduler's forward counter modulo ``SGLANG_SWA_EVICTION_INTERVAL``,
      which kvpool does not model: ``swa_eviction_interval`` must be 1 (ConfigError otherwise).
    - ``swa_tree``: the prefix cache of a hybrid sliding-window model with the radix cache on, in
      the SWA lifecycle, under the ``"decode"`` and ``"maybe_evict"`` window rules (under
      ``"scheduler"`` it is always 0.5.23's unified FULL+SWA tree with its ``checkpoint``
      release). ``"swa_radix"`` (kvpool): 0.5.16's ``SWARadixCache`` with its
      ``cache_finished_req`` / ``cache_unfinished_req`` hand-overs. ``"unified"`` (SGLang
      0.5.16, whose registry builds its FULL+SWA ``UnifiedRadixCache`` for such a model): that
      tree (the ``unified_*`` knobs below say which release's) with 0.5.16's unified hand-overs:
      every insert, a prefill chunk's too, carries the request's ``swa_evicted_seqlen``; a
      release without insert frees ``row[cache_protected_len:committed]`` with one ``free``
      (``"swa_radix"``: two, split at the page boundary); full eviction follows
      ``eviction_policy`` (``"swa_radix"``: least recently used only).
    - ``hicache_host_tier``: how ``HiRadixCache`` runs its host tier. ``"hiradix"`` (kvpool;
      SGLang 0.5.16's ``HiRadixCache``). ``"unified"`` (SGLang 0.5.23: the host tier inside
      ``UnifiedRadixCache``, specs/unified_cache.md): writes to host are queued and issued
      together at the next ``writing_check`` (one acknowledgement for all); a write-through
      also backs up the node's unbacked ancestors; ``insert`` frees the caller's duplicate
      device slots itself and counts matched host-only tokens in its prefix; a load-back
      short of device slots evicts the shortfall before allocating and holds the anchor's host
      lock until its acknowledgement; write-back eviction demotes leaf by leaf and, short of
      host room, first reclaims host copies of nodes on device; ``last_host_node`` is the
      deepest matched node; a split keeps the creation time (kvpool.reference.hicache.unified_tier).
      In the request lifecycle: the checkpoint's inserts free the request's duplicates past its
      ``cache_protected_len`` (no free of the lifecycle's own), and ``extend`` / ``finish`` end
      by issuing the batch's queued writes (``flush_pending_backups``).
    - ``prefetch_refill``: what a storage prefetch's completion does, under a write-through
      policy, with the fetched tokens past the tree's end when the node they would hang below
      is on device without a host copy (another request inserted it after the prefetch
      started; under ``write_through_selective`` a first insert has none). ``"drop"`` (kvpool;
      SGLang's later fix in its unified tree, sgl-project/sglang#31902): their host slots are
      freed with the duplicates', so backed-up nodes keep forming a prefix from the root.
      ``"attach"`` (SGLang 0.5.16): a host-only child below that node; evicting the node's
      other children then promotes it, and ``_evict_regular`` asserts a leaf (the scheduler
      dies: specs/sglang_findings.md); the harness does not drive an eviction there.
      ``"refill"`` (SGLang 0.5.23's tree cores, ``insert_host``): every matched node on device
      without a host copy takes the fetched slots of its tokens as its host copy (it becomes a
      duplicate), so the walk ends at a backed-up node and the rest attaches below it; only
      the tokens of nodes that already had a host copy are freed; the rest is dropped only
      when no node matched and the anchor itself has no host copy.

    Three knobs say which release's ``UnifiedRadixCache`` the unified FULL+SWA tree
    (``UnifiedSWARadixCache``, both twins) follows, the last two also the FULL+MAMBA tree
    (``UnifiedMambaRadixCache``); their defaults are SGLang 0.5.23's (the tree's first model,
    specs/unified_cache.md), ``Rules.for_sglang("0.5.16")`` selects the earlier design 0.5.16
    builds for a hybrid model with the radix cache on:

    - ``unified_free``: the slot frees of the unified SWA tree. ``"segment"`` (SGLang 0.5.23):
      segment frees (``free_segment``, ``free_full_segment``, ``free_swa_segment``), an
      insert's duplicates split at ``swa_evicted_seqlen`` (the part before it full-side only).
      ``"free"`` (SGLang 0.5.16): an insert's duplicates are one ``free``; a recovered
      tombstone's old full slots one ``free``, the incoming full slots of a locked recovery one
      ``free_full``; an evicted leaf ``free`` (a tombstone leaf ``free_full``); a tombstoned
      node's SWA slots ``free_swa``.
    - ``unified_split_recency``: where a split puts the two halves in the SWA recency list.
      ``"beside"`` (SGLang 0.5.23): the upper half right behind the node it was cut from, which
      keeps its place. ``"front"`` (SGLang 0.5.16): both move to the front, the cut (lower)
      node first, the upper half right behind it. The FULL+MAMBA tree: ``"front"`` moves the
      cut node's state (the upper half has none) to the front of the state order.
    - ``unified_tombstone_lock``: how a window lock treats the tombstones it meets.
      ``"count"`` (SGLang 0.5.23): it SWA-locks every node of its segment, tombstones too, and
      counts their tokens toward the window; an unlock that would take a count below 0 is a
      LockError. ``"skip"`` (SGLang 0.5.16): it skips tombstones (no lock, not counted: the
      segment reaches further up); an unlock (``dec_lock_ref``, whose receipt from 0.5.16's
      scheduler carries no skipped ids) skips nodes whose SWA count is 0 and stops after the
      uuid's node only where it decrements it; ``dec_swa_lock_only`` skips tombstones and
      nodes whose count is 0 and stops at the uuid's node either way. The FULL+MAMBA tree's
      Mamba lock on a node without a state: ``"count"`` counts it (a state stored there while
      locked is protected); ``"skip"`` locks the path's KV only and records the skip for the
      unlock (a state stored there is evictable, even from a leaf that lock pins).
    """

    row_order: str = "lifo"
    refused_alloc_unchanged: bool = True
    unaligned_paged_alloc: str = "error"
    generation_on_clear: str = "keep"
    rejects_misuse: bool = True
    release_order: str = "prepend"
    eviction_demand: str = "exact"
    eviction_amount: str = "shortfall"
    tree_free: str = "free"
    hit_count: str = "chunked"
    release_path: str = "finished_req"
    release_upto: str = "owned"
    mamba_slot_shortage: str = "refuse"
    mamba_tree: str = "mamba_radix"
    swa_free_resolve: str = "free"
    swa_restore_mapping: bool = True
    swa_decode_refusal_clean: bool = True
    swa_free_unmapped: str = "skip"
    swa_window_release: str = "decode"
    swa_eviction_interval: int = 1
    swa_tree: str = "swa_radix"
    hicache_host_tier: str = "hiradix"
    prefetch_refill: str = "drop"
    unified_free: str = "segment"
    unified_split_recency: str = "beside"
    unified_tombstone_lock: str = "count"

    def __post_init__(self) -> None:
        check_field_types(self)
        for name, value, allowed in (
            ("row_order", self.row_order, ROW_ORDERS),
            ("unaligned_paged_alloc", self.unaligned_paged_alloc, UNALIGNED_ALLOC),
            ("generation_on_clear", self.generation_on_clear, GENERATION_ON_CLEAR),
            ("release_order", self.release_order, RELEASE_ORDERS),
            ("eviction_demand", self.eviction_demand, EVICTION_DEMANDS),
            ("eviction_amount", self.eviction_amount, EVICTION_AMOUNTS),
            ("tree_free", self.tree_free, TREE_FREES),
            ("hit_count", self.hit_count, HIT_COUNTS),
            ("release_path", self.release_path, RELEASE_PATHS),
            ("release_upto", self.release_upto, RELEASE_UPTOS),
            ("mamba_slot_shortage", self.mamba_slot_shortage, MAMBA_SLOT_SHORTAGES),
            ("mamba_tree", self.mamba_tree, MAMBA_TREES),
            ("swa_free_resolve", self.swa_free_resolve, SWA_FREE_RESOLVES),
            ("swa_free_unmapped", self.swa_free_unmapped, SWA_FREE_UNMAPPED),
            ("swa_window_release", self.swa_window_release, SWA_WINDOW_RELEASES),
            ("swa_tree", self.swa_tree, SWA_TREES),
            ("hicache_host_tier", self.hicache_host_tier, HICACHE_HOST_TIERS),
            ("prefetch_refill", self.prefetch_refill, PREFETCH_REFILLS),
            ("unified_free", self.unified_free, UNIFIED_FREES),
            ("unified_split_recency", self.unified_split_recency, UNIFIED_SPLIT_RECENCIES),
            ("unified_tombstone_lock", self.unified_tombstone_lock, UNIFIED_TOMBSTONE_LOCKS),
        ):
            if value not in allowed:
                raise ConfigError(f"Rules.{name} must be one of {allowed}, got {value!r}")
        interval = self.swa_eviction_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f"Rules.swa_eviction_interval must be an int >= 1, got {interval!r}")
        if self.swa_window_release == "maybe_evict" and interval != 1:
            # 0.5.16's cadence is its scheduler's batch-wide forward counter, not the cursor
            raise ConfigError(
                f"Rules.swa_window_release 'maybe_evict' slides at every step: "
                f"swa_eviction_interval must be 1, got {interval}"
            )

    @classmethod
    def for_sglang(cls, version: str) -> Rules:
        """The rules of SGLang release ``version`` (one of :data:`SGLANG_RELEASES`; a later
        0.5.x patch takes the newest preset at or below it). ConfigError for an unknown one."""
        parts = _version_tuple(version)
        known = [v for v in SGLANG_RELEASES if _version_tuple(v) <= parts]
        if parts[:2] != (0, 5) or not known:
            raise ConfigError(f"no rules preset for SGLang {version!r}; known: {SGLANG_RELEASES}")
        lenient = cls(
            swa_decode_refusal_clean=False,
            refused_alloc_unchanged=False,
            unaligned_paged_alloc="floor",
            rejects_misuse=False,
            eviction_demand="bound",
            mamba_slot_shortage="assert",
            release_upto="committed",
        )
        if parts < (0, 5, 18):
            return replace(
                lenient,
                row_order="fifo",
                generation_on_clear="reset",
                eviction_amount="demand",
                swa_free_resolve="group_end",
                swa_restore_mapping=False,
                swa_window_release="maybe_evict",
                swa_tree="unified",
                mamba_tree="unified",
                unified_free="free",
                unified_split_recency="front",
                unified_tombstone_lock="skip",
                prefetch_refill="attach",
            )
        # Rows pop from the tail from 0.5.18 on; the monotonic generation, the staged pages and
        # the shortfall eviction are 0.5.23's (audited releases only: specs/fidelity.md).
        if _version_tuple(known[-1]) < (0, 5, 23):
            return replace(
                lenient, row_order="lifo", generation_on_clear="reset", eviction_amount="demand"
            )
        return replace(
            lenient,
            row_order="lifo",
            release_order="append",
            tree_free="segment",
            prefetch_refill="refill",
            hit_count="inserted_len",
            release_path="checkpoint",
            release_upto="owned",
            mamba_tree="unified",
            swa_free_unmapped="caller",
            swa_window_release="scheduler",
            swa_eviction_interval=128,
            hicache_host_tier="unified",
        )


UNIFIED_SERVER_FROM = "0.5.23"
"""The first audited SGLang release whose server builds the ``UnifiedRadixCache`` for an
ordinary model (specs/unified_cache.md); the releases before it build the legacy
``RadixCache``."""


def server_builds_unified_tree(version: str) -> bool:
    """Whether SGLang ``version``'s server builds the ``UnifiedRadixCache`` for an ordinary model
    (from :data:`UNIFIED_SERVER_FROM` on). ConfigError for a release :meth:`Rules.for_sglang`
    has no preset for."""
    Rules.for_sglang(version)
    return _version_tuple(version) >= _version_tuple(UNIFIED_SERVER_FROM)


def _version_tuple(version: str) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in version.split(".")[:3])
    except ValueError:
        raise ConfigError(f"not a release number: {version!r}") from None


__all__ = ["SGLANG_RELEASES", "UNIFIED_SERVER_FROM", "Rules", "server_builds_unified_tree"]
