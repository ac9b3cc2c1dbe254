"""``MemoryManager``: the request lifecycle over one set of reference pools.

Implements :class:`kvpool.protocols.MemoryManagerProtocol` (the request-level API the lockstep
harness drives) on top of SGLang-named primitives: :meth:`~MemoryManager.alloc_req_slots`,
:meth:`~MemoryManager.alloc_for_extend`, :meth:`~MemoryManager.alloc_for_decode`,
:meth:`~MemoryManager.release_kv_cache`. Units: tokens for lengths, rows, slots.

Decisions (both twins follow them):

- Every token's KV is computed when it is appended: ``extend`` computes positions
  ``[prefix, seq)``, ``decode`` the token it appends, ``spec_step`` the accepted tokens. So a
  running, fully prefilled request has ``kv_committed_len == len(all tokens)``.
- Capacity first: rows are checked before anything; then tokens (``available + evictable >=
  needed``), else OutOfMemoryError with the locks this call took released. Then evict exactly
  ``needed - available`` (may free more). ``needed`` is new tokens (page size 1) or
  ``new pages * page_size``.
- Waiting requests keep ``cache_protected_len == 0`` and hold no slots; ``match_prefix`` locks
  the matched node and remembers ``prefix_indices``; ``extend`` sets ``cache_protected_len``.
  (With the Mamba radix cache, a waiting request matched to a cached state holds one Mamba slot:
  its copy of that state; see :mod:`kvpool.reference.lifecycle.mamba_hooks`.)
- Requests leave the table when finished or aborted. A session turn's ``match_prefix`` returns the
  session's committed length without touching the tree (the lock comes with the restore).
- A session turn's ``finish`` hands everything to the session (``is_insert`` is ignored) but
  its over-allocation, freed at the hand-over (both SGLang releases' ``_trim_overshoot``).
- A stop inside a speculative run (``finish``'s ``finished_lens``): a session turn hands its
  session only the tokens through the stop (the overshoot's slots are freed with the
  over-allocation); a plain release keeps what ``Rules.release_upto`` says
  (:meth:`~kvpool.reference.lifecycle.primitives.LifecyclePrimitives.release_kv_cache`).
- ``decode`` returns, per request, the slot of its new token (pre-allocated or new).
- With the host tier (``config.enable_hierarchical_cache``) ``match_prefix`` loads back a prefix
  found in host memory and ``extend`` waits for the loads' content; acknowledgements are the
  operations ``hicache_ack_writes`` / ``hicache_ack_loads`` (below).

The host tier (``PoolConfig.enable_hierarchical_cache``): the tree cache is a
:class:`~kvpool.reference.hicache.hiradix_cache.HiRadixCache` whose host pool backs the manager's
own KV buffers (units: tokens, device slots, host slots). The steps, as SGLang 0.5.16's scheduler
takes them:

- **Admission** (``match_prefix``; not the match ``extend`` makes for an unmatched request, so
  that a refused batch changes nothing): the match reports the tokens found in host memory;
  when they end the match, ``init_load_back`` restores them into new device slots
  (evicting once if needed; below ``hicache_load_back_threshold`` nothing moves). The restored
  path joins the request's prefix and its deepest node becomes the request's locked node; the
  load itself keeps that node locked until its acknowledgement.
- **The forward** (``extend``): the queued loads are issued as one transfer
  (``ready_to_load_host_cache``) and the batch waits for their content (SGLang's layer-wise
  wait): the KV is in the device slots before the batch reads it. The acknowledgement, which
  unlocks, still comes later.
- **Finish** inserts as the radix cache does; a write-through insert writes the hit nodes to
  host (locked until the write's acknowledgement); **eviction** keeps backed-up nodes as
  host-only nodes (write-back writes them first).
- **Issuing writes** (``Rules.hicache_host_tier == "unified"``, SGLang 0.5.23): write-through
  backups are queued where an insert starts them; the scheduler issues the queue as one
  transfer after each batch (``flush_pending_backups`` after ``process_batch_result``), so
  ``extend`` and ``finish`` end by issuing what they queued (:meth:`MemoryManager.
  _flush_backups`). Under 0.5.16's rules each write is issued when it is made.
- **Acknowledgements** are lifecycle operations: :meth:`MemoryManager.hicache_ack_writes`
  and :meth:`MemoryManager.hicache_ack_loads` deliver the first ``k`` (SGLang's
  ``check_hicache_events``: ``writing_check`` then ``loading_check``).
- **Abort / retract** release the request's own lock and slots only: restored nodes belong to
  the tree, and a load or write in flight keeps its own lock until its acknowledgement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

from kvpool.errors import (
    ConfigError,
    ContextOverflowError,
    InvalidArgumentError,
    OutOfMemoryError,
    RequestStateError,
    UnknownRequestError,
)
from kvpool.host_checks import (
    as_bool,
    as_count,
    as_int,
    as_opt_str,
    as_str,
    stop_list,
    token_list,
)
from kvpool.reference.hicache.hiradix_cache import HiRadixCache
from kvpool.reference.lifecycle.pool_snapshot import build_pool_snapshot
from kvpool.reference.lifecycle.primitives import LifecyclePrimitives
from kvpool.reference.lifecycle.session import SessionSlot
from kvpool.reference.lifecycle.spec_decode import spec_draft_v1, spec_step
from kvpool.reference.lifecycle.stops import check_hybrid_stops
from kvpool.reference.radix_key import MatchResult, RadixKey, TreeNode
from kvpool.reference.req import Req
from kvpool.snapshot import PoolSnapshot


def chunk_size_list(chunk_sizes: object, batch: int) -> list[int | None]:
    """``extend``'s ``chunk_sizes`` (tokens): ``None`` (every request whole), or one entry per
    request of the ``batch``, each ``None`` or an int64 integer ``>= 1``; InvalidArgumentError
    naming the value otherwise (a float, a bool, a string, a count that does not match)."""
    if chunk_sizes is None:
        return [None] * batch
    if isinstance(chunk_sizes, str | bytes) or not isinstance(chunk_sizes, Iterable):
        raise InvalidArgumentError(f"chunk_sizes must be a sequence or None, got {chunk_sizes!r}")
    sizes = [None if c is None else as_int("chunk_sizes item", c) for c in chunk_sizes]
    if len(sizes) != batch:
        raise InvalidArgumentError(f"{len(sizes)} chunk sizes for {batch} requests")
    if any(c is not None and c < 1 for c in sizes):
        raise InvalidArgumentError(f"chunk sizes must be >= 1, got {sizes}")
    return sizes


class MemoryManager(LifecyclePrimitives):
    """The request lifecycle (``kvpool.protocols.MemoryManagerProtocol``) over the pools of
    :class:`~kvpool.reference.lifecycle.primitives.LifecyclePrimitives`; built with
    ``MemoryManager(config, clock=None)``. See the module docstring."""

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
        input_tokens = token_list("input_ids", input_ids)
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
        tokens = req.all_token_ids
        key = RadixKey(tokens[: len(tokens) - 1], req.extra_key)
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
        return len(req.prefix_indices)

    def _unmatch(self, req: Req) -> None:
        if self.mamba_hooks is not None:
            self.mamba_hooks.release_waiting(req)
        self.tree_cache.dec_lock_ref(req.last_node)
        req.prefix_indices = []
        req.last_node = None
        req.matched = False

    def extend(
        self, rids: Sequence[str], chunk_sizes: Sequence[int | None] | None = None
    ) -> list[int]:
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
                else (r.kv_committed_len if r.state == "running" else len(r.prefix_indices))
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
        for req, session in zip(reqs, restoring, strict=True):
            if session is not None:
                session.restore_into(req, self.req_to_token_pool)
            elif req.state == "waiting":
                req.cache_protected_len = len(req.prefix_indices)
        out = self.alloc_for_extend(reqs, seq_lens)
        self._wait_for_loads()
        for req, p, s in zip(reqs, prefix_lens, seq_lens, strict=True):
            self.write_kv(req, p, s)
            req.state = "running"
            req.matched = False
            req.fill_ids = req.all_token_ids[:s]
            req.kv_committed_len = s
            if s < req.seq_len():
                req.is_chunked = 1
                self.tree_cache.cache_unfinished_req(req, chunked=True)
            else:
                req.is_chunked = 0
        self._flush_backups()  # the unified host tier issues the batch's writes
        return out

    def decode(self, rids: Sequence[str], token_ids: Sequence[int]) -> list[int]:
        """Append ``token_ids[i]`` to request ``i`` and compute its KV; one new slot each unless
        the allocation already covers the column. Returns each new token's slot (batch order)."""
        reqs = self._running_full(rids)
        tokens = token_list("token_ids", token_ids)  # before anything changes
        if len(tokens) != len(reqs):
            raise InvalidArgumentError(f"{len(tokens)} tokens for {len(reqs)} requests")
        over = [r.rid for r in reqs if r.kv_committed_len + 1 > self.config.max_context_len]
        if over:
            raise ContextOverflowError(f"requests {over} would pass max_context_len")
        self.alloc_for_decode([r for r in reqs if r.kv_allocated_len == r.kv_committed_len])
        slots: list[int] = []
        for req, tok in zip(reqs, tokens, strict=True):
            col = req.kv_committed_len
            req.output_ids.append(tok)
            self.write_kv(req, col, col + 1)
            req.kv_committed_len = col + 1
            assert req.req_pool_idx is not None
            slots.append(self.req_to_token_pool.read(req.req_pool_idx, col, col + 1)[0])
        return slots

    def spec_step(
        self, rids: Sequence[str], accepted: Sequence[Sequence[int]], reserve: int
    ) -> list[int]:
        """EAGLE v2 step (see :func:`kvpool.reference.lifecycle.spec_decode.spec_step`)."""
        return spec_step(self, rids, accepted, reserve)

    def spec_draft_v1(self, rids: Sequence[str], num_draft: int) -> list[int]:
        """EAGLE v1 draft borrow (see
        :func:`kvpool.reference.lifecycle.spec_decode.spec_draft_v1`)."""
        return spec_draft_v1(self, rids, num_draft)

    def finish(
        self,
        rids: Sequence[str],
        is_insert: bool = True,
        finished_lens: Sequence[int | None] | None = None,
    ) -> None:
        """Release a batch inside one free group (a session turn hands over to its session).
        ``finished_lens`` (None, or one entry per request): each request's ``finished_len``,
        the output tokens through its stop (None: all of them; at most ``len(output_ids)``,
        InvalidArgumentError otherwise). A session turn hands over only the tokens through the
        stop; a plain release keeps what ``Rules.release_upto`` says. ConfigError, before any
        change, for a stop that is not modelled (a hybrid (Mamba) model's session turn; with a
        sliding window, a stop a whole window back)."""
        reqs = self._running_full(rids)
        is_insert = as_bool("is_insert", is_insert)
        stops = stop_list("finished_lens", finished_lens, [len(r.output_ids) for r in reqs])
        self._check_stops(reqs, stops)
        for req, stop in zip(reqs, stops, strict=True):
            req.finished_len = stop
        alloc = self.token_to_kv_pool_allocator
        alloc.free_group_begin()
        try:
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
        :func:`kvpool.reference.lifecycle.pool_snapshot.build_pool_snapshot`)."""
        return build_pool_snapshot(self)

    # ----------------------------------------------------------------- host tier
    def hiradix(self) -> HiRadixCache | None:
        """The tree cache when it has a host tier (it loads back), else None."""
        tree = self.tree_cache
        # any tree cache that loads back is one (an injected candidate's too), as before
        return cast("HiRadixCache", tree) if hasattr(tree, "init_load_back") else None

    def _admit_prefix(
        self, result: MatchResult, load_back: bool = True
    ) -> tuple[list[int], TreeNode | None]:
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
        return prefix + list(loaded), node

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
