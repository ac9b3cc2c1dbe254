"""The pools of one optimized memory manager and the SGLang-named lifecycle primitives.

Mirrors :mod:`kvpool.reference.lifecycle.primitives`: :class:`LifecyclePrimitives` builds the
torch pools from a :class:`~kvpool.config.PoolConfig` and offers ``alloc_req_slots``,
``alloc_for_extend``, ``alloc_for_decode`` and ``release_kv_cache`` with the same capacity rule
(rows first; ``available + evictable >= needed`` else OutOfMemoryError with nothing changed; then
evict exactly the shortfall). Slots come from the allocator's vectorised ``alloc_extend`` /
``alloc_decode``; KV tags continue each request's running hash (:meth:`Req.kv_tags_upto`).
Every primitive works per batch: ``last_loc``, row writes, slot reads and KV-tag writes are a
fixed number of tensor operations whatever the batch size, planned from host-side lengths, with
no device read (:mod:`kvpool.optimized.lifecycle.batch_table`). Results are int64 slot tensors.
Units: tokens for lengths, rows, slots.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

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
    as_str,
    count_list,
    instance_list,
    str_list,
    token_list,
)
from kvpool.injection import check_shared, resolve
from kvpool.kernels.host import to_device
from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
from kvpool.optimized.hicache.memory_pool_host import host_pool_for
from kvpool.optimized.index_args import host_ints, index_tensor
from kvpool.optimized.kv.kv_cache import KVCache
from kvpool.optimized.kv.layer_transfer import LayerDoneCounter
from kvpool.optimized.kv.storage import kv_cache_from_config
from kvpool.optimized.lifecycle.batch_table import (
    device_ints,
    gather_columns,
    last_locs,
    read_held_rows,
    rows_of,
    scatter_columns,
    write_rows,
)
from kvpool.optimized.lifecycle.mamba_hooks import (
    hybrid_pool,
    mamba_hooks_for,
    mamba_lifecycle_tree,
)
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.mamba.radix_release import MambaLifecycleCache
from kvpool.optimized.options import TwinOptions, edge_options
from kvpool.optimized.pools.allocator import BaseTokenToKVPoolAllocator
from kvpool.optimized.pools.allocator_choice import allocator_for
from kvpool.optimized.pools.req_to_token_pool import ReqToTokenPool
from kvpool.optimized.radix.chunk_cache import ChunkCache
from kvpool.optimized.radix.radix_cache import RadixCache
from kvpool.optimized.req import Req
from kvpool.reference.lifecycle.mamba_hooks import check_hybrid_config
from kvpool.reference.lifecycle.stops import owned_len
from kvpool.reference.pools.paged_ops import decode_new_pages, eviction_target
from kvpool.rules import Rules


def build_hiradix_tree(
    config: PoolConfig,
    pool: ReqToTokenPool,
    alloc: BaseTokenToKVPoolAllocator,
    kv_cache: KVCache,
    clock: Callable[[], float] | None,
    options: TwinOptions | None = None,
) -> HiRadixCache:
    """The manager's ``HiRadixCache``: a host pool of ``hicache_ratio`` times ``kv_cache`` (the
    manager's KV buffers, so transfers copy what the lifecycle computed) and the config's write
    policy and thresholds; the host tier ``Rules.hicache_host_tier`` names (see the
    reference); ``options``: the manager's."""
    host = host_pool_for(kv_cache, config.hicache_ratio)
    rules = config.rules
    return HiRadixCache(pool, alloc, config.page_size, host, False, config.eviction_policy,
                        clock, config.hicache_write_policy, config.hicache_load_back_threshold,
                        config.hicache_prefetch_threshold, config.hicache_storage,
                        rules=rules, options=options, is_eagle=config.is_eagle)  # fmt: skip


def as_token_list(input_ids: Sequence[int], name: str = "input_ids") -> list[int]:
    """Token ids as a list of ints (a 1-D integer tensor or array is read to the host after
    its dtype and shape are checked); InvalidArgumentError naming ``name`` for anything that is
    not a 1-D sequence of vocabulary ids (a float, bool or 2-D tensor included), before any
    change."""
    return token_list(name, host_ints(name, input_ids))


class LifecyclePrimitives:
    """The pools (``req_to_token_pool``, ``token_to_kv_pool_allocator``, ``tree_cache``,
    ``kv_cache``), the request and session tables, and the SGLang-named primitives.
    A public edge of the twin (:mod:`kvpool.optimized.options`): ``options``
    (:class:`~kvpool.optimized.options.TwinOptions`), or the user-facing shorthand ``device`` /
    ``checked`` / ``kernel_backend`` (not both: ConfigError), are built into one options value
    here and handed down unchanged (``options=``) to every component it builds: one device, one
    checked mode, one kernel backend for the whole twin."""

    def __init__(
        self,
        config: PoolConfig,
        clock: Callable[[], float] | None = None,
        device: str | torch.device | None = None,
        checked: bool | None = None,
        kernel_backend: str | None = None,
        *,
        req_to_token_pool: object = None,
        token_to_kv_pool_allocator: object = None,
        tree_cache: object = None,
        kv_cache: object = None,
        options: TwinOptions | None = None,
    ) -> None:
        """Each component may be injected (see :mod:`kvpool.injection`): an object, a factory
        (``(config)``; the tree cache's ``(config, req_to_token_pool, allocator)``) or None for
        the twin's own."""
        self.config = config
        self.options = opts = edge_options(options, device, checked, kernel_backend)
        self.device = dev = opts.device
        ps = self.page_size = config.page_size
        check_hybrid_config(config)
        self.req_to_token_pool: ReqToTokenPool = resolve(
            "req_to_token_pool",
            req_to_token_pool,
            lambda: (
                ReqToTokenPool(
                    config.req_pool_size, config.max_context_len, rules=config.rules, options=opts
                )
                if config.mamba_slots is None
                else hybrid_pool(config, opts)
            ),
            config,
        )
        self.token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator = resolve(
            "token_to_kv_pool_allocator",
            token_to_kv_pool_allocator,
            lambda: allocator_for(
                config.size, config.page_size, config.need_sort, rules=config.rules, options=opts
            ),
            config,
        )
        pool, alloc = self.req_to_token_pool, self.token_to_kv_pool_allocator
        # the KV buffers first: a host tier's pool backs them
        self.kv_cache: KVCache = resolve(
            "kv_cache", kv_cache, lambda: kv_cache_from_config(config, opts), config
        )
        # A hybrid model with the radix cache on gets a MambaLifecycleCache, which offers the
        # same lifecycle calls (its own snapshot and eviction results are handled where read).
        self.tree_cache: RadixCache | ChunkCache = resolve(
            "tree_cache",
            tree_cache,
            lambda: (
                ChunkCache(
                    pool, alloc, ps, config.eviction_policy, rules=config.rules, options=opts
                )
                if config.disable_radix_cache
                else build_hiradix_tree(config, pool, alloc, self.kv_cache, clock, opts)
                if config.enable_hierarchical_cache
                else RadixCache(
                    pool,
                    alloc,
                    ps,
                    False,
                    config.eviction_policy,
                    clock,
                    rules=config.rules,
                    options=opts,
                    is_eagle=config.is_eagle,
                )
                if config.mamba_slots is None
                else mamba_lifecycle_tree(config, pool, alloc, options=opts)
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
            counter = LayerDoneCounter(config.num_layers, timeout=config.layer_wait_s)
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
        self._empty = torch.empty(0, dtype=torch.int64, device=dev)
        self._no_last_loc = torch.full((1,), NO_LAST_LOC, dtype=torch.int64, device=dev)
        self._rows_read: dict[str, tuple[int, int, torch.Tensor]] = {}
        # checked mode on the CPU hands the allocators the CPU length tensors as their host
        # copies too (viewed, where lists are checked value by value); unchecked: lists
        self._host_lens = opts.checked and dev.type == "cpu"
        self.kernel_backend = opts.backend
        """Backend of the kernels the lifecycle runs on the table (``None``: the default); the
        options' one, as every component's."""

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
        ps = self.page_size  # extend_new_pages inline: ceil(S / ps) - ceil(P / ps) per request
        pages = sum(-(-s // ps) + p // -ps for p, s in zip(prefix_lens, seq_lens, strict=True))
        return pages * ps

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
        rules = self.config.rules if batch_size else _DEFAULT_RULES
        amount = eviction_target(rules, needed, new_tokens, batch_size, self.page_size, available)
        if amount > 0:
            self.tree_cache.evict(amount)

    def _alloc_slots(
        self,
        prefix_lens: list[int],
        seq_lens: list[int],
        last_loc: torch.Tensor,
        evict: bool = True,
    ) -> torch.Tensor:
        """Slots for columns ``[P_i, S_i)`` of every request (batch order), evicting first
        (unless ``evict`` is False: the caller evicted already, see :meth:`_evict_for_alloc`);
        OutOfMemoryError (nothing changed) when they cannot be had. ``last_loc``: int64 on the
        device, the slot of column ``P_i - 1`` (-1 for 0; unused at page size 1)."""
        if evict:
            self._evict_for_alloc(prefix_lens, seq_lens)
        alloc = self.token_to_kv_pool_allocator
        total = sum(s - p for p, s in zip(prefix_lens, seq_lens, strict=True))
        if self.page_size == 1:
            out = alloc.alloc(total)
        else:
            # one host-to-device copy; checked on the CPU each row is its own host copy (itself)
            p_dev, s_dev = device_ints([prefix_lens, seq_lens], self.device)
            p_cpu, s_cpu = (p_dev, s_dev) if self._host_lens else (prefix_lens, seq_lens)
            out = alloc.alloc_extend(p_dev, p_cpu, s_dev, s_cpu, last_loc, total)
        if out is None:  # only a candidate allocator that ignores capacity gets here
            self.capacity_refusals += 1
            raise OutOfMemoryError("allocator refused after eviction")
        return out

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
        seqs = count_list("seq_lens", host_ints("seq_lens", seq_lens))
        fresh = self.req_to_token_pool.check_alloc(reqs)
        prefix_lens = [r._prefix_len() for r in reqs]
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
        """The admission eviction and the rows now when the Mamba hooks take the slots before
        the KV (SGLang 0.5.16's unified tree), else None (after the KV)."""
        hooks = self.mamba_hooks
        if hooks is None or not hooks.slots_before_kv:
            return None
        hooks.evict_for_admission(reqs)
        return self.alloc_req_slots(reqs)

    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
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
        # SGLang 0.5.16 with its unified Mamba tree: alloc_req_slots before the KV
        rows = self._rows_first(reqs)
        out = self._alloc_slots(prefix_lens, seqs, self._prefix_last_locs(reqs))
        if rows is None:
            if hooks is not None:
                hooks.evict_for_admission(reqs)
            rows = self.alloc_req_slots(reqs)
        if self.mamba_hooks is not None:
            self.mamba_hooks.after_admission(reqs)
        prefixes = [r.prefix_indices for r in reqs]
        pool, backend, checked = self.req_to_token_pool, self.kernel_backend, self.options.checked
        write_rows(pool, rows, prefixes, prefix_lens, seqs, out, backend, checked)
        for req, s in zip(reqs, seqs, strict=True):
            req.kv_allocated_len = s
        return out

    def alloc_for_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """One slot per request for column ``kv_allocated_len`` (evicting first), written into
        the row; ``kv_allocated_len += 1``. Every check comes before any change: a request
        without a row (InvalidArgumentError), a column past ``max_context_len``
        (ContextOverflowError), too few slots (OutOfMemoryError)."""
        cols, needed = self._check_decode(reqs)
        seq_lens = [c + 1 for c in cols]
        ps = self.page_size
        self._evict_for(needed, 0, len(reqs))
        alloc = self.token_to_kv_pool_allocator
        if ps == 1:
            out = alloc.alloc(len(reqs))
        else:
            last = self._row_last_locs(reqs, cols)
            lens = device_ints(seq_lens, self.device)
            out = alloc.alloc_decode(lens, lens if self._host_lens else seq_lens, last)
        if out is None:  # only a candidate allocator that ignores capacity gets here
            self.capacity_refusals += 1
            raise OutOfMemoryError("allocator refused after eviction")
        rows = rows_of(reqs)
        scatter_columns(self.req_to_token_pool, rows, cols, seq_lens, out, self.options.checked)
        for req, col in zip(reqs, cols, strict=True):
            req.kv_allocated_len = col + 1
        return out

    def _owned_len(self, req: Req) -> int:
        """The tokens of ``req`` that are its to keep (:func:`owned_len`)."""
        return owned_len(req)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """``cache_finished_req``; free the over-allocation ``[ceil_align(committed),
        allocated)`` (``free``, or ``free_segment`` under ``rules.release_path ==
        "checkpoint"``: SGLang 0.5.23's ``free_kv_row``); free the row; forget the request's
        pool fields. InvalidArgumentError (nothing changed) for a request without a row. A
        request that stopped before its last committed token releases as the reference's
        (``Rules.release_upto``).

        The row ``[0, allocated)`` is read once (the view :meth:`_read_held_rows` read for the
        batch, else one gather for this request); the tree gets ``row[:committed]`` and the
        over-allocation ``row[start:allocated]``, both views of it."""
        req = as_instance("req", req, Req)
        is_insert = as_bool("is_insert", is_insert)
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        held = self._held_row(req, req.req_pool_idx)
        committed = req.kv_committed_len
        if self.config.rules.release_upto == "owned":
            req.kv_committed_len = self._owned_len(req)
            # a hybrid model's state holds every committed token: a key cut at the stop has
            # no state to go with it, so nothing is cached (SGLang 0.5.23's
            # skip_radix_cache_insert without track buffers)
            if self.mamba_hooks is not None and req.kv_committed_len < committed:
                is_insert = False
        try:
            self.tree_cache.cache_finished_req(
                req, is_insert, row_read=held[: req.kv_committed_len]
            )
        except KVPoolError:  # refused before any change: the request is as it was
            req.kv_committed_len = committed
            raise
        start = ceil_align(req.kv_committed_len, self.page_size)
        if req.kv_allocated_len > start:
            over = held[start : req.kv_allocated_len]
            if self.config.rules.release_path == "checkpoint":
                self.token_to_kv_pool_allocator.free_segment(over, start)
            else:
                self.token_to_kv_pool_allocator.free(over)
        if self.mamba_hooks is not None:
            self.mamba_hooks.before_release(req)
        self.req_to_token_pool.free(req)
        req.reset_kv_fields()

    # ----------------------------------------------------------------- batched rows
    def _prefix_last_locs(self, reqs: Sequence[Req]) -> torch.Tensor:
        """The last slot of each request's ``prefix_indices`` (-1 when empty), int64 on the
        device: one concatenation of one-element views (as SGLang builds ``last_loc``)."""
        if self.page_size == 1 or not reqs:
            return self._empty  # page size 1 never reads last_loc
        if self._host_lens:  # checked on the CPU
            # checked mode reads the host anyway: each last slot through a NumPy view
            held = [r.prefix_indices for r in reqs]
            if all(p.is_cpu for p in held):
                locs = [p.numpy()[-1] if p.numel() else NO_LAST_LOC for p in held]
                return torch.from_numpy(np.array(locs, dtype=np.int64))
        none = self._no_last_loc
        return torch.cat([r.prefix_indices[-1:] if len(r.prefix_indices) else none for r in reqs])

    def _row_last_locs(self, reqs: Sequence[Req], cols: Sequence[int]) -> torch.Tensor:
        """The slot of column ``cols[i] - 1`` of each request's row (-1 for column 0), int64 on
        the device (kvpool's ``get_last_loc``; nothing for page size 1, which never reads it)."""
        if self.page_size == 1 or not reqs:
            return self._empty
        rows = rows_of(reqs)
        return last_locs(
            self.req_to_token_pool,
            rows,
            cols,
            self.device,
            self.kernel_backend,
            self.options.checked,
        )

    def _held_row(self, req: Req, row: int) -> torch.Tensor:
        """Slots (int64) of columns ``[0, kv_allocated_len)`` of ``row``: the view
        :meth:`_read_held_rows` read for this batch when it covers exactly that range, else one
        gather of the row."""
        stop = req.kv_allocated_len
        ahead = self._rows_read.pop(req.rid, None)
        if ahead is not None and ahead[:2] == (row, stop):
            return ahead[2]
        return gather_columns(
            self.req_to_token_pool, [row], [0], [stop], self.device, self.options.checked
        )

    def _read_rows(self, reqs: Sequence[Req]) -> dict[str, torch.Tensor]:
        """``rid -> row[:kv_allocated_len]`` (int64 views of one gather for the batch): what a
        prefill batch's chunked requests hand to ``cache_unfinished_req``."""
        return {
            rid: t[2]
            for rid, t in read_held_rows(
                self.req_to_token_pool, reqs, self.device, self.options.checked
            ).items()
        }

    def _read_held_rows(self, reqs: Sequence[Req]) -> None:
        """Read every request's row in one gather for :meth:`release_kv_cache` (a finish
        batch; see :func:`~kvpool.optimized.lifecycle.batch_table.read_held_rows`)."""
        self._rows_read = read_held_rows(
            self.req_to_token_pool, reqs, self.device, self.options.checked
        )

    def _check_writes(
        self, reqs: object, starts: object, stops: object
    ) -> tuple[list[Req], list[int], list[int]]:
        """The checks :meth:`write_kv_batch` makes before writing (its docstring), on the
        host: every request holds a row, its range lies inside its allocation and tokens."""
        batch = instance_list("reqs", reqs, Req)
        a, b = host_ints("starts", starts), host_ints("stops", stops)
        if not len(batch) == len(a) == len(b):
            raise InvalidArgumentError(
                f"{len(batch)} requests, {len(a)} starts and {len(b)} stops: need one each"
            )
        for req, x, y in zip(batch, a, b, strict=True):
            if req.req_pool_idx is None:
                raise InvalidArgumentError(f"request {req.rid!r} holds no row")
            limit = min(req.kv_allocated_len, req.seq_len())
            if not 0 <= x <= y <= limit:
                raise InvalidArgumentError(
                    f"request {req.rid!r}: need 0 <= start <= stop <= {limit}, got start={x}, "
                    f"stop={y}"
                )
            if self.mamba_hooks is not None:  # the state moves forward only (after_writes)
                self.mamba_hooks._check_stop(req, y)
        return batch, a, b

    def _check_write_slots(
        self, reqs: list[Req], starts: list[int], stops: list[int], slots: object
    ) -> torch.Tensor:
        """``slots`` as an int64 index of ``sum(stops - starts)`` slots (InvalidArgumentError
        otherwise); in checked mode, equal to the rows' slots of those columns (a device
        read)."""
        if not isinstance(slots, torch.Tensor | np.ndarray):
            count_list("slots", slots)  # type: ignore[arg-type]  # a host list, checked unread
        flat = index_tensor("slots", slots, self.device)
        want = sum(y - x for x, y in zip(starts, stops, strict=True))
        if flat.numel() != want:
            raise InvalidArgumentError(f"slots holds {flat.numel()} slots; the ranges need {want}")
        if self.options.checked and want:
            rows = gather_columns(
                self.req_to_token_pool, rows_of(reqs), starts, stops, self.device, True
            )
            if not torch.equal(rows.to(torch.int64), flat):
                raise InvalidArgumentError("slots are not the rows' slots of those columns")
        return flat

    def write_kv(self, req: Req, start: int, stop: int) -> None:
        """Compute (write the tags of) tokens ``[start, stop)`` of ``req`` into their slots."""
        self.write_kv_batch([req], [start], [stop])

    def write_kv_batch(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        stops: Sequence[int],
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Compute tokens ``[starts[i], stops[i])`` of every request: one write of their tags
        into their slots (``slots``, flat in batch order, when the caller has them; else read
        from the rows in one gather). Returns the slots (int64). InvalidArgumentError (nothing
        changed) unless every request holds a row and ``0 <= starts[i] <= stops[i] <=
        min(kv_allocated_len, len(tokens))``, and ``slots`` (if given) is a 1-D integer index
        of ``sum(stops - starts)`` slots: in checked mode, exactly the rows' slots there."""
        reqs, starts, stops = self._check_writes(reqs, starts, stops)
        if slots is not None:
            slots = self._check_write_slots(reqs, starts, stops, slots)
        return self._write_kv_batch(reqs, starts, stops, slots)

    def _write_kv_batch(
        self,
        reqs: Sequence[Req],
        starts: Sequence[int],
        stops: Sequence[int],
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The writes of :meth:`write_kv_batch`, unchecked (the lifecycle's own calls, whose
        arguments it built)."""
        if slots is None:
            rows = rows_of(reqs)
            slots = gather_columns(
                self.req_to_token_pool, rows, starts, stops, self.device, self.options.checked
            )
        parts = [r.kv_tags_upto(b)[a:b] for r, a, b in zip(reqs, starts, stops, strict=True)]
        if parts and slots.numel():
            tags = np.concatenate(parts) if len(parts) > 1 else parts[0]
            self.kv_cache.write_tags(slots, to_device(tags, self.device))
        if self.mamba_hooks is not None:
            self.mamba_hooks.after_writes(reqs, stops)
        return slots


_DEFAULT_RULES = Rules()
"""The default rules (frozen: one instance serves every speculative eviction, whose checks
of its fields would otherwise run per step)."""

__all__ = ["LifecyclePrimitives", "build_hiradix_tree"]
