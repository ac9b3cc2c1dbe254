"""``MemoryManager`` (optimized twin): the request lifecycle over one set of torch pools.

Mirrors :class:`kvpool.reference.lifecycle.memory_manager.MemoryManager` decision by decision (see
its docstring: capacity first, evict exactly the shortfall, session hand-over, KV tags), with the
same results as tensors: ``extend``/``decode``/``spec_*`` return int64 slot tensors,
``prefix_indices`` are int64 tensors. Work is done per batch where the reference loops per token:
slots come from the allocator's vectorised ``alloc_extend``/``alloc_decode``, radix keys come from
each request's cached token array, and KV tags continue a running hash instead of rehashing the
whole prefix.

As an engine runs it: with ``checked`` off, every step (extend, decode, the speculative steps,
finish, abort, retract, session turns) issues a fixed number of tensor operations per batch,
whatever its size, and reads nothing back from the device. Lengths and rows live on the host (as
SGLang's CPU copies); the table work goes through :mod:`kvpool.optimized.lifecycle.batch_table`
(``get_last_loc``, ``write_req_to_token``, one gather or scatter). The release path too: a
finish (and a prefill batch's chunked requests) reads its rows in one gather and hands each
request's ``cache_finished_req`` / ``cache_unfinished_req`` a view (``row_read``). Per request,
on the host, as in SGLang: the tree's walks (``match_prefix``, ``insert``, ``evict``). The one
device read left is the paged allocator's page de-duplication, once per ``free`` (a finish batch
frees once, in a free group).
tests/optimized/test_sync_free_manager.py counts both.

``device`` places every pool; ``checked`` turns on the pools' misuse checks (see
:mod:`kvpool.optimized.checked`). Units: tokens for lengths, rows, slots.

The host tier mirrors the reference's step by step (:mod:`kvpool.reference.lifecycle.
memory_manager`); prefixes are int64 tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import torch

from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidArgumentError,
    OutOfMemoryError,
    RequestStateError,
    UnknownRequestError,
)
from kvpool.host_checks import as_bool, as_count, as_int, as_opt_str, as_str, stop_list
from kvpool.optimized.hicache.hiradix_cache import HiRadixCache
from kvpool.optimized.lifecycle.pool_snapshot import build_pool_snapshot
from kvpool.optimized.lifecycle.primitives import LifecyclePrimitives, as_token_list
from kvpool.optimized.lifecycle.session import SessionSlot
from kvpool.optimized.lifecycle.spec_decode import spec_draft_v1, spec_step
from kvpool.optimized.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.optimized.req import Req
from kvpool.reference.lifecycle.memory_manager import chunk_size_list
from kvpool.reference.lifecycle.stops import check_hybrid_stops
from kvpool.snapshot import PoolSnapshot


class MemoryManager(LifecyclePrimitives):
    """The request lifecycle (``kvpool.protocols.MemoryManagerProtocol``) over the pools of
    :class:`~kvpool.optimized.lifecycle.primitives.LifecyclePrimitives`; built with
    ``MemoryManager(config, clock=None, options=TwinOptions.make(...))`` (or the user-facing
    shorthand ``device=``, ``checked=``, ``kernel_backend=``: a public edge, which builds the one
    options value and hands it to every component; see :mod:`kvpool.optimized.options`)."""

    # ----------------------------------------------------------------- request API
    def new_req(
        self,
        rid: str,
        input_ids: Sequence[int],
        extra_key: str | None = None,
        session_id: str | None = None,
        priority: int = 0,
    ) -> None:
        """Register a waiting request (a session's next turn when ``session_id`` is given).
        InvalidArgumentError (nothing changed) for an id that is not a ``str`` or is taken, token
        ids that are not vocabulary ids, no token, a non-``str`` key or session, or a
        ``priority`` that is not an int64 integer."""
        rid = as_str("rid", rid)
        extra_key = as_opt_str("extra_key", extra_key)
        session_id = as_opt_str("session_id", session_id)
        priority = as_int("priority", priority)
        if rid in self.reqs:
            raise InvalidArgumentError(f"request {rid!r} already exists")
        input_tokens = as_token_list(input_ids)
        if len(input_tokens) == 0:
            raise InvalidArgumentError("a request needs at least one input token")
        history: list[int] = []
        session = None
        if session_id is not None:
            session = self.sessions.get(session_id)
            if session is None:
                raise UnknownRequestError(f"unknown session {session_id!r}")
            if session.busy_with is not None:
                raise RequestStateError(f"session {session_id!r} is busy with {session.busy_with}")
            if session.has_namespace:
                if extra_key is not None and extra_key != session.extra_key:
                    raise InvalidArgumentError(
                        f"session {session_id!r} lives in namespace {session.extra_key!r}"
                    )
                extra_key = session.extra_key
            history = list(session.tokens)
        tokens = history + input_tokens
        if len(tokens) > self.config.max_context_len:
            raise ContextOverflowError(
                f"{len(tokens)} tokens past max_context_len={self.config.max_context_len}"
            )
        self.reqs[rid] = Req(rid, tokens, extra_key, session_id, priority)
        if session is not None:
            session.busy_with = rid

    def match_prefix(self, rid: str) -> int:
        """Match a waiting request's tokens (capped at ``len - 1``), lock the last matched node
        (dropping the lock it held) and remember the prefix; returns its length in tokens. With
        the host tier this is the admission: a prefix found in host memory is loaded back; with the
        Mamba radix cache the matched state is copied into a slot of the request's own."""
        return self._match(self.get_req(rid, "waiting"), cow=True, load_back=True)

    def _match(self, req: Req, cow: bool, load_back: bool) -> int:
        """:meth:`match_prefix`; ``extend``'s own match (``cow`` and ``load_back`` False) moves
        nothing from host memory and copies no state, so that a refused batch leaves the state
        as it was (the copy-on-write follows admission: ``stage_cow``)."""
        session = self._restoring_session(req)
        if session is not None:
            req.matched = True
            return session.kv_committed_len
        key = RadixKey.from_array(req.token_array(req.seq_len() - 1), req.extra_key)
        hooks = self.mamba_hooks
        # Any: a match result of this manager's tree cache (an injected candidate's too), read
        # by field name (the host fields only when the tree loads back)
        result: Any
        if cow and hooks is not None and hooks.tree is not None:
            result = hooks.match(key, req)
        else:
            result = self.tree_cache.match_prefix(key)
        prefix, last = self._admit_prefix(result, load_back)  # a host hit is loaded back
        self.tree_cache.inc_lock_ref(last)
        if req.matched:
            self.tree_cache.dec_lock_ref(req.last_node)
        req.prefix_indices = prefix
        req.last_node = last
        req.matched = True
        return req._prefix_len()

    def _unmatch(self, req: Req) -> None:
        if self.mamba_hooks is not None:
            self.mamba_hooks.release_waiting(req)
        self.tree_cache.dec_lock_ref(req.last_node)
        req.prefix_indices = self._empty
        req.last_node = None
        req.matched = False

    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> torch.Tensor:
        """One prefill batch (see the protocol). Returns the new slots in batch order."""
        reqs = self._batch(rids, "waiting", "running")
        # a float or a bool would pass the comparisons below and fail inside the batch's
        # writes, after its rows, slots and locks were taken
        sizes = chunk_size_list(chunk_sizes, len(reqs))
        bad = [r.rid for r in reqs if r.state == "running" and not r.is_chunked]
        if bad:
            raise RequestStateError(f"requests {bad} are running and not chunked")
        restoring = [self._restoring_session(r) for r in reqs]
        fresh = sum(
            1 for r, s in zip(reqs, restoring, strict=True) if r.state == "waiting" and s is None
        )
        if fresh > self.req_to_token_pool.available_size():
            raise OutOfMemoryError(f"need {fresh} rows; {self.req_to_token_pool.available_size()}")
        matched_here = [
            r
            for r, s in zip(reqs, restoring, strict=True)
            if r.state == "waiting" and s is None and not r.matched
        ]
        for req in matched_here:
            self._match(req, cow=False, load_back=False)  # copy-on-write once admitted
        try:
            prefix_lens = [
                s.kv_committed_len
                if s is not None
                else (r.kv_committed_len if r.state == "running" else r._prefix_len())
                for r, s in zip(reqs, restoring, strict=True)
            ]
            seq_lens = [
                p + min(r.seq_len() - p, r.seq_len() if c is None else c)
                for r, p, c in zip(reqs, prefix_lens, sizes, strict=True)
            ]
            self._check_capacity(self._tokens_needed(prefix_lens, seq_lens))
            if self.mamba_hooks is not None:  # before a session's restore changes anything
                fresh_reqs = [r for r, s in zip(reqs, restoring, strict=True) if s is None]
                chunks = sum(1 for r, s in zip(reqs, seq_lens, strict=True) if s < r.seq_len())
                self.mamba_hooks.check_admission(fresh_reqs, chunks)
        except OutOfMemoryError:
            for req in reversed(matched_here):
                self._unmatch(req)
            raise
        if self.mamba_hooks is not None:
            self.mamba_hooks.stage_cow([r for r in reqs if r.state == "waiting"])
            self.mamba_hooks.reclaim_before_alloc(reqs)  # 0.5.23: states before the KV
        held = [s for s in restoring if s is not None]
        # no session to restore (most batches): no read to make
        reads = iter(
            SessionSlot.read_rows(held, self.req_to_token_pool, self.device) if held else ()
        )
        for req, session in zip(reqs, restoring, strict=True):
            if session is not None:
                session.restore_into(req, self.req_to_token_pool, row_read=next(reads))
            elif req.state == "waiting":
                req.cache_protected_len = req._prefix_len()
        out = self.alloc_for_extend(reqs, seq_lens)
        self._wait_for_loads()
        self._write_kv_batch(reqs, prefix_lens, seq_lens, out)  # the new slots, in batch order
        chunk_rows = self._read_rows(
            [r for r, s in zip(reqs, seq_lens, strict=True) if s < r.seq_len()]
        )
        for req, s in zip(reqs, seq_lens, strict=True):
            req.state = "running"
            req.matched = False
            req.fill_ids = req.all_token_ids[:s]
            req.kv_committed_len = s
            if s < req.seq_len():
                req.is_chunked = 1
                self.tree_cache.cache_unfinished_req(req, True, row_read=chunk_rows[req.rid][:s])
            else:
                req.is_chunked = 0
        self._flush_backups()  # the unified host tier issues the batch's writes
        return out

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> torch.Tensor:
        """Append ``token_ids[i]`` to request ``i`` and compute its KV; one new slot each unless
        the allocation already covers the column. Returns each new token's slot (batch order)."""
        reqs = self._running_full(rids)
        tokens = as_token_list(token_ids, "token_ids")  # before anything changes
        if len(tokens) != len(reqs):
            raise InvalidArgumentError(f"{len(tokens)} tokens for {len(reqs)} requests")
        over = [r.rid for r in reqs if r.kv_committed_len + 1 > self.config.max_context_len]
        if over:
            raise ContextOverflowError(f"requests {over} would pass max_context_len")
        self.alloc_for_decode([r for r in reqs if r.kv_allocated_len == r.kv_committed_len])
        if not reqs:
            return self._empty
        cols = [r.kv_committed_len for r in reqs]
        for req, tok in zip(reqs, tokens, strict=True):
            req.output_ids.append(tok)
        slots = self._write_kv_batch(reqs, cols, [c + 1 for c in cols])
        for req, col in zip(reqs, cols, strict=True):
            req.kv_committed_len = col + 1
        return slots

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> torch.Tensor:
        """EAGLE v2 step (see :func:`kvpool.optimized.lifecycle.spec_decode.spec_step`)."""
        return spec_step(self, rids, accepted, reserve)

    def spec_draft_v1(self, rids: Sequence[str], num_draft: int) -> torch.Tensor:
        """EAGLE v1 draft borrow (see
        :func:`kvpool.optimized.lifecycle.spec_decode.spec_draft_v1`)."""
        return spec_draft_v1(self, rids, num_draft)

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        """Release a batch inside one free group (a session turn hands over to its session);
        ``finished_lens`` as the reference's (a stop before the last committed token)."""
        reqs = self._running_full(rids)
        is_insert = as_bool("is_insert", is_insert)
        stops = stop_list("finished_lens", finished_lens, [len(r.output_ids) for r in reqs])
        self._check_stops(reqs, stops)
        for req, stop in zip(reqs, stops, strict=True):
            req.finished_len = stop
        alloc = self.token_to_kv_pool_allocator
        alloc.free_group_begin()
        try:
            self._read_held_rows([r for r in reqs if self._session_of(r) is None])
            for req in reqs:
                session = self._session_of(req)
                if session is not None:
                    req.kv_committed_len = self._owned_len(req)
                    session.take_from(
                        req,
                        self.req_to_token_pool,
                        alloc,
                        self.page_size,
                        segments=self.config.rules.release_path == "checkpoint",
                    )
                else:
                    self.release_kv_cache(req, is_insert)
        finally:
            self._rows_read = {}
            alloc.free_group_end()
        for req in reqs:
            req.state = "finished"
            del self.reqs[req.rid]
        self._flush_backups()

    def _check_stops(self, reqs: Sequence[Req], stops: Sequence[int | None]) -> None:
        """A hybrid (Mamba) model's session turns may not stop early (:func:`check_hybrid_stops`);
        the SWA managers check their own rule."""
        if self.mamba_hooks is not None:
            check_hybrid_stops(reqs, stops, lambda r: self._session_of(r) is not None)

    def _session_of(self, req: Req) -> SessionSlot | None:
        session = self.sessions.get(req.session_id) if req.session_id else None
        return session if session is not None and session.busy_with == req.rid else None

    def abort(self, rid: str) -> None:
        """Drop a waiting (maybe locked) or running request, freeing everything, no insert."""
        req = self.get_req(rid, "waiting", "running")
        session = self._session_of(req)
        if req.state == "running":
            self.release_kv_cache(req, is_insert=False)
        elif req.matched:
            self._unmatch(req)
        if session is not None:
            session.busy_with = None
        req.state = "aborted"
        del self.reqs[rid]

    def retract(self, rid: str) -> None:
        """Running -> waiting: release without insert; its tokens so far become its prompt."""
        req = self.get_req(rid, "running")
        self.release_kv_cache(req, is_insert=False)
        req.origin_input_ids = req.all_token_ids
        req.output_ids = []
        req.state = "waiting"

    def open_session(self, session_id: str) -> None:
        """Create an empty session slot (of a hybrid model too: between turns it keeps the last
        turn's Mamba slot and track buffers with its row)."""
        session_id = as_str("session_id", session_id)
        if session_id in self.sessions:
            raise InvalidArgumentError(f"session {session_id!r} already exists")
        if self.mamba_hooks is not None and self.mamba_hooks.tree is not None:
            raise ConfigError("sessions are not modelled with the Mamba radix cache")
        self.sessions[session_id] = SessionSlot(session_id)

    def close_session(self, session_id: str) -> None:
        """Drop the session's lock, free ``[cache_protected_len, allocated)`` and its row."""
        session = self.sessions.get(as_str("session_id", session_id))
        if session is None:
            raise UnknownRequestError(f"unknown session {session_id!r}")
        if session.busy_with is not None:
            raise RequestStateError(f"session {session_id!r} is busy with {session.busy_with}")
        if session.holds_kv():
            self.tree_cache.dec_lock_ref(session.last_node)
            session.close(
                self.req_to_token_pool,
                self.token_to_kv_pool_allocator,
                segments=self.config.rules.release_path == "checkpoint",
            )
        del self.sessions[session_id]

    def evict(self, num_tokens: int) -> int:
        """Evict ``num_tokens`` (>= 0) from the tree; returns the tokens actually freed.
        InvalidArgumentError (nothing changed) for a count that is not an int64 integer >= 0."""
        num_tokens = as_count("num_tokens", num_tokens)
        freed = self.tree_cache.evict(num_tokens)
        return freed[0] if isinstance(freed, tuple) else freed

    def snapshot(self) -> PoolSnapshot:
        """The whole state (see
        :func:`kvpool.optimized.lifecycle.pool_snapshot.build_pool_snapshot`)."""
        return build_pool_snapshot(self)

    # ----------------------------------------------------------------- host tier
    def hiradix(self) -> HiRadixCache | None:
        """The tree cache when it has a host tier (it loads back), else None."""
        tree = self.tree_cache
        # any tree cache that loads back is one (an injected candidate's too), as before
        return cast("HiRadixCache", tree) if hasattr(tree, "init_load_back") else None

    def _admit_prefix(
        self, result: MatchResult, load_back: bool = True
    ) -> tuple[torch.Tensor, TreeNode | None]:
        """The prefix a request takes from ``result``: its device slots, and its last node; when
        the match ends in host memory (and ``load_back``), the restored slots too and the
        restored node."""
        prefix, last = result.device_indices, result.last_device_node
        tree = self.hiradix()
        if tree is None or not load_back:  # other trees' results have no host fields
            return prefix, last
        host_node = result.last_host_node
        if not result.host_hit_length or host_node is None:
            return prefix, last
        loaded, node = tree.init_load_back(host_node)
        return torch.cat([prefix, loaded]), node

    def _wait_for_loads(self) -> None:
        """The forward: issue the queued loads and wait for the content of every load in flight
        (the acknowledgements stay queued)."""
        tree = self.hiradix()
        if tree is None:
            return
        tree.ready_to_load_host_cache()
        cc = tree.cache_controller
        for ack in cc.ack_load_queue:
            cc.complete(ack)

    def _flush_backups(self) -> None:
        """The end of a batch under the unified host tier: issue the queued writes as one
        transfer (SGLang 0.5.23's ``flush_pending_backups``); nothing otherwise."""
        tree = self.hiradix()
        if tree is not None and tree.unified:
            tree.cache_controller.start_writing()

    def _host_tier(self, num_acks: int) -> HiRadixCache:
        as_count("num_acks", num_acks)
        tree = self.hiradix()
        if tree is None:
            raise InvalidArgumentError("this memory manager has no host tier")
        return tree

    def hicache_ack_writes(self, num_acks: int) -> int:
        """The first ``num_acks`` write acknowledgements arrive (``writing_check``): each write's
        node is unlocked and its host copy complete. Returns how many arrived.
        InvalidArgumentError (nothing changed) without a host tier or for ``num_acks < 0``."""
        return int(self._host_tier(num_acks).writing_check(num_acks))

    def hicache_ack_loads(self, num_acks: int) -> int:
        """The queued loads are issued, then the first ``num_acks`` load acknowledgements arrive
        (``loading_check``): content copied, restored nodes unlocked. Returns how many arrived.
        InvalidArgumentError (nothing changed) without a host tier or for ``num_acks < 0``."""
        tree = self._host_tier(num_acks)
        tree.ready_to_load_host_cache()
        return int(tree.loading_check(num_acks))


__all__ = ["MemoryManager"]
