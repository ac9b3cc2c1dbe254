"""The pools of one memory manager and the SGLang-named lifecycle primitives.

:class:`LifecyclePrimitives` builds the pools from a :class:`~kvpool.config.PoolConfig` and
offers :meth:`~LifecyclePrimitives.alloc_req_slots`, :meth:`~LifecyclePrimitives.alloc_for_extend`,
:meth:`~LifecyclePrimitives.alloc_for_decode` and :meth:`~LifecyclePrimitives.release_kv_cache`,
plus the capacity rule every allocation follows. ``MemoryManager`` (memory_manager.py) adds the
request-level API on top. Units: tokens for lengths, rows, slots.

Capacity rule: rows are checked before anything; tokens are needed as new tokens (page size 1) or
``new pages * page_size``; if ``available + evictable < needed`` raise OutOfMemoryError having
changed nothing, else evict exactly ``needed - available`` (whole nodes: may free more) and
allocate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvpool.config import PoolConfig
from kvpool.constants import NO_LAST_LOC, ceil_align
from kvpool.errors import (
    ContextOverflowError,
    InvalidArgumentError,
    KVPoolError,
    OutOfMemoryError,
    RequestStateError,
    UnknownRequestError,
)
from kvpool.host_checks import (
    as_bool,
    as_instance,
    as_int,
    as_str,
    count_list,
    instance_list,
    str_list,
)
from kvpool.injection import check_shared, resolve
from kvpool.reference.hicache.hiradix_cache import HiRadixCache
from kvpool.reference.hicache.memory_pool_host import host_pool_for
from kvpool.reference.kv.kv_cache import KVCache
from kvpool.reference.kv.layer_transfer import LayerDoneCounter
from kvpool.reference.kv.storage import kv_cache_from_config
from kvpool.reference.lifecycle.mamba_hooks import (
    check_hybrid_config,
    hybrid_pool,
    mamba_hooks_for,
    mamba_lifecycle_tree,
)
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.lifecycle.stops import owned_len
from kvpool.reference.mamba.radix_release import MambaLifecycleCache
from kvpool.reference.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.reference.pools.allocator_choice import allocator_for
from kvpool.reference.pools.paged_ops import decode_new_pages, eviction_target, extend_new_pages
from kvpool.reference.pools.req_to_token_pool import ReqToTokenPool
from kvpool.reference.radix.chunk_cache import ChunkCache
from kvpool.reference.radix.radix_cache import RadixCache
from kvpool.reference.req import Req
from kvpool.rules import Rules
from kvpool.tags import kv_tags


def build_hiradix_tree(
    config: PoolConfig,
    pool: ReqToTokenPool,
    alloc: BaseTokenToKVPoolAllocator,
    kv_cache: KVCache,
    clock: Callable[[], float] | None,
) -> HiRadixCache:
    """The manager's ``HiRadixCache``: a host pool of ``hicache_ratio`` times ``kv_cache`` (the
    manager's KV buffers, so transfers copy what the lifecycle computed) and the config's write
    policy and thresholds; the host tier ``Rules.hicache_host_tier`` names (the unified one:
    the checkpoint's inserts free the request's duplicates themselves)."""
    host = host_pool_for(kv_cache, config.hicache_ratio)
    rules = config.rules
    return HiRadixCache(pool, alloc, config.page_size, host, False, config.eviction_policy,
                        clock, config.hicache_write_policy, config.hicache_load_back_threshold,
                        config.hicache_prefetch_threshold, config.hicache_storage,
                        rules=rules, is_eagle=config.is_eagle)  # fmt: skip


class LifecyclePrimitives:
    """The pools (``req_to_token_pool``, ``token_to_kv_pool_allocator``, ``tree_cache``,
    ``kv_cache``), the request and session tables, and the SGLang-named primitives."""

    def __init__(
        self,
        config: PoolConfig,
        clock: Callable[[], float] | None = None,
        *,
        req_to_token_pool: object = None,
        token_to_kv_pool_allocator: object = None,
        tree_cache: object = None,
        kv_cache: object = None,
    ) -> None:
        """Each component may be injected (see :mod:`kvpool.injection`): an object, a factory
        (``(config)``; the tree cache's ``(config, req_to_token_pool, allocator)``) or None for
        the reference's own."""
        self.config = config
        ps = self.page_size = config.page_size
        rules = config.rules
        check_hybrid_config(config)
        self.req_to_token_pool: ReqToTokenPool = resolve(
            "req_to_token_pool",
            req_to_token_pool,
            lambda: (
                ReqToTokenPool(config.req_pool_size, config.max_context_len, rules=rules)
                if config.mamba_slots is None
                else hybrid_pool(config)
            ),
            config,
        )
        self.token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator = resolve(
            "token_to_kv_pool_allocator",
            token_to_kv_pool_allocator,
            lambda: allocator_for(config.size, ps, config.need_sort, rules=rules),
            config,
        )
        pool, alloc = self.req_to_token_pool, self.token_to_kv_pool_allocator
        # the KV buffers first: a host tier's pool backs them
        self.kv_cache: KVCache = resolve(
            "kv_cache", kv_cache, lambda: kv_cache_from_config(config), config
        )
        # A hybrid model with the radix cache on gets a MambaLifecycleCache, which offers the
        # same lifecycle calls (its own snapshot and eviction results are handled where read).
        self.tree_cache: RadixCache | ChunkCache = resolve(
            "tree_cache",
            tree_cache,
            lambda: (
                ChunkCache(pool, alloc, ps, config.eviction_policy, rules=rules)
                if config.disable_radix_cache
                else build_hiradix_tree(config, pool, alloc, self.kv_cache, clock)
                if config.enable_hierarchical_cache
                else RadixCache(
                    pool,
                    alloc,
                    ps,
                    False,
                    config.eviction_policy,
                    clock,
                    rules=rules,
                    is_eagle=config.is_eagle,
                )
                if config.mamba_slots is None
                else mamba_lifecycle_tree(config, pool, alloc)
            ),
            config,
            pool,
            alloc,
        )
        check_shared(self.tree_cache, pool, alloc)
        self.layer_done_counter: LayerDoneCounter | None = None
        """``config.layerwise_loading``: the counter registered on ``kv_cache`` (a read of a
        layer waits for the load in progress to complete it); None otherwise."""
        if config.layerwise_loading:
            counter = LayerDoneCounter(config.num_layers)
            self.layer_done_counter = counter
            self.kv_cache.register_layer_transfer_counter(counter)
        self.mamba_hooks = mamba_hooks_for(self.req_to_token_pool)
        """Hybrid (Mamba) models' work on every lifecycle path (None for other models)."""
        if self.mamba_hooks is not None and isinstance(self.tree_cache, MambaLifecycleCache):
            self.mamba_hooks.tree = self.tree_cache
        self.capacity_refusals = 0
        """Allocations the allocator refused after the capacity check admitted them."""
        self.reqs: dict[str, Req] = {}
        self.sessions: dict[str, SessionSlot] = {}

    # ----------------------------------------------------------------- lookups
    def get_req(self, rid: str, *states: str) -> Req:
        """The request ``rid``; UnknownRequestError if unknown, RequestStateError if its state is
        not one of ``states`` (any state when none given)."""
        req = self.reqs.get(as_str("rid", rid))
        if req is None:
            raise UnknownRequestError(f"unknown request {rid!r}")
        if states and req.state not in states:
            raise RequestStateError(f"request {rid!r} is {req.state}, expected {'/'.join(states)}")
        return req

    def _batch(self, rids: Sequence[str], *states: str) -> list[Req]:
        """The requests ``rids`` names (a sequence of distinct ids), each in one of ``states``."""
        rids = str_list("rids", rids)
        if len(set(rids)) != len(rids):
            raise InvalidArgumentError(f"a batch names a request twice: {list(rids)}")
        return [self.get_req(rid, *states) for rid in rids]

    def _running_full(self, rids: Sequence[str]) -> list[Req]:
        """Running requests whose prompt is fully prefilled (decode / speculative / finish)."""
        reqs = self._batch(rids, "running")
        chunked = [r.rid for r in reqs if r.is_chunked]
        if chunked:
            raise RequestStateError(f"requests {chunked} are between prefill chunks")
        return reqs

    def _restoring_session(self, req: Req) -> SessionSlot | None:
        """The session whose KV ``req``'s first extend restores, if any."""
        if req.session_id is None or req.state != "waiting":
            return None
        session = self.sessions.get(req.session_id)
        return session if session is not None and session.holds_kv() else None

    # ----------------------------------------------------------------- capacity
    def _tokens_needed(self, prefix_lens: Sequence[int], seq_lens: Sequence[int]) -> int:
        """Slots to take from the allocator for columns ``[P_i, S_i)``, in tokens."""
        if self.page_size == 1:
            return sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
        pages = sum(
            extend_new_pages(p, s, self.page_size)
            for p, s in zip(prefix_lens, seq_lens, strict=True)
        )
        return pages * self.page_size

    def _check_capacity(self, needed: int) -> None:
        """OutOfMemoryError unless ``available + evictable >= needed`` (tokens)."""
        available = self.token_to_kv_pool_allocator.available_size()
        evictable = self.tree_cache.evictable_size()
        if available + evictable < needed:
            raise OutOfMemoryError(
                f"need {needed} tokens; available {available}, evictable {evictable}"
            )

    def _evict_for_alloc(self, prefix_lens: list[int], seq_lens: list[int]) -> None:
        """The eviction :meth:`_alloc_slots` makes for columns ``[P_i, S_i)`` (the rules'
        demand for an extend of this batch)."""
        new_tokens = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
        self._evict_for(self._tokens_needed(prefix_lens, seq_lens), new_tokens, len(seq_lens))

    def _evict_for(self, needed: int, new_tokens: int = 0, batch_size: int = 0) -> None:
        """Check capacity for ``needed`` tokens, then evict what ``config.rules`` asks for
        (:func:`~kvpool.reference.pools.paged_ops.eviction_target`: by default exactly the
        shortfall); nothing changes on failure. ``new_tokens`` / ``batch_size`` describe the
        step for SGLang's eviction bound (``batch_size`` 0: no bound, e.g. speculative)."""
        self._check_capacity(needed)
        available = self.token_to_kv_pool_allocator.available_size()
        rules = self.config.rules if batch_size else Rules()
        amount = eviction_target(rules, needed, new_tokens, batch_size, self.page_size, available)
        if amount > 0:
            self.tree_cache.evict(amount)

    def _alloc_slots(
        self,
        prefix_lens: list[int],
        seq_lens: list[int],
        last_locs: list[int],
        evict: bool = True,
    ) -> list[int]:
        """Slots for columns ``[P_i, S_i)`` of every request (batch order), evicting first
        (unless ``evict`` is False: the caller evicted already, see :meth:`_evict_for_alloc`);
        OutOfMemoryError (nothing changed) when they cannot be had."""
        if evict:
            self._evict_for_alloc(prefix_lens, seq_lens)
        alloc = self.token_to_kv_pool_allocator
        if self.page_size == 1:
            out = alloc.alloc(sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True)))
        else:
            total = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
            out = alloc.alloc_extend(prefix_lens, prefix_lens, seq_lens, seq_lens, last_locs, total)
        if out is None:  # only a candidate allocator that ignores capacity gets here
            self.capacity_refusals += 1
            raise OutOfMemoryError("allocator refused after eviction")
        return out

    def _last_loc(self, req: Req, col: int) -> int:
        """Slot of column ``col - 1`` of the request's row (or its prefix), -1 when ``col == 0``."""
        if col == 0:
            return NO_LAST_LOC
        if req.req_pool_idx is not None and col <= req.kv_allocated_len:
            return self.req_to_token_pool.read(req.req_pool_idx, col - 1, col)[0]
        return req.prefix_indices[col - 1]

    def _check_write(self, req: object, start: object, stop: object) -> tuple[int, int]:
        """The checks :meth:`write_kv` makes before writing: ``req`` a request holding a row,
        ``0 <= start <= stop <= min(kv_allocated_len, len(tokens))``. Returns (start, stop)."""
        req = as_instance("req", req, Req)
        a, b = as_int("start", start), as_int("stop", stop)
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        limit = min(req.kv_allocated_len, req.seq_len())
        if not 0 <= a <= b <= limit:
            raise InvalidArgumentError(
                f"request {req.rid!r}: need 0 <= start <= stop <= {limit}, got start={a}, stop={b}"
            )
        if self.mamba_hooks is not None:  # the state moves forward only (MambaHooks.after_write)
            self.mamba_hooks._check_stop(req, b)
        return a, b

    # ----------------------------------------------------------------- primitives
    def alloc_req_slots(self, reqs: Sequence[Req]) -> list[int]:
        """Rows for the batch (reusing rows legally kept); OutOfMemoryError if too few are free."""
        rows = self.req_to_token_pool.alloc(instance_list("reqs", reqs, Req))
        if rows is None:
            raise OutOfMemoryError(f"need rows; {self.req_to_token_pool.available_size()} free")
        return rows

    def _check_extend(
        self, reqs: Sequence[Req], seq_lens: Sequence[int]
    ) -> tuple[list[int], list[int]]:
        """The checks :meth:`alloc_for_extend` makes before any change, but capacity: row
        misuse, lengths, ``max_context_len``, free rows. Returns ``(prefix_lens, seq_lens)``."""
        reqs = instance_list("reqs", reqs, Req)
        seqs = count_list("seq_lens", seq_lens)
        fresh = self.req_to_token_pool.check_alloc(reqs)
        prefix_lens = [len(r.prefix_indices) for r in reqs]
        if len(seqs) != len(reqs) or any(s < p for p, s in zip(prefix_lens, seqs, strict=True)):
            raise InvalidArgumentError(f"need one seq_len >= prefix_len per request, got {seqs}")
        if any(s > self.config.max_context_len for s in seqs):
            raise ContextOverflowError(f"seq_lens {seqs} past max_context_len")
        if fresh > self.req_to_token_pool.available_size():
            raise OutOfMemoryError(f"need {fresh} rows; {self.req_to_token_pool.available_size()}")
        return prefix_lens, seqs

    def _check_decode(self, reqs: Sequence[Req]) -> tuple[list[int], int]:
        """The checks :meth:`alloc_for_decode` makes before any change, but capacity: every
        request holds a row and stays within ``max_context_len``. Returns each request's new
        column and the tokens the step needs (new pages times the page size)."""
        reqs = instance_list("reqs", reqs, Req)
        rowless = [r.rid for r in reqs if r.req_pool_idx is None]
        if rowless:
            raise InvalidArgumentError(f"requests {rowless} hold no row")
        cols = [r.kv_allocated_len for r in reqs]
        over = [
            r.rid for r, c in zip(reqs, cols, strict=True) if c + 1 > self.config.max_context_len
        ]
        if over:
            raise ContextOverflowError(f"requests {over} would pass max_context_len")
        seq_lens = [c + 1 for c in cols]
        ps = self.page_size
        return cols, len(reqs) if ps == 1 else decode_new_pages(seq_lens, ps) * ps

    def _rows_first(self, reqs: Sequence[Req]) -> list[int] | None:
        """With a Mamba tree whose hooks take the slots before the KV
        (:attr:`~kvpool.reference.lifecycle.mamba_hooks.MambaHooks.slots_before_kv`, SGLang
        0.5.16's unified tree): the admission eviction and the rows now; else None (after)."""
        hooks = self.mamba_hooks
        if hooks is None or not hooks.slots_before_kv:
            return None
        hooks.evict_for_admission(reqs)
        return self.alloc_req_slots(reqs)

    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> list[int]:
        """Rows, then slots for ``[len(prefix_indices), seq_len)`` of each request (evicting
        first), then ``row[:seq] = prefix_indices + new``; ``kv_allocated_len = seq_len``.
        Returns the new slots in batch order. Every check comes before any change: row misuse
        (see ``ReqToTokenPool.check_alloc``), ``len(seq_lens) != len(reqs)`` or a ``seq_len``
        shorter than the prefix (InvalidArgumentError), a ``seq_len`` past ``max_context_len``
        (ContextOverflowError), too few rows or slots (OutOfMemoryError)."""
        prefix_lens, seqs = self._check_extend(reqs, seq_lens)
        hooks = self.mamba_hooks
        if hooks is not None:
            hooks.check_admission(reqs)
        # SGLang 0.5.16 with its unified Mamba tree: alloc_req_slots (states evicted to the
        # headroom, rows and Mamba slots) runs before the KV, whose eviction frees states too
        rows = self._rows_first(reqs)
        last_locs = [self._last_loc(r, p) for r, p in zip(reqs, prefix_lens, strict=True)]
        out = self._alloc_slots(prefix_lens, seqs, last_locs)
        if rows is None:
            if hooks is not None:
                hooks.evict_for_admission(reqs)
            rows = self.alloc_req_slots(reqs)
        if self.mamba_hooks is not None:
            self.mamba_hooks.after_admission(reqs)
        pos = 0
        for req, row, p, s in zip(reqs, rows, prefix_lens, seqs, strict=True):
            new = out[pos : pos + s - p]
            pos += s - p
            self.req_to_token_pool.write((row, slice(0, p)), req.prefix_indices)
            self.req_to_token_pool.write((row, slice(p, s)), new)
            req.kv_allocated_len = s
        return out

    def alloc_for_decode(self, reqs: Sequence[Req]) -> list[int]:
        """One slot per request for column ``kv_allocated_len`` (evicting first), written into
        the row; ``kv_allocated_len += 1``. Every check comes before any change: a request
        without a row (InvalidArgumentError), a column past ``max_context_len``
        (ContextOverflowError), too few slots (OutOfMemoryError)."""
        cols, needed = self._check_decode(reqs)
        seq_lens = [c + 1 for c in cols]
        self._evict_for(needed, 0, len(reqs))
        alloc = self.token_to_kv_pool_allocator
        if self.page_size == 1:
            out = alloc.alloc(len(reqs))
        else:
            last = [self._last_loc(r, c) for r, c in zip(reqs, cols, strict=True)]
            out = alloc.alloc_decode(seq_lens, seq_lens, last)
        if out is None:  # only a candidate allocator that ignores capacity gets here
            self.capacity_refusals += 1
            raise OutOfMemoryError("allocator refused after eviction")
        for req, col, slot in zip(reqs, cols, out, strict=True):
            assert req.req_pool_idx is not None
            self.req_to_token_pool.write((req.req_pool_idx, slice(col, col + 1)), [slot])
            req.kv_allocated_len = col + 1
        return out

    def _owned_len(self, req: Req) -> int:
        """The tokens of ``req`` that are its to keep (:func:`owned_len`)."""
        return owned_len(req)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """``cache_finished_req``; free the over-allocation ``[ceil_align(committed),
        allocated)`` (``free``, or ``free_segment`` under ``rules.release_path ==
        "checkpoint"``: SGLang 0.5.23's ``free_kv_row``); free the row; forget the request's
        pool fields. InvalidArgumentError (nothing changed) for a request without a row.

        A request that stopped before its last committed token (``finished_len``) releases up
        to :meth:`_owned_len` under ``rules.release_upto == "owned"`` (its committed length
        drops there first: the overshoot is freed with the over-allocation; a hybrid model's
        request then caches nothing, its state being past the stop), or every committed token
        under ``"committed"`` (SGLang 0.5.16)."""
        req = as_instance("req", req, Req)
        is_insert = as_bool("is_insert", is_insert)
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        row = req.req_pool_idx
        committed = req.kv_committed_len
        if self.config.rules.release_upto == "owned":
            req.kv_committed_len = self._owned_len(req)
            # a hybrid model's state holds every committed token: a key cut at the stop has
            # no state to go with it, so nothing is cached (SGLang 0.5.23's
            # skip_radix_cache_insert without track buffers)
            if self.mamba_hooks is not None and req.kv_committed_len < committed:
                is_insert = False
        try:
            self.tree_cache.cache_finished_req(req, is_insert)
        except KVPoolError:  # refused before any change: the request is as it was
            req.kv_committed_len = committed
            raise
        start = ceil_align(req.kv_committed_len, self.page_size)
        if req.kv_allocated_len > start:
            over = self.req_to_token_pool.read(row, start, req.kv_allocated_len)
            if self.config.rules.release_path == "checkpoint":
                self.token_to_kv_pool_allocator.free_segment(over, start)
            else:
                self.token_to_kv_pool_allocator.free(over)
        if self.mamba_hooks is not None:
            self.mamba_hooks.before_release(req)
        self.req_to_token_pool.free(req)
        req.reset_kv_fields()

    def write_kv(self, req: Req, start: int, stop: int) -> None:
        """Compute (write the tags of) tokens ``[start, stop)`` of ``req`` into their slots.
        InvalidArgumentError (nothing changed) unless ``req`` holds a row and ``0 <= start <=
        stop <= min(kv_allocated_len, len(tokens))`` (tokens)."""
        self._check_write(req, start, stop)
        assert req.req_pool_idx is not None
        slots = self.req_to_token_pool.read(req.req_pool_idx, start, stop)
        tags = kv_tags(req.all_token_ids[:stop], req.extra_key)[start:stop]
        self.kv_cache.write_tags(slots, tags)
        if self.mamba_hooks is not None:
            self.mamba_hooks.after_write(req, stop)


__all__ = ["LifecyclePrimitives", "build_hiradix_tree"]
