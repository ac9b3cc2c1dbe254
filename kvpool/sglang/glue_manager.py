"""``SGLangGlueManager``: kvpool's request lifecycle whose memory steps are SGLang's own glue.

SGLang's scheduler decides what to allocate, keep and free through the functions of
``mem_cache/allocation.py`` and ``mem_cache/common.py``; that glue is where the field's memory
bugs lived (leaks on retract, double frees of rejected drafts, stale prefixes after a chunk).
This manager is the twin's :class:`~kvpool.optimized.lifecycle.memory_manager.MemoryManager` over
SGLang 0.5.23's own allocator, ``ReqToTokenPool`` and unified radix cache, in which the memory steps
call SGLang's glue instead of kvpool's primitives, in the order SGLang's scheduler calls them:

=============================  ==========================================================
kvpool step                    SGLang's glue called
=============================  ==========================================================
``match_prefix`` (and          ``common.match_kv_cache(req, tree, tokens,
``extend``'s own match)        max_prefix_len=len - 1)``
``extend`` (admission)         ``allocation.alloc_for_extend(batch)``: ``alloc_req_slots``
                               (rows), ``alloc_token_slots`` or
                               ``alloc_paged_token_slots_extend`` (eviction through
                               ``evict_from_tree_cache``), ``write_cache_indices``
a chunk boundary               ``common.checkpoint_kv_cache(req, tree)``
``decode``                     ``allocation.alloc_for_decode(batch, 1)``:
                               ``alloc_token_slots`` or ``alloc_paged_token_slots_decode``
``spec_step`` (EAGLE v2)       ``allocation.alloc_for_spec_decode``: the reserve, rows
                               written by its ``assign_req_to_token_pool`` kernel
``finish``                     ``common.release_kv_cache(req, tree, checkpoint=True)`` inside
                               the allocator's free group (``checkpoint``, ``free_kv_row``,
                               unlock, over-allocation, row)
``abort`` / ``retract``        ``common.release_kv_cache(req, tree, checkpoint=False)``
=============================  ==========================================================

kvpool's lifecycle keeps what SGLang's scheduler decides before calling the glue: which
requests form a batch, admission (rows and tokens available, counting the evictable), the
lock on the matched node, sessions and EAGLE v1 draft borrowing (kvpool's own, over SGLang's
components). Every
check of kvpool's lifecycle runs before the glue is called, so a refused step still changes
nothing; a glue call that then fails is SGLang's failure (the harness reports it as a crash).
Requests and batches reach SGLang as :class:`~kvpool.sglang.glue.GlueReq` /
:class:`~kvpool.sglang.glue.GlueBatch`. ``glue_calls`` counts every glue function that ran
(the lifecycle machine reports them as coverage tags ``sglang:MODULE.FUNCTION``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch

from kvpool.config import PoolConfig
from kvpool.errors import InvalidArgumentError
from kvpool.optimized.lifecycle.memory_manager import MemoryManager
from kvpool.optimized.req import Req
from kvpool.sglang.cache_req import as_prefix, row_prefix
from kvpool.sglang.glue import (
    GlueBatch,
    GlueReq,
    check_allocated,
    check_committed,
    check_released,
    check_resume,
    count_calls,
    link_counted,
)
from kvpool.sglang.kernels import install_interpreted
from kvpool.sglang.loader import SGLangModules
from kvpool.sglang.req_methods import stop_methods
from kvpool.sglang.scheduler_checker import glue_checks, ships_checker

GLUE_MODULES = {
    "allocation": "sglang.srt.mem_cache.allocation",
    "common": "sglang.srt.mem_cache.common",
}
"""The glue modules whose functions are counted (short name -> module)."""


class SGLangGlueManager(MemoryManager):
    """The lifecycle over SGLang's components with SGLang's glue (module docstring). Built as
    ``SGLangGlueManager(config, modules, allocator=..., req_to_token_pool=..., tree_cache=...)``
    with kvpool's SGLang adapters (or their factories, :mod:`kvpool.injection`)."""

    def __init__(
        self,
        config: PoolConfig,
        modules: SGLangModules,
        *,
        token_to_kv_pool_allocator: Any,
        req_to_token_pool: Any,
        tree_cache: Any,
    ) -> None:
        super().__init__(
            config,
            checked=True,
            token_to_kv_pool_allocator=token_to_kv_pool_allocator,
            req_to_token_pool=req_to_token_pool,
            tree_cache=tree_cache,
        )
        self.glue_calls: list[Counter[str]] = [
            count_calls(modules.module(dotted), short) for short, dotted in GLUE_MODULES.items()
        ]
        """Calls of each glue function so far, per glue module (shared by the process)."""
        link_counted([modules.module(dotted) for dotted in GLUE_MODULES.values()])
        self._stops = stop_methods(modules)
        """SGLang's own ``Req.owned_kv_len`` (a stop inside the last speculative run); None
        for a release without it."""
        if self._stops is not None:
            self.glue_calls.append(self._stops.counts)
        self._allocation = modules.module(GLUE_MODULES["allocation"])
        self._common = modules.module(GLUE_MODULES["common"])
        tree: Any = self.tree_cache
        tree.cache_unfinished_req = self._checkpoint_chunk
        self._spec_glue = False
        self._spec_grown: list[Req] = []
        # SGLang writes a spec step's rows with its Triton kernel: run it through Triton's
        # interpreter on the CPU (as the paged allocator's kernels, kvpool.sglang.kernels)
        install_interpreted(self._allocation, "assign_req_to_token_pool")
        self.scheduler_checks = glue_checks(self, modules) if ships_checker(modules) else None
        """SGLang's own scheduler checks over these components (None: the release has none, or
        they are left out: ``sglang:SOURCE+no-scheduler-checks``)."""
        if self.scheduler_checks is not None:
            self.glue_calls.append(self.scheduler_checks.counts)

    def run_own_checks(self) -> None:
        """SGLang's own scheduler checks ("Mem Leak Detected") on the state now
        (:class:`~kvpool.sglang.scheduler_checker.SchedulerChecks`); nothing for a release
        without them. The lockstep driver calls this at every step, after kvpool's
        invariants."""
        if self.scheduler_checks is not None:
            self.scheduler_checks.run()

    glue_writes_committed = True
    """Whether the release's allocation glue writes each request's committed length (0.5.23's
    ``alloc_for_extend`` and ``alloc_for_decode`` do, 0.5.16's do not): then the length it
    wrote must be the step's (:func:`~kvpool.sglang.glue.check_committed`)."""

    # ----------------------------------------------------------------- stand-ins
    def _glue(self, req: Req) -> GlueReq:
        tree: Any = self.tree_cache
        return GlueReq(req, tree._inserted, tree._tree_lock, getattr(tree, "node_ref", None))

    def _glue_batch(self, reqs: Sequence[Req]) -> GlueBatch:
        pool: Any = self.req_to_token_pool
        tree: Any = self.tree_cache
        return GlueBatch([self._glue(r) for r in reqs], pool.impl, tree.impl)

    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """The prefix match: SGLang's ``match_kv_cache`` (its key capped at ``len - 1``
        tokens, as ``init_next_round_input`` caps it), the prefix read back with the tree's
        ``prefix_device_indices``; kvpool then moves the request's lock to the new node (the
        scheduler's ``req.lock = tree.lock(req.last_node)`` at admission). A streaming
        session's turn matches as kvpool's lifecycle does."""
        if self._restoring_session(req) is not None:
            return super()._match(req, cow, load_back)
        tree: Any = self.tree_cache
        glue = self._glue(req)
        tokens = glue.full_untruncated_fill_ids
        old = req.last_node if req.matched else None
        result = self._common.match_kv_cache(
            glue, tree.impl, tokens, cow_mamba=self._cow_mamba(req, cow),
            max_prefix_len=glue._compute_max_prefix_len(len(tokens)),
        )  # fmt: skip
        self._after_match(req, result, cow)
        last = req.last_node  # SGLang set it (GlueReq: kvpool's UnifiedNodeRef of its NodeId)
        prefix = (
            tree.impl.prefix_device_indices(glue)
            if glue.prefix_len
            else torch.empty((0,), dtype=torch.int64)
        )
        tree.inc_lock_ref(last)
        if old is not None:
            tree.dec_lock_ref(old)
        req.prefix_indices = as_prefix(prefix, req.prefix_indices)
        req.last_node = last
        req.matched = True
        return len(req.prefix_indices)

    def _cow_mamba(self, req: Req, cow: bool) -> bool:
        """``match_kv_cache``'s ``cow_mamba``: whether the match copies a cached Mamba state
        into the request's own slot (a hybrid model's glue, :mod:`kvpool.sglang.glue_mamba`)."""
        return False

    def _after_match(self, req: Req, result: Any, cow: bool) -> None:
        """Called with ``match_kv_cache``'s result before the lock moves (a hybrid model's
        glue finishes a copy-on-write there); nothing here."""

    # ----------------------------------------------------------------- primitives
    def alloc_for_extend(self, reqs: Sequence[Req], seq_lens: Sequence[int]) -> torch.Tensor:
        """kvpool's checks (see the twin's), then SGLang's ``alloc_for_extend``."""
        prefix_lens, seqs = self._check_extend(reqs, seq_lens)
        self._check_capacity(self._tokens_needed(prefix_lens, seqs))
        return self._sglang_extend(self._glue_batch(reqs).for_extend(prefix_lens, seqs), seqs)

    def _sglang_extend(self, batch: GlueBatch, seqs: Sequence[int]) -> torch.Tensor:
        """SGLang's ``alloc_for_extend(batch)``: the new slots (int64), each request's
        committed length then checked against ``seqs`` (:attr:`glue_writes_committed`)."""
        out: torch.Tensor = self._allocation.alloc_for_extend(batch)[0]
        if self.glue_writes_committed:
            check_committed(batch.reqs, seqs, "alloc_for_extend")
        return out.to(torch.int64)

    def alloc_for_decode(self, reqs: Sequence[Req]) -> torch.Tensor:
        """kvpool's checks (see the twin's), then SGLang's ``alloc_for_decode(batch, 1)``,
        which must count each request's committed length one token on
        (:attr:`glue_writes_committed`)."""
        cols, needed = self._check_decode(reqs)
        if not reqs:
            return torch.empty((0,), dtype=torch.int64)
        self._check_capacity(needed)
        rows = [int(r.req_pool_idx) for r in reqs if r.req_pool_idx is not None]
        committed = [r.kv_committed_len + 1 for r in reqs]
        batch = self._glue_batch(reqs).for_decode(rows, cols)
        out = self._allocation.alloc_for_decode(batch, 1)
        if self.glue_writes_committed:
            check_committed(batch.reqs, committed, "alloc_for_decode")
        return torch.as_tensor(out).to(torch.int64)

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> torch.Tensor:
        """EAGLE v2 step: kvpool's checks and commits
        (:func:`kvpool.optimized.lifecycle.spec_decode. spec_step`), with the reserve allocated by
        SGLang's ``alloc_for_spec_decode`` (each request grows to ``ceil_align(committed + 2 *
        reserve)``, rows written by SGLang's ``assign_req_to_token_pool`` kernel). Returns the new
        slots in batch order."""
        self._spec_glue = True
        try:
            return super().spec_step(rids, accepted, reserve)
        finally:
            self._spec_glue = False

    def _alloc_slots(
        self,
        prefix_lens: list[int],
        seq_lens: list[int],
        last_loc: torch.Tensor,
        evict: bool = True,
    ) -> torch.Tensor:
        """Inside :meth:`spec_step`: the grown requests' columns ``[prefix_lens[i],
        seq_lens[i])`` from SGLang's ``alloc_for_spec_decode`` (it evicts, allocates, writes
        the rows and raises ``kv_allocated_len``); elsewhere kvpool's own."""
        if not getattr(self, "_spec_glue", False):
            return super()._alloc_slots(prefix_lens, seq_lens, last_loc, evict)
        reqs = self._spec_grown
        self._check_capacity(self._tokens_needed(prefix_lens, seq_lens))
        batch = self._glue_batch(reqs)
        glue = batch.reqs
        rows = torch.tensor([int(r.req_pool_idx or 0) for r in reqs], dtype=torch.int64)
        cur = torch.tensor(prefix_lens, dtype=torch.int64)
        nxt = torch.tensor(seq_lens, dtype=torch.int64)
        tree: Any = self.tree_cache
        pool: Any = self.req_to_token_pool
        self._allocation.alloc_for_spec_decode(
            tree.impl, pool.impl, reqs=glue, req_pool_indices=rows, cur_kv_lens=cur,
            cur_kv_lens_cpu=cur.clone(), nxt_kv_lens=nxt, nxt_kv_lens_cpu=nxt.clone(),
            num_needed_tokens=int((nxt - cur).sum()), batch=batch,
        )  # fmt: skip
        # kvpool's step sets the allocated lengths next: what SGLang's glue left is checked
        check_allocated(glue, seq_lens, "alloc_for_spec_decode")
        table = pool.impl.req_to_token
        parts = [table[r, p:s] for r, p, s in zip(rows.tolist(), prefix_lens, seq_lens,
                                                   strict=True)]  # fmt: skip
        return torch.cat(parts).to(torch.int64) if parts else self._empty

    def _row_last_locs(self, reqs: Sequence[Req], cols: Sequence[int]) -> torch.Tensor:
        self._spec_grown = list(reqs)  # the requests a spec step grows (see _alloc_slots)
        return super()._row_last_locs(reqs, cols)

    def release_kv_cache(self, req: Req, is_insert: bool = True) -> None:
        """SGLang's ``release_kv_cache(req, tree, checkpoint=is_insert)`` (a finished request
        checkpoints into the tree; an aborted or retracted one does not), checked to have
        marked the record released and dropped the lock handle (:func:`~kvpool.sglang.glue.
        check_released`), then kvpool forgets the request's pool fields.
        InvalidArgumentError (nothing changed) without a row."""
        if req.req_pool_idx is None:
            raise InvalidArgumentError(f"request {req.rid!r} holds no row")
        glue = self._glue(req)
        glue.bind_stops(self._stops)
        tree: Any = self.tree_cache
        if is_insert:
            glue.mark_finished()
            # the scheduler's check on a finished request of a speculative step (a hybrid
            # model's state past a stop cannot be cached)
            if self._stops is not None and not self._stops.mamba_can_cache_finished_req(
                glue, tree.impl
            ):
                glue.skip_insert()
        self._common.release_kv_cache(glue, tree.impl, checkpoint=is_insert)
        check_released(glue, "release_kv_cache")
        tree._inserted.forget(req)
        req.reset_kv_fields()

    def _checkpoint_chunk(self, req: Req, chunked: bool = False, row_read: Any = None) -> None:
        """A chunk boundary: SGLang's ``checkpoint_kv_cache``, whose ``prefix_len`` must be
        ``len(fill_ids)`` (:func:`~kvpool.sglang.glue.check_resume`); kvpool's
        ``prefix_indices`` becomes the row's first ``len(fill_ids)`` slots, as SGLang's next
        extend reads them."""
        tree: Any = self.tree_cache
        glue = self._glue(req)
        self._common.checkpoint_kv_cache(glue, tree.impl)
        check_resume(glue, len(req.fill_ids), "checkpoint_kv_cache")
        assert req.req_pool_idx is not None
        table = tree.impl.req_to_token_pool.req_to_token
        req.prefix_indices = row_prefix(
            table, req.req_pool_idx, len(req.fill_ids), req.prefix_indices
        )


GLUE_STEPS = frozenset(
    {"new_req", "match_prefix", "extend", "decode", "spec_step", "finish", "abort", "retract"}
)
"""Lifecycle steps whose memory work SGLang's scheduler does through its glue (the request's
arrival, its match, prefill chunks, decode, an EAGLE v2 step, finish, abort, retract). The
others are kvpool's own emulation over SGLang's components: EAGLE v1 draft borrowing,
streaming sessions, a direct ``evict``, layer-wise loading, host-tier acknowledgements (which
the host-tier glue makes SGLang's event checks: :mod:`kvpool.sglang.glue_hicache`)."""


def reachability(
    config: PoolConfig,
    ops: Sequence[Any],
    covered: bool = True,
    extra: frozenset[str] = frozenset(),
) -> str:
    """Whether a lifecycle trace (its ops, ``.name`` and ``.expect_error``) is reachable through
    SGLang's scheduler paths: every step is a :data:`GLUE_STEPS` step issued to the glue manager
    (``covered``: the configuration is one the glue drives), none deliberately invalid. One line:
    ``reachable through SGLang's scheduler glue`` or ``direct only: ...`` naming the first step
    that is not. A sub-list of a reachable trace is reachable, so shrinking keeps it so.
    ``extra``: further steps the configuration's glue makes as SGLang's calls."""
    if not covered:
        return "direct only: this configuration runs kvpool's lifecycle over SGLang's components"
    for i, op in enumerate(ops, 1):
        if op.expect_error:
            return f"direct only: step {i} ({op.name}) is a deliberately invalid call"
        if op.name not in GLUE_STEPS and op.name not in extra:
            return f"direct only: step {i} ({op.name}) is kvpool's emulation, not SGLang's glue"
    return "reachable through SGLang's scheduler glue (every step is a call it makes)"


__all__ = ["GLUE_MODULES", "GLUE_STEPS", "SGLangGlueManager", "reachability"]
